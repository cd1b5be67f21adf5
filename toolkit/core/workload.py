"""The workload contract: what a build measures besides one call, as one object per `[workload] kind`.

A workload is one module and one registry entry. Its object (a `Workload` subclass instance) owns everything that
differs between kinds: its settings schema, the checks on the project and the profile, how the model is loaded and
exported for it, its golden inputs, the data it records in the build dir, the loop a measuring process runs, its
budgets and their judging, its report section, and what `check` replays. The steps, the reader, the schemas and
the targets ask the workload; none of them tests the kind. A target lists the kinds it runs in its capabilities
and offers what a loop needs (`Session.run`, `Session.decoder`, `Session.carrier`) through the target contract.

Built-in kinds are named here by module; another package adds one through the entry-point group
`tapeout.workloads` (an entry naming a `Workload` instance), so adding a workload edits nothing of tapeout. The
modules are imported only when a kind is asked for: the core stays light.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tapeout.core.errors import BadInput

if TYPE_CHECKING:  # annotations only: the workloads import what they run, the core imports none of it
    from tapeout.core.capabilities import Capabilities
    from tapeout.core.profile_schema import CheckSettings, Profile
    from tapeout.core.schemas import Budgets, InputSpec, Project, WorkloadSettings
    from tapeout.core.verdict import BudgetResult

GROUP = "tapeout.workloads"
BUILT_IN = {
    "forward": "tapeout.workloads.forward",
    "generate": "tapeout.workloads.generate",
    "stream": "tapeout.workloads.stream",
    "transcribe": "tapeout.workloads.transcribe",
}
DEFAULT = "forward"  # a project without [workload], a build dir that records none
WORKLOAD_FILE = "workload.npz"  # what a loop's record step writes into the build dir, whatever the kind


@dataclass(frozen=True)
class Companion:
    """A graph the loop runs beside the build's main one (a speech model's encoder): exported with it, quantized by
    the first plan of the same precision and compiled by the same target into the artifact's folder `name`."""

    name: str
    path: Path  # the FP32 ONNX model
    inputs: list[InputSpec]
    dims: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchMetric:
    """An accuracy the workload measures itself, which the sensitivity loop judges candidates by where the project
    has no [evaluation] metric (a speech model's greedy agreement through its loop). `evaluate` takes one candidate's
    `predict` (a call of the main graph) and returns the figure; `judge` gives the figure's shortfall in the budget's
    units and whether the budget holds, as the build's verdict will."""

    name: str
    evaluate: Callable[[Callable[[dict], dict]], float]
    judge: Callable[[float], tuple[float, bool]]
    how: str  # what the figure is computed through, for the step's note


