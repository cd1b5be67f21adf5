"""The report as one typed model: `report.json` (build) and `check.json` (check) are instances of it,
built by `assemble` for both; report.md renders from it (report.py). Schema: docs/report-schema.md.

Sections a check cannot recompute (the model, export, analysis, quantization, accuracy) are the
build's; a check carries over only verdicts, marked `carried`, after the manifest's hash of
report.json has been verified.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tapeout import manifest, verdicts
from tapeout.context import Context
from tapeout.errors import BadInput, first_line
from tapeout.measure import Measurement
from tapeout.parity import OutputParity
from tapeout.types import BudgetResult

SCHEMA = "tapeout.report/2"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProjectInfo(_Section):
    name: str
    source: str
    file: str


class ProfileInfo(_Section):
    name: str
    target: str
    device: str | None
    precision: str


class TargetRun(_Section):
    name: str
    version: str | None
    emulated: str | None = Field(description="why this host's timings are not the device's, or null")
    compile_on: Literal["host", "device"]
    meters: list[str]


class DeviceMatch(_Section):
    """The device that ran the measurement against the profile's device spec."""

    spec: str | None
    reported: str | None
    matches: bool | None
    note: str = ""


class ArtifactInfo(_Section):
    main_file: str
    bytes: int
    sha256: str
    files: dict[str, str] | None = None
    meta: dict[str, Any] | None = None


class GoldenInfo(_Section):
    samples: int
    source: str
    reference: str


class AccuracyInfo(_Section):
    metric: str
    direction: str
    reference: float | None
    artifact: float | None
    where: str


class Report(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_id: Literal["tapeout.report/2"] = Field(SCHEMA, alias="schema")
    kind: Literal["build", "check"]
    created: str
    exit_code: int
    build_dir: str
    project: ProjectInfo
    profile: ProfileInfo
    target: TargetRun
    device: DeviceMatch | None = None
    artifact: ArtifactInfo
    golden: GoldenInfo
    parity: list[OutputParity]
    budgets: list[BudgetResult]
    measurement: dict[str, Any] = Field(description="Measurement.to_json(): latency, memory, energy, op profile")
    accuracy: AccuracyInfo | None = None
    placement: dict[str, Any] | None = None
    engine: dict[str, Any] | None = Field(None, description="device-compiled targets: EngineBuild.to_json(), the "
                                          "engine built or reused on this device (null where none was made)")
    estimate: dict[str, Any] | None = Field(None, description="estimate.with_measured(): the latency estimate "
                                            "for the profile's device, with the measured p50 and error where measured")
    bottlenecks: dict[str, Any] | None = Field(None, description="bottleneck.view(): per op against the device's "
                                               "roofs (null where the timings are not the device's)")
    # the build's own sections (null in a check)
    model: dict[str, Any] | None = None
    export: dict[str, Any] | None = None
    analysis: dict[str, Any] | None = None
    quantization: dict[str, Any] | None = None
    pruning: dict[str, Any] | None = None
    lint: list[str] = Field(default_factory=list)
    host: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def load(path, what: str = "report") -> Report:
    """A report read back (tapeout report, check carrying verdicts): malformed is the user's to fix."""
    import json

    from tapeout.config import describe_validation_error

    fix = "rebuild with this tapeout version; reports are never edited by hand"
    try:
        return Report.model_validate(json.loads(path.read_text()))
    except ValidationError as exc:
        raise BadInput(f"not a {SCHEMA} {what}: {describe_validation_error(path, Report, exc)}", fix=fix) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadInput(f"{path} is not a {SCHEMA} {what} ({first_line(exc)})", fix=fix) from None


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
    return Report(
        kind=kind, created=manifest.now(), exit_code=verdicts.exit_code(budgets, strict), build_dir=build_dir,
        project=project,
        profile=ProfileInfo(name=ctx.profile.name, target=ctx.profile.target, device=ctx.profile.device,
                            precision=ctx.profile.precision),
        target=TargetRun(name=ctx.target.name, version=ctx.probe.version, emulated=ctx.emulated,
                         compile_on=caps.compile_on, meters=list(caps.meters)),
        device=match, artifact=artifact, golden=golden, parity=parity, budgets=budgets, measurement=m.to_json(),
        host=manifest.host_fingerprint(), **sections,
    )
