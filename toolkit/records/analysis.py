"""The `analysis` section of a report: the model's architecture (families with their evidence, node roles
counted, fusion groups), op census, parameters, FLOPs, bytes and peak activation memory at the build's
shapes."""

from __future__ import annotations

from pydantic import Field

from tapeout.records.record import Record


class FamilyRecord(Record):
    family: str
    confidence: float
    evidence: list[str]


class GroupRecord(Record):
    name: str
    role: str
    weighted: list[str]
    nodes: list[str]
    macs: int = 0
    params: int = 0


class CostRecord(Record):
    name: str
    op_type: str
    flops: int
    bytes_moved: int
    params: int
    body_of: str = ""


class FactsRecord(Record):
    attention_blocks: int = 0
    causal: bool = False
    heads: int | None = None
    norms: dict[str, int] = Field(default_factory=dict)
    vocab: int | None = None
    timestep_input: bool = False
    depthwise_convs: int = 0
    recurrent_ops: int = 0
    conv_mac_share: float = 0.0
    recurrent_mac_share: float = 0.0
    kv_cache_inputs: int = 0
    control_flow: str | None = Field(None, description="the If/Loop/Scan nodes and how their bodies were counted")
    body_nodes: int | None = None


class AnalysisRecord(Record):
    families: list[FamilyRecord]
    groups: list[GroupRecord]
    op_census: dict[str, int]
    params: int
    weight_bytes: int
    flops: int
    bytes_moved: int
    peak_activation_bytes: int
    peak_activation_at: str
    costs: list[CostRecord] = Field(default_factory=list, description="the costliest nodes")
    facts: FactsRecord
    unmatched: list[str] = Field(default_factory=list, description="detectors that did not fire, and why")
    family: str
    role_counts: dict[str, int]
