"""What analysis found in a model: families, node roles, fusion groups, costs.

Shared types (standard library only): `graph/analyze.py` produces them, `quantize/` reads them to
turn rules into a plan, reports render them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

FAMILIES = ("cnn", "transformer-encoder", "decoder-llm", "speech-recurrent", "diffusion", "mlp")

# Per-node roles. The quantization rules are keyed on these, never on op types alone.
ROLES = (
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_qkv",
    "attn_out",
    "attn_scores",
    "attn_mask",
    "attn_softmax",
    "attn_context",
    "ffn_in",
    "ffn_gate",
    "ffn_up",
    "ffn_out",
    "norm",
    "residual",
    "embedding",
    "lm_head",
    "head",
    "conv",
    "first_conv",
    "depthwise_conv",
    "recurrent_cell",
    "timestep_embedding",
    "linear",
)


@dataclass(frozen=True)
class FamilyScore:
    family: str
    confidence: float
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class FusionGroup:
    """Nodes the compiler fuses, so they take one precision decision.

    `weighted` are the nodes that carry weights (what a quantizer touches); `nodes` adds the bias,
    activation and normalization nodes fused with them.
    """

    name: str
    role: str
    weighted: tuple[str, ...]
    nodes: tuple[str, ...]
    macs: int = 0
    params: int = 0


@dataclass(frozen=True)
class NodeCost:
    name: str
    op_type: str
    flops: int
    bytes_moved: int
    params: int
    body_of: str = ""  # the If/Loop/Scan node whose body holds it ("" in the main graph)


@dataclass
class Analysis:
    families: list[FamilyScore]
    roles: dict[str, str]  # node name -> role
    groups: list[FusionGroup]
    op_census: dict[str, int]
    params: int
    weight_bytes: int
    flops: int
    bytes_moved: int
    peak_activation_bytes: int
    peak_activation_at: str  # the node at which the peak is reached
    costs: list[NodeCost] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # heads, causal, vocab, depthwise, ...
    unmatched: list[str] = field(default_factory=list)  # detectors that did not fire, and why
    scopes: dict[str, str] = field(default_factory=dict)  # node name -> the torch module it was exported from

    @property
    def family(self) -> str:
        return self.families[0].family if self.families else "mlp"

    def body_of(self, node: str) -> str:
        return next((c.body_of for c in self.costs if c.name == node), "")

    def op_type(self, node: str) -> str | None:
        return next((c.op_type for c in self.costs if c.name == node), None)

    def group_of(self, node: str) -> FusionGroup | None:
        return next((g for g in self.groups if node in g.nodes), None)

    def to_json(self, top_costs: int = 15) -> dict[str, Any]:
        data = asdict(self)
        data["family"] = self.family
        data["costs"] = [asdict(c) for c in sorted(self.costs, key=lambda c: -c.flops)[:top_costs]]
        data["role_counts"] = _count(self.roles.values())
        del data["roles"], data["scopes"]  # per-node roles are in the groups; the full maps are long
        return data


def _count(values) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))