class Workload:
    """One workload kind. The defaults are a single call's: a workload overrides what it changes."""

    kind: ClassVar[str]
    settings: ClassVar[type[WorkloadSettings]]
    # what one call hands the next (a KV cache, a carried state): a target that replays one captured run from fixed
    # buffers cannot run it. None: every call stands alone.
    carries: ClassVar[str | None] = None
    # what its loop is called in words ("generation", "stream"); None: it runs no loop beside the call measured
    loop_name: ClassVar[str | None] = None
    # the start of report.md's heading of its section, which report.html puts its figure under
    heading: ClassVar[str] = ""
    # what the one call the latency table times stands for in this loop (report.md's heading), "" for a lone call
    call_scope: ClassVar[str] = ""

    # `tapeout init`'s commented [budgets] lines for a project of this kind
    example_budgets: ClassVar[tuple[str, ...]] = ("# latency_p50_ms = 10", "# latency_p90_ms = 15")
    # `tapeout init`'s commented lines for the optional data a project of this kind takes
    example_data: ClassVar[tuple[str, ...]] = (
        "# Optional: real inputs for calibration and a metric for the accuracy budgets (docs/project-file.md).",
        "# [calibration]",
        '# data = "calibration.npz"       # one array per input, shape (N, *input shape)',
        "# [evaluation]",
        '# metric = "metric.py:score"     # score(predict) -> float',
        '# direction = "higher"',
    )

    # ---- the project file, validated before anything runs
    def check_project(self, project: Project) -> None:
        """Raise ValueError, in a sentence naming the field and the fix, where the project's inputs cannot feed this
        workload."""

    def user_callables(self, project: Project) -> dict[str, str]:
        """`[workload]` field -> the `module:callable` it names: imported and found before the first expensive step."""
        return {}

    def calibration_feeds_inputs(self, project: Project) -> bool:
        """Whether `[calibration]` holds samples of the declared inputs (checked against them up front)."""
        return True

    def runs_on(self, capabilities: Capabilities) -> bool:
        """Whether a target with these capabilities runs this workload: it lists the kind (a plug-in workload that
        needs no more than single calls, `Session.run`, may say so instead)."""
        return self.kind in capabilities.workloads

    def check_profile(self, project: Project, profile: Profile, target: Any) -> None:
        """Raise BadInput where the profile (its budgets, the target's options) cannot judge or run this workload."""
        problem = target.workload_problem(self)
        if problem:
            raise BadInput(
                f"target '{profile.target}' (profile {profile.name}) cannot run this {self.kind} workload: {problem}",
                fix=f"set the option the message names in the profile's [options], or build the {self.kind} "
                "workload for another profile",
            )

    @staticmethod
    def check_samples(project: Project, profile: Profile, counts: tuple[tuple[str, float, int, str], ...]) -> None:
        """Raise BadInput where a budget the profile sets has too few samples to bound the percentile it is judged
        on: `counts` holds (budget, quantile, samples the loop takes, what those samples are)."""
        from tapeout.core.profile_schema import min_samples_for_bound

        confidence = profile.check.confidence
        for budget, quantile, count, what in counts:
            need = min_samples_for_bound(quantile, confidence)
            if getattr(profile.budgets, budget) is not None and count < need:
                raise BadInput(
                    f"{what} = {count} cannot bound the p{quantile * 100:g} that {budget} is judged on at "
                    f"confidence {confidence}: it needs at least {need} samples",
                    fix=f"raise [workload] trials in {project.file.name} (or check.repeats in the profile)",
                )

    # ---- a build, in the order of its steps (each receives the build state)
    def load(self, state: Any, loaded: Any) -> Any:
        """The loaded model as this workload exports it (a decoder wrapped as its cache graph); may replace
        `state.setup.project` with the graph's project."""
        return loaded

    def export_dims(self, project: Project) -> dict[str, int]:
        """The dims the export traces at."""
        return project.dims

    def verify_export(self, project: Project, module: Any, path: Path, options: Any, ui: Any) -> tuple[Any, Any]:
        """What the export verifies beyond one call's parity (a decoder's greedy decoding): its record for the
        report's `export.generation` (an object with `to_json`) and what it made on the way that the record step
        reuses; (None, None) where there is nothing more."""
        return None, None

    def companions(self, state: Any) -> list[Companion]:
        """The graphs the loop runs beside the main one, exported by `verify_export`; none by default."""
        return []

    def phases(self, state: Any) -> list | None:
        """The kernel structure of each phase of the loop, for the estimator; None: the one call's."""
        return None

    def reference_metric(self, state: Any) -> float | None:
        """The metric on the FP32 reference where it is not the exported reference's calls; None: it is."""
        return None

    def reference_how(self, state: Any) -> str:
        """How `reference_metric` runs, for the step's line ("" for the exported reference's calls)."""
        return ""

    def metric_predict(self, project: Project, predict: Any) -> Any:
        """What the project's metric is handed for one of the model's calls (a decoder's: through its cache)."""
        return predict

    def golden_inputs(self, state: Any) -> tuple[list, str] | None:
        """The golden inputs and where they came from; None: the declared inputs' samples."""
        return None

    def record(self, state: Any) -> Path | None:
        """Write the loop's replay data (WORKLOAD_FILE) from the FP32 reference while the torch model is loaded;
        None: nothing to replay."""
        return None

    def search_metric(self, state: Any, call_of: Callable[[Path], Any]) -> SearchMetric | None:
        """The accuracy the sensitivity loop judges candidates by when the project has no [evaluation] metric
        (`call_of`: how a model file becomes a call on the build's target); None: the loop needs the project's."""
        return None

    def scorer(self, target: Any) -> Any:
        """Where the sensitivity loop scores candidates when the target's runtime runs no single call of the graph;
        None: on the target itself."""
        return None

    def scored_by_own_loop(self, target: Any) -> bool:
        """Whether the artifact's metric goes through a loop of static-shape graphs (not one call)."""
        return False

    def carried_outputs(self, project: Project) -> tuple[str, ...]:
        """The outputs one call hands the next (a stream's state): the sensitivity loop ranks the groups on their
        path first, since their error compounds along the loop."""
        return ()

    def carried_inputs(self, project: Project) -> tuple[str, ...]:
        """The inputs each call is fed from the last one's `carried_outputs` (a stream's state inputs)."""
        return ()

    def check_quantization(self, method: str, needs_calibration: bool) -> None:
        """Raise BadInput where the planned quantization method cannot quantize this workload's graph (one that
        calibrates activations, where nothing samples them)."""

    def measure(self, state: Any) -> Any:
        """The loop measured in fresh processes (a build's, or a check's replay of the build's data); None: no loop."""
        return None

    def loop_data(self, state: Any) -> tuple[WorkloadSettings, Any, Path]:
        """What the loop runs on: at a check the build dir's settings, `replay` and file (verified); at a build the
        project's settings, None and the file the record step wrote."""
        if state.opened is not None:
            return state.opened.workload()
        return state.setup.project.workload, None, state.workload_file

    def manifest_record(self, state: Any) -> dict | None:
        """The manifest's `workload` entry: the settings and the replay file the record step wrote, with its hash
        (a check verifies it before replaying); None where it wrote none."""
        if state.workload_file is None:
            return None
        from tapeout.core.hashing import sha256_file

        return {
            "settings": state.setup.project.workload.model_dump(mode="json"),
            "layout": None,
            "file": WORKLOAD_FILE,
            "sha256": sha256_file(state.out / WORKLOAD_FILE),
        }

    # ---- a check, and the commands that read a build dir
    def replay(self, settings: WorkloadSettings, record: Any, where: Path) -> Any:
        """What a check replays, from the manifest's verified record (the cache layout of a generate build)."""
        return None

    def child(self, request: dict) -> dict:
        """The measuring process's loop for a request `measure` wrote (runner mode = this kind)."""
        raise NotImplementedError(f"the {self.kind} workload runs no loop in a measuring process")

    # ---- verdicts and the report
    def judge(self, budgets: Budgets, result: Any, settings: CheckSettings, emulated: str | None) -> list[BudgetResult]:
        """This workload's budgets judged on its loop's result; `result` None: the build ran another workload, and
        a budget asked of this one is unmeasured."""
        return []

    def markdown(self, section: dict, emulated: str | None) -> list[str]:
        """report.md's lines for the loop's section (the report's `workload`); `emulated`: why its timings are not
        the device's."""
        return []

    def one_line(self, section: dict, estimate: dict | None) -> str:
        """The console's line for the loop's section (with the estimate's, where the report has one)."""
        return ""

    def html_figure(self, section: dict) -> str:
        """report.html's figure for the loop's section, under `heading`; "" for none."""
        return ""

    def diff_figures(self, section: dict, timed: bool) -> dict[str, tuple]:
        """`tapeout diff`'s figures of the loop: name -> (point, low, high), low and high its noise range (None:
        exact); `timed`: whether its timings are the device's (not through an emulator)."""
        return {}

    def headline(self, section: dict, emulated: str | None) -> dict | None:
        """`tapeout compare`'s figures of the loop (its row's key is the kind); None for none."""
        return None

    def headline_cell(self, headline: dict) -> str:
        """`tapeout compare`'s table cell for `headline`."""
        return ""

    def rank(self, headline: dict) -> tuple[float, str] | None:
        """What `compare` ranks a build by when it has no forward latency (the figure and its name), or None."""
        return None


