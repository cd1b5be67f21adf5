"""The `estimate` and `bottlenecks` sections of a report: the latency estimate for the profile's device
(roofline per kernel, calibrated where measured) and the per-op view of a measured run against the roofs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tapeout.records.record import Json, Record


class RoofRecord(Record):
    name: str
    kind: str
    peaks_tops: dict[str, float]
    bandwidth_gbs: float | None = None
    source: str
    notes: list[str] = Field(default_factory=list)
    cache_bandwidth_gbs: list[tuple[int, float]] | None = Field(
        None, description="this host's CPU only: [working-set bytes, GB/s], smallest first"
    )
    # written by earlier versions of tapeout, read and ignored: a reorder's strided loop, one thread's read stream
    strided: Json | None = None
    stream_gbs: Json | None = None


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
    weight_bytes: float = 0.0
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
    bound_ms: float | None = None  # the roofline's floor for it
    of_bound: float | None = None  # measured ÷ that floor: how far the runtime is from the roofline


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
    learned_fp32_gflops: Json | None = None  # earlier versions' kernel predictors: read and ignored
    measured_p50_ms: float | None = None
    error: float | None = None
    at_measured_speed: Json | None = None  # earlier versions' kernel predictors: read and ignored
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
