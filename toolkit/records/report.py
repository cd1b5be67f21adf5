"""The report as one typed model: `report.json` (build) and `check.json` (check) are instances of it,
built by `assemble` for both; report.md renders from it (report.py). Schema: docs/report-schema.md.

Sections a check cannot recompute (the model, export, analysis, quantization, accuracy) are the
build's; a check carries over only verdicts, marked `carried`, after the manifest's hash of
report.json has been verified.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tapeout.core.errors import BadInput, first_line
from tapeout.core.parity import OutputParity
from tapeout.core.verdict import BudgetResult

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

    from tapeout.core.config import describe_validation_error

    fix = "rebuild with this tapeout version; reports are never edited by hand"
    try:
        return Report.model_validate(json.loads(path.read_text()))
    except ValidationError as exc:
        raise BadInput(f"not a {SCHEMA} {what}: {describe_validation_error(path, Report, exc)}", fix=fix) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadInput(f"{path} is not a {SCHEMA} {what} ({first_line(exc)})", fix=fix) from None
