"""One report for a build or a check from what the steps found; the exit code follows from the verdicts."""

from __future__ import annotations

from typing import Any, Literal

from tapeout.core.host import host_fingerprint, now
from tapeout.core.parity import OutputParity
from tapeout.core.verdict import BudgetResult
from tapeout.measurement import verdicts
from tapeout.measurement.measure import Measurement
from tapeout.records.report import (
    SCHEMA,
    ArtifactInfo,
    DeviceMatch,
    GoldenInfo,
    ProfileInfo,
    ProjectInfo,
    Report,
    TargetRun,
)
from tapeout.steps.setup import Context


def device_match(ctx: Context, m: Measurement) -> DeviceMatch | None:
    """Say when the device that ran is not the profile's (an H200 checking an H100 profile, say)."""
    reported = (m.device or {}).get("name")
    spec = ctx.device
    if spec is None and reported is None:
        return None
    if spec is None or not spec.identifiers or reported is None:
        return DeviceMatch(spec=spec.name if spec else None, reported=reported, matches=None,
                           note="" if reported is None else "the profile names no device spec to compare with")
    ok = spec.matches(reported)
    return DeviceMatch(spec=spec.name, reported=reported, matches=ok,
                       note="" if ok else f"measured on {reported}, but the profile is for {spec.name}: the "
                                          "latency, memory and power verdicts are this device's, not the profile's")


def assemble(kind: Literal["build", "check"], ctx: Context, *, build_dir: str, project: ProjectInfo,
             artifact: ArtifactInfo, golden: GoldenInfo, m: Measurement, parity: list[OutputParity],
             budgets: list[BudgetResult], strict: bool, **sections: Any) -> Report:
    """One report for a build or a check; the exit code follows from the verdicts (DESIGN §4)."""
    caps = ctx.capabilities
    match = device_match(ctx, m)
    if match is not None and match.note and match.matches is False:
        m.notes.append(match.note)
    # every section named, the absent ones as null: a report lists what it does not have
    absent = {name: [] if name == "lint" else None for name in _OPTIONAL}
    return Report(
        schema=SCHEMA, kind=kind, created=now(), exit_code=verdicts.exit_code(budgets, strict), build_dir=build_dir,
        project=project,
        profile=ProfileInfo(name=ctx.profile.name, target=ctx.profile.target, device=ctx.profile.device,
                            precision=ctx.profile.precision),
        target=TargetRun(name=ctx.target.name, version=ctx.probe.version, emulated=ctx.emulated,
                         compile_on=caps.compile_on, meters=list(caps.meters)),
        device=match, artifact=artifact, golden=golden, parity=parity, budgets=budgets, measurement=m.to_json(),
        host=host_fingerprint(), **{**absent, **sections},
    )


_OPTIONAL = ("accuracy", "placement", "engine", "estimate", "bottlenecks", "model", "export", "analysis",
             "quantization", "pruning", "lint")
