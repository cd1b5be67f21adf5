"""The `estimate` and `bottlenecks` sections of a report: the latency estimate for the profile's device
(roofline per kernel, calibrated where measured) and the per-op view of a measured run against the roofs."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, NonNegativeFloat, PositiveInt

from tapeout.records.record import Record


class StridedRecord(Record):
    """This host's strided loop (estimation/strided.py): read back for arithmetic, so typed and finite."""

    model_config = ConfigDict(**Record.model_config, allow_inf_nan=False)
    sets: PositiveInt
    ways: PositiveInt
    line: PositiveInt
    ns_per_element: list[tuple[NonNegativeFloat, NonNegativeFloat]] = Field(
        min_length=1, description="[lines in the worst L1 set / its ways, ns per element], by ratio")


class RoofRecord(Record):
    name: str
    kind: str
    peaks_tops: dict[str, float]
    bandwidth_gbs: float | None = None
    source: str
    notes: list[str] = Field(default_factory=list)
    cache_bandwidth_gbs: list[tuple[int, float]] | None = Field(
        None, description="this host's CPU only: [working-set bytes, GB/s], smallest first")
    strided: StridedRecord | None = Field(None, description="this host's CPU only, where its L1 was measured")
    stream_gbs: float | None = Field(None, gt=0, description="this host's CPU at one inference thread only: what one "
                                     "thread reads an array past the caches at (a decode step's weights)")


class PredictedRecord(Record):
    point: float
    low: float
    high: float


class ClassRecord(Record):
    cls: str = Field(alias="class")
    kernels: int
    flops: int
    bytes: float
    roofline_us: float
    predicted_us: float


class KernelRecord(Record):
    name: str
    cls: str = Field(alias="class")
    precision: str
    flops: int
    bytes: float
    nodes: int
    launches: int
    reread_bytes: float
    compute_us: float
    memory_us: float


class PhaseCostRecord(Record):
    kind: str
    seq: int
    past: int
    lower_bound_ms: float
    predicted_ms: float | None = None
    gflop: float
    mb: float
    memory_bound_share: float


class PrefillEstimateRecord(Record):
    lower_bound: float
    predicted: PredictedRecord | None = None
    phase: PhaseCostRecord


class TpotEstimateRecord(Record):
    lower_bound: dict[str, float | None]
    predicted: dict[str, PredictedRecord | None] | None = None


class TokensEstimateRecord(Record):
    upper_bound: float | None = None
    predicted: PredictedRecord | None = None


class EstimateVsMeasured(Record):
    what: str
    estimated_ms: float
    measured_ms: float | None = None
    error: float | None = None
    of: Literal["predicted", "bound"]


class GenerationEstimateRecord(Record):
    """A generate workload's loop priced phase by phase (estimation/generation.py)."""

    device: str
    method: str
    calibration: str | None = None
    band: list[float] | None = None
    band_from: str | None = None
    ttft_ms: dict[str, PrefillEstimateRecord]
    tpot_ms: TpotEstimateRecord
    decode_steps: list[PhaseCostRecord]
    decode_tokens_per_s: TokensEstimateRecord
    measured: list[EstimateVsMeasured] | None = None


class AtMeasuredSpeedRecord(Record):
    """The estimate at the measurement's host speed (estimation/host_drift.py)."""

    p50_ms: float
    learned_fp32_gflops: float
    measured_fp32_gflops: float
    error: float | None = None


class EstimateRecord(Record):
    device: str
    target: str
    precision: str
    method: str
    roof: RoofRecord
    lower_bound_ms: float
    predicted_ms: dict[str, PredictedRecord] | None = None
    band: list[float] | None = None
    calibration: str | None = None
    kernels: int
    by_class: list[ClassRecord]
    top_kernels: list[KernelRecord]
    notes: list[str] = Field(default_factory=list)
    learned_fp32_gflops: float | None = None
    measured_p50_ms: float | None = None
    error: float | None = None
    at_measured_speed: AtMeasuredSpeedRecord | None = None
    generation: GenerationEstimateRecord | None = None


class BoundShare(Record):
    ops: int
    share: float


class OpBoundRecord(Record):
    node: str
    op_type: str
    cls: str = Field(alias="class")
    precision: str
    mean_us: float
    share: float
    flops: int | None = None
    bytes: int | None = None
    intensity: float | None = None
    achieved_gflops: float | None = None
    achieved_gbs: float | None = None
    roof_share: float | None = None
    bound: str


class ChainRecord(Record):
    ops: list[str]
    op_types: list[str]
    measured_us: float
    fused_us: float
    saving_us: float


class BottleneckRecord(Record):
    roof: RoofRecord
    method: str
    outside_ops_share: float | None = None
    by_bound: dict[str, BoundShare]
    ops: list[OpBoundRecord]
    fusible_chains: list[ChainRecord] = Field(default_factory=list)
    fusible_saving_us: float = 0.0
    p50_ms: float | None = None
    profiler_scale: float = 1.0
