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
from tapeout.records.analysis import AnalysisRecord
from tapeout.records.estimate import BottleneckRecord, EstimateRecord
from tapeout.records.measurement import MeasurementRecord
from tapeout.records.passes import PassRecord
from tapeout.records.pruning import PruningRecord
from tapeout.records.quantization import QuantizationRecord
from tapeout.records.record import Json, Record

SCHEMA = "tapeout.report/2"


class ProjectInfo(Record):
    name: str
    source: str
    file: str


class ProfileInfo(Record):
    name: str
    target: str
    device: str | None
    precision: str
    budgets_from_project: list[str] = Field(
        default_factory=list,
        description="budgets whose value is the project file's (over a shipped profile's default, or where the "
        "profile set none); every other budget is the profile's",
    )


class TargetRun(Record):
    name: str
    version: str | None
    emulated: str | None = Field(description="why this host's timings are not the device's, or null")
    compile_on: Literal["host", "device"]
    meters: list[str]


class DeviceMatch(Record):
    """The device that ran the measurement against the profile's device spec."""

    spec: str | None
    reported: str | None
    matches: bool | None
    note: str = ""


class ArtifactInfo(Record):
    main_file: str
    bytes: int
    sha256: str
    files: dict[str, str] | None = None
    meta: dict[str, Json] | None = Field(None, description="the backend's notes on its artifact, in its own terms")


class GoldenInfo(Record):
    samples: int
    source: str
    reference: str


class AccuracyInfo(Record):
    metric: str
    direction: str
    reference: float | None
    artifact: float | None
    where: str


class ModelInfo(Record):
    kind: str
    description: str
    weights_sha256: str
    files: dict[str, str] = Field(default_factory=dict)


class ExportInfo(Record):
    exporter: str
    fallback_reason: str | None = None
    opset: int | None = None
    ir_version: int | None = None
    seconds: float | None = None
    dynamic_dims: list[str] = Field(default_factory=list)
    output_names: list[str] | None = None
    parity: list[OutputParity] | None = Field(None, description="the export verified against torch")
    generation: dict[str, Json] | None = Field(
        None, description="a generate workload's KV-cache graph verified by greedy decoding against the plain forward"
    )
    cached: bool | None = Field(
        None,
        description="reused from the export cache: the figures are those of the build that exported and verified it",
    )


class OffAccelerator(Record):
    node: str
    op_type: str
    reason: str


class PlacementInfo(Record):
    accelerator: str
    total_nodes: int
    on_accelerator: int
    off_share: float
    off: list[OffAccelerator] = Field(default_factory=list)
    subgraphs: int | None = None
    source: str | None = None


class EngineInfo(Record):
    """A device-compiled target's engine: built here or reused, why, its cache key, what it is made of."""

    action: Literal["built", "reused"]
    reason: str
    file: str
    key: dict[str, Json]
    seconds: float
    summary: dict[str, Json] = Field(default_factory=dict)
    layers: list[dict[str, Json]] = Field(default_factory=list)


class StepTime(Record):
    name: str
    seconds: float = Field(ge=0)
    # the process's high-water mark when the step ended (absent in reports of earlier versions): the first step
    # whose figure is the run's peak is the one that reached it
    peak_rss_mb: float | None = Field(default=None, ge=0)


class RunCost(Record):
    """What the run itself cost: each step's wall time, the total, and tapeout's peak resident memory (the measuring
    processes' own is the measurement's `peak_rss_mb`)."""

    steps: list[StepTime]
    seconds: float = Field(ge=0)
    peak_rss_mb: float = Field(ge=0)


class HostInfo(Record):
    hostname: str | None = None
    os: str | None = None
    machine: str | None = None
    cpu: str
    cpu_flags: list[str] = Field(default_factory=list)
    physical_cores: int | None = None
    logical_cores: int | None = None
    memory_gb: float | None = None
    cpu_affinity: int | None = None


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
    measurement: MeasurementRecord
    accuracy: AccuracyInfo | None = None
    placement: PlacementInfo | None = None
    engine: EngineInfo | None = Field(
        None,
        description="device-compiled targets: the engine built or reused on this device (null where none was made)",
    )
    estimate: EstimateRecord | None = Field(
        None,
        description="the latency estimate for the profile's device, with the measured p50 and error where measured",
    )
    workload: dict[str, Json] | None = Field(
        None,
        description="a generate workload's measurement (TTFT per prompt "
        "length, TPOT, tokens/s, memory split, greedy agreement) or a stream's "
        "(chunk time, real-time factor, deadline misses, drift); null: forward",
    )
    bottlenecks: BottleneckRecord | None = Field(
        None, description="per op against the device's roofs (null where the timings are not the device's)"
    )
    # the build's own sections (null in a check)
    model: ModelInfo | None = None
    export: ExportInfo | None = None
    analysis: AnalysisRecord | None = None
    quantization: QuantizationRecord | None = None
    pruning: PruningRecord | None = None
    lint: list[str] = Field(default_factory=list)
    passes: list[PassRecord] = Field(
        default_factory=list,
        description="graph passes offered to the model: applied (how many places) or skipped (why)",
    )
    host: HostInfo
    run: RunCost | None = Field(None, description="each step's wall time and tapeout's own peak memory over the run")

    def to_json(self) -> dict[str, Any]:
        # fields a section's producer left out stay out: the file holds what was measured, no invented nulls
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


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
