"""The `measurement` section of a report: what the fresh inference processes measured (latency with its
bounds, cold start, memory, energy, the device that ran it, the per-op profile, the host's own speed)."""

from __future__ import annotations

from pydantic import Field

from tapeout.records.record import Json, Record


class QuantileRecord(Record):
    quantile: float
    point: float
    lower: float | None = Field(description="null: the sample count cannot bound it from below")
    upper: float | None = Field(description="null: the sample count cannot bound it from above")
    per_repeat: list[float]


class LatencyRecord(Record):
    count: int
    repeats: int
    min: float
    max: float
    mean: float
    stdev: float
    cv: float
    cv_between_repeats: float
    quantiles: dict[str, QuantileRecord]
    confidence: float


class HistogramRecord(Record):
    edges_ms: list[float]
    counts: list[list[int]]


class ColdStartRecord(Record):
    per_repeat: list[float]
    max: float
    median: float


class MemoryRecord(Record):
    peak_rss: float
    peak_rss_per_repeat: list[float]
    rss_before_session: float
    rss_after_session: float
    scope: str
    device_peak: float | None = None
    device_peak_per_repeat: list[float] = Field(default_factory=list)
    device_scope: str | None = None


class EnergyRecord(Record):
    meter: str
    mj_per_inference: float
    mj_bounds: list[float]
    power_avg_w: float
    power_bounds_w: list[float]
    scope: str
    method: str
    window_s: list[float]
    runs: list[int]


class DeviceReading(Record):
    """What ran it, as the meters read it (NVML, amdsmi, the Jetson device tree)."""

    name: str | None = None
    uuid: str | None = None
    driver: str | None = None
    compute_capability: str | None = None
    power_limit_w: float | None = None
    memory_total_mb: float | None = None
    gfx: str | None = None
    bdf: str | None = None


class OpTypeRecord(Record):
    op_type: str
    provider: str
    calls: int
    total_us: float
    share: float


class TopOpRecord(Record):
    node: str
    op_type: str
    provider: str
    calls: int
    mean_us: float
    share: float


class ProfiledOp(Record):
    node: str
    op_type: str
    calls: int
    total_us: float
    flops: int | None = None
    in_bytes: int | None = None
    out_bytes: int | None = None
    precision: str = ""
    in_shapes: list[list[int | str | None]] = Field(default_factory=list)
    out_shapes: list[list[int | str | None]] = Field(default_factory=list)


class OpProfileRecord(Record):
    runs: int
    method: str = ""
    mean_run_us: float | None = None
    median_run_us: float | None = None
    mean_kernel_us: float | None = None
    overhead_share: float | None = None
    op_types: list[OpTypeRecord]
    top_ops: list[TopOpRecord] = Field(default_factory=list)
    ops: list[ProfiledOp] = Field(default_factory=list)
    node_count: int | None = None


class HostStateRecord(Record):
    bandwidth_gbs: float
    bandwidth_gbs_range: list[float]
    fp32_gflops: float
    fp32_gflops_range: list[float]


class MeasurementRecord(Record):
    latency_ms: LatencyRecord
    latency_e2e_ms: LatencyRecord | None = None
    latency_histogram: HistogramRecord | None = None
    cold_start_ms: ColdStartRecord
    runtime_import_ms: list[float]
    session_create_ms: list[float]
    first_inference_ms: list[float]
    warmup_iters: list[int]
    memory_mb: MemoryRecord
    energy: EnergyRecord | None = None
    device: DeviceReading | None = None
    unmeasured: dict[str, str] = Field(default_factory=dict)
    meters: dict[str, list[dict[str, Json]]] = Field(
        default_factory=dict, description="per meter other than rss, its raw result per process"
    )
    op_profile: OpProfileRecord | None = None
    notes: list[str] = Field(default_factory=list)
    host_state: HostStateRecord | None = None