@functools.cache
def get(kind: str) -> Workload:
    """The workload of `kind`: built in, else an installed plug-in's; one line naming the kinds there are."""
    from tapeout.core import plugins

    module = BUILT_IN.get(kind)
    if module is not None:
        found = importlib.import_module(module).WORKLOAD
    elif kind in plugins.entries(GROUP):
        found = plugins.load(GROUP, kind)
    else:
        close = difflib.get_close_matches(kind, kinds(), n=1, cutoff=0.6)
        guess = f"did you mean '{close[0]}'? " if close else ""
        raise BadInput(
            f"unknown workload kind {kind!r}: {guess}the kinds are {', '.join(kinds())}",
            fix="set [workload] kind to one of them, or install the package that adds that workload",
        )
    if not isinstance(found, Workload) or found.kind != kind:
        raise BadInput(
            f"the workload plug-in '{kind}' does not name a Workload whose kind is {kind!r}",
            fix="its entry point names a tapeout.core.workload.Workload instance of that kind",
        )
    return found


def kinds() -> list[str]:
    """Every workload kind here: the built-in ones, then the installed plug-ins' (their names only: none is
    imported)."""
    from tapeout.core import plugins

    return [*BUILT_IN, *sorted(k for k in plugins.entries(GROUP) if k not in BUILT_IN)]


def of(project: Project) -> Workload:
    """The workload a validated project declares."""
    return get(project.workload.kind)


def of_settings(settings: WorkloadSettings | None) -> Workload:
    """The workload of a build dir's recorded settings; None: a build that recorded none ran one call."""
    return get(settings.kind if settings is not None else DEFAULT)
