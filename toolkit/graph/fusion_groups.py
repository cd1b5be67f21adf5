"""Fusion groups: the detected roles' weighted nodes, each with the bias, activation and norm a compiler fuses into
it, named by block (`block3.attn.qkv`, `block3.ffn.in`) so plans and profiles can name them. `graph.detect` calls it
once the roles are known.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tapeout.graph.analysis import FusionGroup

if TYPE_CHECKING:
    from tapeout.graph.detect import Detected

ACTIVATIONS = {
    "Relu",
    "Gelu",
    "FastGelu",
    "BiasGelu",
    "Sigmoid",
    "Tanh",
    "Clip",
    "LeakyRelu",
    "HardSwish",
    "HardSigmoid",
    "Erf",
    "Silu",
    "Swish",
    "Mish",
    "Softplus",
}


def fused_followers(view, node, ops: set[str]) -> list[str]:
    """The bias Add / activation / norm nodes directly after `node` that a compiler fuses into it."""
    names, tensor = [], node.output[0]
    for _ in range(4):
        users = view.consumers.get(tensor, [])
        if len(users) != 1 or users[0].op_type not in ops:
            break
        user = users[0]
        if user.op_type == "Add" and not any(view.is_const(t) for t in user.input):
            break  # a residual Add joins two branches: it is not a bias
        names.append(user.name)
        tensor = user.output[0]
    return names


def fusion_groups(view, found: Detected, blocks: list[dict], costs: dict, order: dict) -> list[FusionGroup]:
    softmax_at = sorted(order[b["softmax"].name] for b in blocks)

    def block_of(node) -> int:
        return max(0, sum(1 for s in softmax_at if s < order[node.name]) - 1)

    def make(name: str, role: str, members: list) -> FusionGroup:
        followers = [
            f
            for m in members
            for f in fused_followers(
                view, m, {"Add"} | ACTIVATIONS | ({"BatchNormalization"} if m.op_type.startswith("Conv") else set())
            )
        ]
        return FusionGroup(
            name,
            role,
            tuple(m.name for m in members),
            tuple([m.name for m in members] + followers),
            macs=sum(costs[m.name].flops for m in members) // 2,
            params=sum(costs[m.name].params for m in members),
        )

    by_name = {n.name: n for n in view.nodes}
    groups, taken = [], set()
    for i, block in enumerate(blocks):
        qkv = [by_name[n] for n in dict.fromkeys(x.name for x in block["q"] + block["k"] + block["v"])]
        for name, role, members in (
            (f"block{i}.attn.qkv", "attn_qkv", qkv),
            (f"block{i}.attn.out", "attn_out", block["o"]),
        ):
            members = [m for m in members if m.name not in taken]
            if members:
                groups.append(make(name, role, members))
                taken.update(m.name for m in members)
    ffn_in = [n for n in view.nodes if found.roles.get(n.name) in ("ffn_in", "ffn_gate", "ffn_up")]
    for idx in sorted({block_of(n) for n in ffn_in}):
        members = [n for n in ffn_in if block_of(n) == idx and n.name not in taken]
        if members:
            groups.append(make(f"block{idx}.ffn.in", "ffn_in", members))
            taken.update(m.name for m in members)
    counters: dict[str, int] = {}
    for n in view.nodes:
        role = found.roles.get(n.name)
        # a recurrent cell is one group: its input and recurrent weights, gates and state move together
        cell = role == "recurrent_cell" and n.op_type in ("LSTM", "GRU", "RNN")
        if n.name in taken or role is None or (view.weight_of(n) is None and role != "embedding" and not cell):
            continue
        if role == "ffn_out":
            name = f"block{block_of(n)}.ffn.out"
        elif role in ("lm_head", "head", "first_conv"):
            name = role
        else:
            counters[role] = counters.get(role, 0) + 1
            name = f"{role}{counters[role]}"
        groups.append(make(name, role, [n]))
        taken.add(n.name)
    groups.sort(key=lambda g: min(order[m] for m in g.weighted))
    seen: dict[str, int] = {}
    unique = []
    for g in groups:  # names are keys in plans and profiles: never two groups with one name
        seen[g.name] = seen.get(g.name, 0) + 1
        unique.append(
            g
            if seen[g.name] == 1
            else FusionGroup(f"{g.name}#{seen[g.name]}", g.role, g.weighted, g.nodes, g.macs, g.params)
        )
    return unique
