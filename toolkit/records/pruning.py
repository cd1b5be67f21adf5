"""The `pruning` section of a report: what structured pruning removed (per step, the widths left), what was
protected and why, the 2:4 sparsity, the recovery, and the latency-driven search where there was one."""

from __future__ import annotations

from pydantic import Field

from tapeout.records.record import Record


class PruneStepRecord(Record):
    what: str
    ratio: float
    macs_before: float
    macs_after: float
    params_before: int
    params_after: int
    widths: dict[str, int] = Field(default_factory=dict)
    removed: list[str] | None = None  # depth: the blocks removed
    kept: list[int] | None = None
    blocks: int | None = None
    influence: dict[str, float] | None = None


class SparsityRecord(Record):
    layers: int
    eligible_share: float
    zeros_in_eligible: float
    layer_names: list[str]


class RecoveryRecord(Record):
    method: str
    steps: int | None = None
    why: str | None = None
    hidden_blocks: int | None = None
    seconds: float | None = None
    lr: float | None = None
    loss_first: float | None = None
    loss_last: float | None = None
    stopped: str | None = None
    samples: int | None = None
    batch: int | None = None
    trimmed: bool | None = None
    teacher: str | None = None
    batching: str | None = None


class SearchStepRecord(Record):
    ratio: float
    latency_ms: float
    metric: float | None = None
    macs: float | None = None
    params: int | None = None
    accepted: bool


class PruneSearchRecord(Record):
    steps: list[SearchStepRecord]
    limit_ms: float
    method: str
    estimated: bool
    stopped: str


class PruningRecord(Record):
    what: list[str]
    ratio: float
    importance: str
    importance_how: str
    round_to: int
    protected: dict[str, str]
    steps: list[PruneStepRecord]
    sparsity_2_4: SparsityRecord | None = None
    transformer: bool
    macs_before: float
    macs_after: float
    params_before: int
    params_after: int
    flops_reduction: float
    recovery: RecoveryRecord | None = None
    recovery_data: str | None = None
    metric_fp32: float | None = None
    search: PruneSearchRecord | None = None
