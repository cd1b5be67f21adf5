"""The `quantization` section of a report: the precision plan (per fusion group, with the rule or loop step
that put it there), the sensitivity loop's ranking and steps, and what the quantizer did."""

from __future__ import annotations

from pydantic import Field

from tapeout.records.record import Json, Record


class GroupPlanRecord(Record):
    group: str
    role: str
    nodes: list[str]
    precision: str
    reason: str
    modules: list[str] = Field(default_factory=list)  # the torch modules its nodes came from (PT2E methods)


class PlanRecord(Record):
    method: str
    family: str
    target: str
    ladder: list[str]
    groups: list[GroupPlanRecord]
    per_channel: bool = True
    reduce_range: bool = False
    activation_type: str = "uint8"
    weight_type: str = "int8"
    activation_symmetric: bool = False
    calibration_method: str = "minmax"
    block_size: int = 32
    int4_algorithm: str = "rtn"
    accuracy_level: int | None = None
    notes: list[str] = Field(default_factory=list)
    float_nodes: list[str] = Field(default_factory=list)
    float_ops: list[str] = Field(default_factory=list)
    wide_tensors: list[str] = Field(default_factory=list)  # carried between calls: 16-bit in an 8-bit plan
    model_type: str | None = None
    preset: str | None = None
    high_precision: str = "fp16"
    quantized_groups: int
    float_groups: int


class StepRecord(Record):
    index: int
    action: str
    group: str | None = None
    precision: str | None = None
    metric: float
    drop: float
    latency_ms: float
    meets_accuracy: bool


class RankedRecord(Record):
    group: str
    role: str
    precision: str
    relative_error: float


class UnrankedRecord(Record):
    group: str
    role: str
    precision: str
    skipped: str


class SearchRecord(Record):
    steps: list[StepRecord] = Field(default_factory=list)
    ranking: list[RankedRecord] = Field(default_factory=list)
    unranked: list[UnrankedRecord] = Field(default_factory=list)
    stopped: str
    evaluations: int = 0
    metric: float | None = None


class FallbackRecord(Record):
    """A group its quantizer failed on, moved one rung up so the build could go on."""

    group: str
    moved_from: str = Field(alias="from")
    to: str
    why: str


class QuickLatencyRecord(Record):
    fp32: float
    quantized: float


class CompanionRecord(Record):
    """A graph the workload's loop runs beside the main one (a speech model's encoder), at the first plan of its own
    architecture; `method` None where that plan needed calibration and the graph stayed FP32 (`kept_float` says why)."""

    method: str | None
    family: str
    groups: int = 0
    quantized_groups: int = 0
    rungs: dict[str, int] = Field(default_factory=dict, description="groups at each precision")
    fallbacks: list[FallbackRecord] = Field(default_factory=list)
    model_sha256: str | None = None
    kept_float: str | None = None


class QuantizationRecord(Record):
    precision: str
    evaluated_on: str | None = None
    apply: dict[str, Json] | None = Field(None, description="what the quantization method did, in its own terms")
    search: SearchRecord
    plan: PlanRecord
    model_sha256: str
    fp32_bytes: int
    quantized_bytes: int
    quick_latency_ms: QuickLatencyRecord | None = None
    notes: list[str] = Field(default_factory=list)
    fallbacks: list[FallbackRecord] = Field(
        default_factory=list, description="groups moved up a rung because the quantizer failed on them"
    )
    companions: dict[str, CompanionRecord] = Field(
        default_factory=dict, description="the graphs the workload's loop runs beside this one, by name"
    )
