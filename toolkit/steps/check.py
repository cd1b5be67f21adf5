"""`tapeout check BUILD_DIR`: on the device, prove the artifact still meets its budgets.

Needs the target's runtime and numpy; never torch or transformers. Verifies the artifact, the golden
file and the build's report against the manifest's hashes, re-measures latency, cold start, memory,
energy and parity in fresh processes, and carries over (marked `carried`) what it cannot recompute:
the accuracy verdicts (the metric's data stays on the host) and the placement from the compile-time
op trace. Writes `check.json` (the report schema, kind "check") and `check.md`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tapeout import targets
from tapeout.builds import reader
from tapeout.builds.staging import MANIFEST
from tapeout.core.artifact import Artifact
from tapeout.core.config import validate
from tapeout.core.console import UI
from tapeout.core.errors import BadInput
from tapeout.core.files import writable_dir, write_json, write_text
from tapeout.core.hashing import sha256_file, tree_size
from tapeout.core.host import host_fingerprint
from tapeout.core.parity import compare
from tapeout.core.schemas import CheckSettings, DeviceSpec, Profile
from tapeout.core.verdict import BudgetResult, Verdict
from tapeout.estimation import bottleneck, estimate
from tapeout.measurement import measure as measuring
from tapeout.measurement import verdicts
from tapeout.records.golden import load_golden
from tapeout.records.manifest import CHECK_SCHEMA, ManifestRecord
from tapeout.records.report import ArtifactInfo, GoldenInfo, ProjectInfo, Report
from tapeout.reports import html_page
from tapeout.reports.markdown import render_markdown
from tapeout.steps.assemble import assemble
from tapeout.steps.judge import estimated_verdicts
from tapeout.steps.setup import Context

if TYPE_CHECKING:  # annotations only: the registry imports a backend when `check` creates one
    from tapeout.targets.base import Probe, Target



def _profile(man: ManifestRecord, build_dir: Path) -> Profile:
    return validate(Profile, man.profile, build_dir / MANIFEST, prefix="profile.")


def measure_target(ctx: Context, artifact: Artifact, golden_path: Path,
                   settings: CheckSettings) -> tuple[measuring.Measurement, CheckSettings]:
    """Fresh-process measurement, shared by build and check. Through an emulator only enough runs for
    parity: its timings are never judged, so nothing is re-measured either."""
    emulated = ctx.emulated
    if emulated:
        settings = measuring.for_emulator(settings)
    target = ctx.target
    if ctx.deferred:  # no engine here: the ONNX it is compiled from runs on ORT's CPU EP, for parity only
        target = targets.create("onnxruntime", {"graph_optimization": "basic"})
        artifact = Artifact("onnxruntime", artifact.directory, artifact.main_file)
    with ctx.ui.step(f"measure {artifact.target} in fresh inference processes" + (" (emulated: parity only)" if emulated else "")):
        m = measuring.measure(target, artifact, golden_path, settings, progress=ctx.ui.detail,
                              **({} if emulated else {"undecided": verdicts.latency_undecided(ctx.profile.budgets, settings)}))
    if emulated:
        m.notes.append(f"{emulated}; {settings.iterations} runs for parity, not judged")
    return m, settings


def _carried(build: Report, profile: Profile) -> list[BudgetResult]:
    """The build's verdicts that a check cannot recompute, marked carried: accuracy (the metric's data
    stays on the host) and placement (the compile-time op trace; the artifact is that compiled graph)."""
    built = {b.budget: b for b in build.budgets}
    results = []
    for budget, limit, why in (
            ("accuracy_max_drop", profile.budgets.accuracy_max_drop, "the metric's data stays on the host"),
            ("accuracy_max_rel_drop", profile.budgets.accuracy_max_rel_drop, "the metric's data stays on the host"),
            ("placement_max_off_share", profile.budgets.placement_max_off_share, "from the compile-time op trace")):
        if limit is None:
            continue
        if budget not in built:
            results.append(BudgetResult(budget, limit, "", Verdict.UNMEASURED, carried=True,
                                        reason="the build's report has no verdict for it"))
            continue
        b = built[budget]
        results.append(BudgetResult(b.budget, b.limit, b.unit, b.verdict, b.measured, b.bound,
                                    f"judged at build ({why}); carried over, its report verified by hash. {b.reason}",
                                    carried=True))
    return results


@dataclass(frozen=True)
class OpenedBuild:
    """A build dir read back and verified, everything from it validated: what `check` measures."""

    directory: Path
    record: ManifestRecord
    profile: Profile
    target: Target
    probe: Probe
    device: DeviceSpec | None
    golden: Path
    golden_outputs: list
    built: Report
    reader: reader.BuildDir


def open_build(build_dir: Path | str) -> OpenedBuild:
    """Read, validate and verify a build dir through the verified reader — a folder from elsewhere, so every
    field and path in it is data: bad ones are one BadInput line. Nothing of the model runs here."""
    build = reader.open_build(build_dir)
    man = build.manifest
    target_name = man.artifact.target
    if target_name not in targets.TARGETS:
        raise BadInput(f"{build.directory} was built for target '{target_name}', which this tapeout does not know",
                       fix=f"check it with a tapeout that has that backend, or rebuild for one of: {', '.join(targets.TARGETS)}")
    profile = build.profile
    target = targets.create(target_name, profile.options)
    probe = target.probe()
    probe.require(target_name)
    build.artifact()
    golden_path = build.golden()
    built = build.report
    _, golden_outputs = load_golden(golden_path)
    return OpenedBuild(build.directory, man, profile, target, probe, build.device_spec, golden_path, golden_outputs,
                       built, build)


def check(build_dir: Path | str, ui: UI, strict: bool = False, iterations: int | None = None,
          repeats: int | None = None) -> Report:
    opened = open_build(build_dir)
    build_dir, man, profile, target, build = opened.directory, opened.record, opened.profile, opened.target, opened.built
    writable_dir(build_dir, "build dir", fix="check writes check.json and check.md into it: copy the "
                          "build dir somewhere writable and check that copy")
    settings = profile.check
    if iterations or repeats:  # validated like the profile's own values, never copied in unchecked
        override = {k: v for k, v in {"iterations": iterations, "repeats": repeats}.items() if v}
        settings = validate(CheckSettings, {**settings.model_dump(), **override}, Path("command line"), "--")
    target.preflight()
    ctx = Context(profile, target, opened.probe, ui, device=opened.device)
    artifact = Artifact(man.artifact.target, build_dir / "artifact", man.artifact.main_file,
                        meta=dict(man.artifact.meta or {}))
    golden_path, golden_outputs = opened.golden, opened.golden_outputs
    engine = None
    if ctx.capabilities.compile_on == "device":  # built once per device and toolchain, then reused from the cache
        with ui.step(f"{profile.target} engine for this device"):
            engine = target.build_engine(artifact, ui.detail)
        ui.note(engine.line())  # built (and why: another GPU, toolchain, driver) or reused

    m, settings = measure_target(ctx, artifact, golden_path, settings)
    parity = compare(golden_outputs, m.outputs, settings.parity.atol, settings.parity.rtol)
    host, built_on = host_fingerprint(), man.host
    if (host["cpu"], host["cpu_flags"]) != (built_on.cpu, built_on.cpu_flags):
        m.notes.append(f"checked on {host['cpu']} ({' '.join(host['cpu_flags'])}); built on {built_on.cpu} "
                       f"({' '.join(built_on.cpu_flags)}): parity above is this CPU's")
    est = None
    reported = (m.device or {}).get("name")
    device = estimate.spec_for_run(ctx.target.name, opened.device, reported)
    # build dirs from before the estimator have no export/
    if (build_dir / "export" / "model.onnx").is_file() and not estimate.nothing_to_estimate(
            ctx.target.name, device, ctx.emulated):
        with ui.step("estimate latency on the device (roofline, calibrated where measured)"):
            est = estimate.for_build(opened.reader, host=host, device_spec=device, reported=reported)
        ui.note(est.line())
    p50 = None if ctx.emulated else m.latency.quantiles["p50"].point
    artifact_bytes = tree_size(artifact.directory)
    budgets = [
        *verdicts.judge_on_device(profile.budgets, m, settings, ctx.emulated, estimated_verdicts(profile.budgets, est, ctx.emulated)),
        *verdicts.judge_artifact(profile.budgets, artifact_bytes),
        verdicts.judge_parity(parity, settings.parity),
        *_carried(build, profile),
    ]
    report = assemble(
        "check", ctx, build_dir=str(build_dir), strict=strict,
        project=ProjectInfo(name=man.project.name, source=man.project.source, file=man.project.file),
        artifact=ArtifactInfo(main_file=artifact.main_file, bytes=artifact_bytes,
                              sha256=man.artifact.files[artifact.main_file], files=None, meta=None),  # verified above
        golden=GoldenInfo(samples=len(golden_outputs), source="golden.npz", reference="the build's reference outputs"),
        m=m, parity=parity, budgets=budgets, placement=build.placement,
        engine=engine.to_json() if engine else None,
        estimate=estimate.with_measured(est, p50) if est else None,
        bottlenecks=None if ctx.emulated or est is None else bottleneck.view(m.op_profile, est.roof, p50),
    )
    write_check(build_dir, report)
    return report


def write_check(build_dir: Path, report: Report) -> None:
    """check.json, .md and .html, then check-manifest.json with check.json's hash: the reader verifies the check
    against it. The old record goes first, so a check cut short leaves no record that vouches for it."""
    (build_dir / reader.CHECK_MANIFEST).unlink(missing_ok=True)
    write_json(build_dir / "check.json", report.to_json())
    write_text(build_dir / "check.md", render_markdown(report))
    write_text(build_dir / "check.html", html_page.render(report))
    write_json(build_dir / reader.CHECK_MANIFEST, {
        "schema": CHECK_SCHEMA, "created": report.created,
        "report": {"file": "check.json", "sha256": sha256_file(build_dir / "check.json")},
        "build_manifest_sha256": sha256_file(build_dir / MANIFEST)})
