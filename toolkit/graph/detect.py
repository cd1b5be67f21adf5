"""Architecture detection from the ONNX graph: families with confidence, node roles, fusion groups.

Each detector is a small function over a GraphView that labels the nodes it recognises and, when it
finds nothing, says why (`unmatched`, which goes into the report). Motifs follow the research notes
(quant-prune §6.1): attention is MatMul → (scale, mask) → Softmax → MatMul with projections walked
back and forth through reshapes; norms are the ops or their decomposed forms; the causal mask is a
Trilu or a constant lower-triangular mask on the score path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from tapeout.graph.analysis import FamilyScore, FusionGroup, NodeCost
from tapeout.graph.families import families
from tapeout.graph.fusion_groups import ACTIVATIONS, fusion_groups

# Reshape: grouped-query attention computed per key/value head (quantize/passes/grouped_attention.py) reshapes its
# scores back to the query heads before the scale and mask, and the probabilities to the groups after the Softmax
_SCORE_PATH = {"Add", "Where", "Mul", "Div", "Cast", "Sub", "Softcap", "Tanh", "Reshape"}
_SHAPE_OPS = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Cast", "Identity"}
# rotary (Mul/Add/Neg/Slice/Concat), the cache (Concat with past), GQA's repeated key/value heads (Expand, Tile)
_PROJ_PATH = _SHAPE_OPS | {
    "Mul",
    "Div",
    "Add",
    "Slice",
    "Concat",
    "Neg",
    "Split",
    "Gather",
    "RotaryEmbedding",
    "Expand",
    "Tile",
}
_NORM_OPS = {
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "RMSNormalization",
    "GroupNormalization",
    "InstanceNormalization",
    "BatchNormalization",
}
_FUSED_ATTENTION = {"Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention"}
_RECURRENT = {"LSTM", "GRU", "RNN", "Scan", "Loop", "DynamicQuantizeLSTM"}
_KV_NAME = re.compile(r"past|cache|^(key|value)_\d", re.IGNORECASE)


@dataclass
class Detected:
    families: list[FamilyScore] = field(default_factory=list)
    roles: dict[str, str] = field(default_factory=dict)
    groups: list[FusionGroup] = field(default_factory=list)
    facts: dict = field(default_factory=dict)
    unmatched: list[str] = field(default_factory=list)


def _walk(view, start: str, through, stop, *, forward: bool = False, depth: int = 12) -> list:
    """Nodes satisfying `stop` reached from tensor `start` through ops in `through` (a set of op
    types, or a predicate on the node), breadth first."""
    passes = through if callable(through) else (lambda n: n.op_type in through)
    found, seen, frontier = [], set(), [start]
    for _ in range(depth):
        nxt = []
        for tensor in frontier:
            nodes = (
                view.consumers.get(tensor, [])
                if forward
                else [view.producer[tensor]]
                if tensor in view.producer
                else []
            )
            for node in nodes:
                if node.name in seen:
                    continue
                seen.add(node.name)
                if stop(node):
                    found.append(node)
                elif passes(node):
                    nxt.extend(node.output if forward else [t for t in node.input if t and not view.is_const(t)])
        frontier = nxt
        if not frontier:
            break
    return found


def _is_weighted_matmul(view, node) -> bool:
    return node.op_type in ("MatMul", "Gemm") and view.weight_of(node) is not None


def _is_act_matmul(view, node) -> bool:
    return node.op_type in ("MatMul", "FusedMatMul") and not any(view.is_const(t) for t in node.input[:2])


def _is_causal_mask(view, tensor: str, depth: int = 10) -> bool:
    array = view.const_array(tensor)
    if array is not None and array.ndim >= 2 and array.shape[-1] == array.shape[-2] and array.shape[-1] > 1:
        square = array.reshape(-1, *array.shape[-2:])[0]
        if square.dtype == bool:
            return bool(np.array_equal(square, np.tril(np.ones_like(square))))
        blocked = square < -1e4  # additive mask: large negatives above the diagonal
        return bool(blocked.any() and np.array_equal(blocked, np.triu(np.ones_like(blocked), 1)))
    node = view.producer.get(tensor)
    if node is None or depth == 0:
        return False
    if node.op_type == "Trilu" or _positions_compared(view, node):
        return True
    return any(_is_causal_mask(view, t, depth - 1) for t in node.input if t)


_ORDERING = {"LessOrEqual", "Less", "GreaterOrEqual", "Greater"}


def _positions_compared(view, node) -> bool:
    """A mask built at run time, as today's transformers exports it for dynamic sequence lengths: key
    positions compared (<=, <) with query positions, both from Range ops. A padding mask compares the
    attention_mask input with Equal/Not, never two position ranges."""

    def from_range(tensor: str, depth: int) -> bool:
        producer = view.producer.get(tensor)
        if producer is None or depth == 0:
            return False
        return producer.op_type == "Range" or any(from_range(t, depth - 1) for t in producer.input if t)

    return node.op_type in _ORDERING and len(node.input) == 2 and all(from_range(t, 6) for t in node.input)


def _attention(view, found: Detected) -> list[dict]:
    blocks = []
    for node in view.nodes:
        if node.op_type in _FUSED_ATTENTION:
            found.roles[node.name] = "attn_context"
            blocks.append(
                {
                    "softmax": node,
                    "fused": True,
                    "q": [],
                    "k": [],
                    "v": [],
                    "o": [],
                    "causal": node.op_type == "GroupQueryAttention" or bool(view.attr(node, "unidirectional", 0)),
                }
            )
            continue
        if node.op_type != "Softmax":
            continue
        scores = _walk(view, node.input[0], _SCORE_PATH, lambda n: _is_act_matmul(view, n), depth=6)
        context = _walk(
            view,
            node.output[0],
            {"Cast", "Dropout", "Where", "Reshape"},
            lambda n: _is_act_matmul(view, n),
            forward=True,
            depth=4,
        )
        if not scores or not context:
            continue
        causal = any(_is_causal_mask(view, t) for n in _score_path(view, node) for t in n.input if t)
        q = _walk(view, scores[0].input[0], _PROJ_PATH, lambda n: _is_weighted_matmul(view, n))
        k = _walk(view, scores[0].input[1], _PROJ_PATH, lambda n: _is_weighted_matmul(view, n))
        v = _walk(view, context[0].input[1], _PROJ_PATH, lambda n: _is_weighted_matmul(view, n))
        o = _walk(view, context[0].output[0], _SHAPE_OPS, lambda n: _is_weighted_matmul(view, n), forward=True, depth=5)
        # the query heads: the softmax's input is [B, H, S, T] also where the score matmul runs per key/value group
        shape = view.shapes.get(node.input[0]) or view.shapes.get(scores[0].output[0]) or ()
        blocks.append(
            {
                "softmax": node,
                "scores": scores[0],
                "context": context[0],
                "q": q,
                "k": k,
                "v": v,
                "o": o,
                "causal": causal,
                "heads": shape[1] if len(shape) == 4 else None,
                "fused": False,
            }
        )
        found.roles[scores[0].name] = "attn_scores"
        found.roles[node.name] = "attn_softmax"
        # The additive (or Where) mask on the score path, and the node that builds the mask: huge
        # negative values that no integer range can hold next to the real scores.
        chain = _chain_outputs(view, scores[0], node)
        for n in _score_path(view, node):
            mask_inputs = [t for t in n.input if t and t not in chain]
            if n.op_type not in ("Add", "Where") or not mask_inputs:
                continue
            found.roles[n.name] = "attn_mask"
            for t in mask_inputs:
                src = view.producer.get(t)
                if (
                    src is not None
                    and src.op_type in ("Where", "Sub", "Mul", "Cast", "Expand")
                    and src.name not in found.roles
                ):
                    found.roles[src.name] = "attn_mask"
        found.roles[context[0].name] = "attn_context"
    for block in blocks:
        qkv = {n.name for n in block["q"]} & {n.name for n in block["k"]} & {n.name for n in block["v"]}
        for role, nodes in (
            ("attn_q", block["q"]),
            ("attn_k", block["k"]),
            ("attn_v", block["v"]),
            ("attn_out", block["o"]),
        ):
            for n in nodes:
                found.roles[n.name] = "attn_qkv" if n.name in qkv else role
    if not blocks:
        found.unmatched.append(
            "attention: no Softmax between two activation×activation MatMuls, and no fused attention op"
        )
    return blocks


def _chain_outputs(view, scores, softmax) -> set[str]:
    """Tensors on the path from the score MatMul to the Softmax (the scores themselves, scaled and masked)."""
    chain, tensor = {scores.output[0]}, scores.output[0]
    for _ in range(6):
        users = [u for u in view.consumers.get(tensor, []) if u.op_type in _SCORE_PATH or u is softmax]
        if not users or users[0] is softmax:
            break
        tensor = users[0].output[0]
        chain.add(tensor)
    return chain


def _score_path(view, softmax) -> list:
    return _walk(view, softmax.input[0], _SCORE_PATH, lambda n: n.op_type in ("Where", "Add", "Trilu"), depth=6)


def _norms(view, found: Detected) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for node in view.nodes:
        if node.op_type in _NORM_OPS:
            found.roles[node.name] = "norm"
            kind = {
                "SimplifiedLayerNormalization": "rmsnorm",
                "SkipSimplifiedLayerNormalization": "rmsnorm",
                "RMSNormalization": "rmsnorm",
                "GroupNormalization": "groupnorm",
                "BatchNormalization": "batchnorm",
                "InstanceNormalization": "instancenorm",
            }.get(node.op_type, "layernorm")
            kinds[kind] = kinds.get(kind, 0) + 1
        elif node.op_type == "ReduceMean":
            square = view.producer.get(node.input[0])
            if square is None or not (
                square.op_type == "Pow" or (square.op_type == "Mul" and square.input[0] == square.input[1])
            ):
                continue
            centered = view.producer.get(square.input[0])
            kind = "layernorm" if centered is not None and centered.op_type == "Sub" else "rmsnorm"
            kinds[kind] = kinds.get(kind, 0) + 1
            chain = [square, node]
            tensor = node.output[0]
            for _ in range(4):  # + eps, sqrt / rsqrt, reciprocal or divide, scale
                users = view.consumers.get(tensor, [])
                if len(users) != 1 or users[0].op_type not in ("Add", "Sqrt", "Reciprocal", "Div", "Mul", "Rsqrt"):
                    break
                chain.append(users[0])
                tensor = users[0].output[0]
            for n in chain:
                found.roles[n.name] = "norm"
    if not kinds:
        found.unmatched.append("norm: no normalization op or decomposed LayerNorm/RMSNorm (ReduceMean of a square)")
    return kinds


def _embeddings(view, found: Detected) -> int:
    vocab = 0
    for node in view.nodes:
        if node.op_type == "Gather":
            table = view.const_array(node.input[0])
            if table is not None and table.ndim == 2 and table.shape[0] > 1 and table.dtype.kind == "f":
                found.roles[node.name] = "embedding"
                vocab = max(vocab, int(table.shape[0]))
    return vocab


def _recurrent_and_timestep(view, found: Detected) -> bool:
    for node in view.nodes:
        if node.op_type in _RECURRENT:
            found.roles[node.name] = "recurrent_cell"
    float_inputs = [
        t for t in view.inputs if view.dtypes.get(t) in (1, 10, 11, 16) and len(view.shapes.get(t) or ()) <= 1
    ]
    timestep = False
    for t in float_inputs:
        trig = _walk(
            view,
            t,
            {"Mul", "Div", "Unsqueeze", "Cast", "Reshape", "Expand", "Concat"},
            lambda n: n.op_type in ("Sin", "Cos"),
            forward=True,
            depth=8,
        )
        for n in trig:
            found.roles[n.name] = "timestep_embedding"
            # the time MLP right after the sinusoids belongs to the embedding (kept float by the rules)
            for m in _walk(
                view,
                n.output[0],
                _SHAPE_OPS | {"Concat", "Mul", "Add"},
                lambda m: view.weight_of(m) is not None,
                forward=True,
                depth=4,
            ):
                found.roles[m.name] = "timestep_embedding"
        timestep = timestep or bool(trig)
    return timestep


def detect(view, hints: dict, costs: dict[str, NodeCost]) -> Detected:
    """`costs`: the analysis's per-node costs by node name (MAC shares and group sizes come from them)."""
    found = Detected()
    blocks = _attention(view, found)
    norm_kinds = _norms(view, found)
    vocab = _embeddings(view, found)
    timestep = _recurrent_and_timestep(view, found)
    causal = any(b["causal"] for b in blocks)
    # past_key_values.0.key, past_key_0, cache_k…: a decoder exported for incremental decoding (a
    # one-token step needs no causal mask, so the cache inputs are its evidence)
    kv_inputs = [
        t
        for t in view.inputs
        if _KV_NAME.search(t) and t in view.consumers and len(view.shapes.get(t) or ()) in (3, 4, 5)
    ]
    order = {n.name: i for i, n in enumerate(view.nodes)}
    weighted = [n for n in view.nodes if view.weight_of(n) is not None]
    recurrent = [n for n in view.nodes if n.op_type in ("LSTM", "GRU", "RNN")]
    macs_conv = sum(costs[n.name].flops for n in weighted if n.op_type.startswith("Conv")) // 2
    macs_recurrent = sum(costs[n.name].flops for n in recurrent) // 2
    macs_all = max(1, sum(costs[n.name].flops for n in [*weighted, *recurrent]) // 2)

    # Heads: the weighted node that feeds a graph output through reshapes, a bias or a scale only.
    def head_path(n) -> bool:  # Slice/Gather: the last position's logits, all a generation graph returns
        return n.op_type in _SHAPE_OPS | {"Slice", "Gather"} or (
            n.op_type in ("Add", "Mul", "Div", "Softcap") and any(view.is_const(t) for t in n.input)
        )

    ends = list(view.outputs)
    for out in view.outputs:  # an output an If/Loop computes comes from its bodies' outputs
        producer = view.producer.get(out)
        ends += view.body_outputs.get(producer.name, []) if producer is not None else []
    for out in ends:
        for n in _walk(
            view,
            out,
            head_path,
            lambda n: view.weight_of(n) is not None and n.op_type in ("MatMul", "Gemm", "Conv"),
            depth=4,
        ):
            if n.name not in found.roles:
                found.roles[n.name] = "lm_head" if blocks and (causal or kv_inputs) else "head"

    # FFN: weighted matmuls fed (through an activation) by other weighted matmuls, inside a transformer.
    # The walk stays inside the MLP: never through a norm or a residual Add (two activation inputs).
    def inside_ffn(m) -> bool:
        if found.roles.get(m.name) == "norm":
            return False
        if m.op_type == "Add":
            return any(view.is_const(t) for t in m.input)
        # Split/Slice: a fused gate/up projection's halves (Phi-3's gate_up_proj, chunked)
        return m.op_type in ACTIVATIONS | {"Mul", "Div", "Pow", "Tanh", "Cast", "Split", "Slice"} | _SHAPE_OPS

    if blocks:
        for n in weighted:
            if n.name in found.roles or n.op_type not in ("MatMul", "Gemm"):
                continue
            feeders = _walk(
                view,
                n.input[0],
                inside_ffn,
                lambda m: _is_weighted_matmul(view, m) and not found.roles.get(m.name, "").startswith("attn"),
                depth=8,
            )
            if feeders:
                found.roles[n.name] = "ffn_out"
                if len(feeders) == 2:  # SwiGLU: the branch through an activation is the gate
                    gated = [
                        f
                        for f in feeders
                        if any(c.op_type in ACTIVATIONS | {"Sigmoid"} for c in view.consumers.get(f.output[0], []))
                    ]
                    for f in feeders:
                        found.roles.setdefault(f.name, "ffn_gate" if gated and f is gated[0] else "ffn_up")
                for f in feeders:
                    found.roles.setdefault(f.name, "ffn_in")
    # Convolutions: first (no weighted node between it and a graph input), depthwise, the rest.
    before_weights = set(view.inputs)
    for n in view.nodes:
        if view.weight_of(n) is None and any(t in before_weights for t in n.input):
            before_weights.update(n.output)
    for n in weighted:
        if not n.op_type.startswith("Conv") or n.name in found.roles:
            continue
        w = view.weight_of(n)
        group = view.attr(n, "group", 1)
        if group > 1 and group == w.shape[0] and w.shape[1] == 1:
            found.roles[n.name] = "depthwise_conv"
        elif n.input[0] in before_weights:
            found.roles[n.name] = "first_conv"
        else:
            found.roles[n.name] = "conv"
    for n in weighted:
        found.roles.setdefault(n.name, "linear")
    # Residual Adds: two activation inputs of the same shape, one of which also feeds another branch.
    for n in view.nodes:
        if (
            n.op_type == "Add"
            and n.name not in found.roles
            and len(n.input) == 2
            and not any(view.is_const(t) for t in n.input)
            and view.shapes.get(n.input[0]) == view.shapes.get(n.input[1])
            and any(len(view.consumers.get(t, [])) > 1 for t in n.input)
        ):
            found.roles[n.name] = "residual"

    found.groups = fusion_groups(view, found, blocks, costs, order)
    found.facts = {
        "attention_blocks": len(blocks),
        "causal": causal,
        "heads": next((b.get("heads") for b in blocks if b.get("heads")), None),
        "norms": norm_kinds,
        "vocab": vocab or None,
        "timestep_input": timestep,
        "depthwise_convs": sum(r == "depthwise_conv" for r in found.roles.values()),
        "recurrent_ops": sum(r == "recurrent_cell" for r in found.roles.values()),
        "conv_mac_share": round(macs_conv / macs_all, 3),
        "recurrent_mac_share": round(macs_recurrent / macs_all, 3),
    }
    found.facts["kv_cache_inputs"] = len(kv_inputs)
    found.families = families(
        found, blocks, causal, timestep, macs_conv / macs_all, hints, macs_recurrent / macs_all, kv_inputs
    )
    return found
