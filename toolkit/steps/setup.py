"""What a build or a check resolves before its first step: the project (builds only), the profile checked
against the registries (its target, options and precision), the target with its validated options, the
device spec, whether this host's timings are emulated, and where the output goes. Steps take this set-up
instead of long parameter lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from tapeout import targets
from tapeout.builds.reader import BuildDir
from tapeout.core import workload as workloads
from tapeout.core.capabilities import Capabilities
from tapeout.core.config import (
    budgets_set_by_the_user,
    find_profile,
    load_device,
    load_project,
    resolve_extends,
    validate,
)
from tapeout.core.console import UI
from tapeout.core.errors import BadInput, TargetUnavailable
from tapeout.core.inputs import check_project_files
from tapeout.core.profile_schema import Profile
from tapeout.core.schemas import DeviceSpec, Project
from tapeout.quantize import methods
from tapeout.targets.base import Probe, Target


@dataclass
class Setup:
    """What a build or a check resolved before its first step; steps read it, never change it."""

    profile: Profile
    target: Target
    probe: Probe  # taken once: for a GPU target it creates a CUDA session
    ui: UI
    project: Project | None = None  # None on the device: `check` has the build dir, not the project
    device: DeviceSpec | None = None  # the profile's device spec, if it names one
    deferred: str | None = None  # a device-compiled target whose toolchain is not here: why not
    budgets_from_project: tuple[str, ...] = ()  # budgets whose value is the project file's
    emulated: str | None = field(init=False)

    def __post_init__(self) -> None:
        self.emulated = self.target.emulated()
        if self.deferred and not self.emulated:
            # Everything but the engine is built here; the ONNX it will be compiled from runs on ORT's CPU EP
            # for parity and the metric, and no figure of this host is judged against the device's budgets.
            self.emulated = (
                f"no {self.target.name} engine on this host ({self.deferred}): it is compiled on the "
                "device at the first `tapeout check`; here the prepared ONNX ran on ONNX Runtime's CPU EP"
            )

    @property
    def capabilities(self) -> Capabilities:
        return self.target.capabilities


def for_build(project_dir: Path | str, profile_name: str, ui: UI) -> Setup:
    """Load and validate everything a build needs, and stop early (exit 4) if the target cannot run here."""
    project = load_project(project_dir)
    profile, from_project = with_project_budgets(
        load_profile(profile_name).for_workload(project.workload.kind), project
    )
    options = dict(profile.options)
    if (
        profile.pruning is not None
        and "2:4" in profile.pruning.what
        and "sparse_weights" not in options
        and "sparse_weights" in targets.options_model(profile.target).model_fields
    ):
        options["sparse_weights"] = True  # 2:4 weights are only worth their accuracy where sparse kernels run them
    target = targets.create(profile.target, options)
    device = load_device(profile.device) if profile.device else None
    if device is not None and profile.precision in ("fp8",) and profile.precision not in device.peak_dense_tops:
        raise BadInput(
            f"profile {profile.name} asks for {profile.precision}, and device spec {device.name} lists no "
            f"{profile.precision} peak: its GPU has no {profile.precision.upper()} tensor cores "
            "(FP8 needs NVIDIA Ada or Hopper and newer)",
            fix='use precision = "int8" or "fp16" for this device',
        )
    workload = workloads.of(project)
    kind = workload.kind
    if not workload.runs_on(target.capabilities):
        able = [name for name, entry in targets.TARGETS.items() if workload.runs_on(entry.capabilities)]
        why = target.capabilities.workloads_not.get(kind)
        raise BadInput(
            f"target '{profile.target}' (profile {profile.name}) cannot run a {kind} workload: "
            + (f"{why}; it runs " if why else "it runs ")
            + ", ".join(target.capabilities.workloads),
            fix=f"build {project.file.name}'s {kind} workload "
            f'for a profile whose target runs it ({", ".join(able)}), or set [workload] kind = "forward"',
        )
    workload.check_profile(project, profile, target)
    check_project_files(project)
    here = targets.readiness(target)
    deferred = None
    if not here.ready:
        if target.capabilities.compile_on != "device":
            here.require()
        # the host-side part still builds here; `check` on the device compiles the engine
        deferred = here.probe.reason if not here.probe.available else here.problem.problem
        if target.capabilities.compiles_from == "torch.export" and profile.precision != "fp32":
            # a lower-precision program is scored by compiling each candidate, which needs the device; there is
            # no ONNX twin of a cast program to stand in for it here
            raise TargetUnavailable(
                f"profile {profile.name} builds {profile.precision} for '{profile.target}', "
                f"whose candidates are compiled and scored on the device, and it is not here "
                f"({deferred})",
                fix=f"build {profile.name} on the device (or a host of its "
                "class), or build the fp32 profile here: the device compiles it at the first check",
            )
    return Setup(
        profile,
        target,
        here.probe,
        ui,
        project=project,
        device=device,
        deferred=deferred,
        budgets_from_project=from_project,
    )


def with_project_budgets(profile: Profile, project: Project) -> tuple[Profile, tuple[str, ...]]:
    """The profile with the project's [budgets] merged in, and the names whose value is the project's. A budget
    both set is the project's where the profile's is a shipped default, and the profile's where a profile file of
    the user's own set it. The merged profile is validated again: a p99 budget from the project needs as many
    samples as one from the profile."""
    ours = profile.budgets.model_dump(exclude_none=True)
    taken = {
        k: v
        for k, v in project.budgets.model_dump(exclude_none=True).items()
        if k not in profile._user_budgets and ours.get(k) != v
    }
    if not taken:
        return profile, ()
    try:
        merged = Profile.model_validate({**profile.model_dump(), "budgets": {**ours, **taken}})
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise BadInput(
            f"{project.file}: [budgets] with profile {profile.name}: {problem}",
            fix="raise check.iterations or check.repeats in the profile, or leave that budget out",
        ) from None
    merged._user_budgets = profile._user_budgets
    return merged, tuple(sorted(taken))


def for_check(build: BuildDir, ui: UI) -> Setup:
    """What a check on this device resolves from the build dir it opened: the profile as the build resolved it, its
    target (exit 4 if it cannot run here) and device spec."""
    name = build.manifest.artifact.target
    if name not in targets.TARGETS:
        raise BadInput(
            f"{build.directory} was built for target '{name}', which this tapeout does not know",
            fix=f"check it with a tapeout that has that backend, or rebuild for one of: {', '.join(targets.TARGETS)}",
        )
    profile = build.profile
    target = targets.create(name, profile.options)
    here = targets.readiness(target)
    here.require()
    return Setup(profile, target, here.probe, ui, device=build.device_spec)


def load_profile(name: str) -> Profile:
    """Find, merge (`extends`) and validate a profile; the target's own options are validated too."""
    path = find_profile(name)
    data = resolve_extends(path)
    data.setdefault("name", path.name[:-5] if path.name.endswith(".toml") else path.name)
    if isinstance(data.get("target"), str) and data["target"] not in targets.TARGETS:
        raise BadInput(
            f"{path}: field 'target': unknown target {data['target']!r}",
            fix=f"use one of: {', '.join(targets.TARGETS)}",
        )
    profile = validate(Profile, data, path)
    profile._user_budgets = budgets_set_by_the_user(path)
    precisions = targets.TARGETS[profile.target].capabilities.precisions
    if profile.precision not in precisions:
        raise BadInput(
            f"{path}: field 'precision': target '{profile.target}' does not take {profile.precision!r}",
            fix=f"use one of: {', '.join(precisions)}",
        )
    method = profile.quantization.method
    if method != "auto" and method not in methods.names():
        raise BadInput(
            f"{path}: field 'quantization.method': unknown quantization method {method!r}",
            fix=f"use one of: auto, {', '.join(methods.names())}",
        )
    options_model = targets.options_model(profile.target)
    validate(options_model, profile.options, path, prefix="options.")
    if profile.device is not None:
        load_device(profile.device, origin=path)
    return profile
