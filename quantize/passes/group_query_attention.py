"""Pass `group-query-attention`: a KV-cache graph's attention, rotary embedding included, as ONNX Runtime's fused
GroupQueryAttention (com.microsoft), for the ONNX Runtime targets that compile a generate workload.

torch's exporter writes a Llama-style layer's attention as some thirty small kernels: the Q/K/V Reshape →
Transpose, the rotary embedding on Q and K (two Slices, a Neg, a Concat, two Muls and an Add each), the cache's
Concat, the grouped score MatMul, scale, mask, Softmax, the context MatMul and the Transpose → Reshape back. ORT's
GroupQueryAttention does all of it in one kernel: it takes the projections' outputs [B, S, heads · D] as they are,
applies the rotary embedding from cos/sin tables [max_context, D / 2], appends to the cache and attends causally
over it. The graph keeps its interface (past_* in, present_* out, no extra inputs): the kernel's sequence lengths
are computed in the graph from the past's length and the ids' length. What it matches, per Softmax:

    Q = Transpose(Reshape(q_proj)) [B, H, S, D] with rotate-half RoPE: Q·cos + Concat(-Q[D/2:], Q[:D/2])·sin
    K likewise from k_proj; present_key = Concat(past_key, K); present_value = Concat(past_value, V)
    context = Softmax(Q Kᵀ · scale + mask) V (optionally grouped, as the `grouped-attention` pass leaves it)
    out = Reshape(Transpose(context)) [B, S, H · D]
    cos, sin = Cos/Sin(Concat(f, f)), f = positions · inv_freq (a constant of D / 2 frequencies)

The kernel masks causally; the graph's own mask is not read, since the generation signature (docs/workloads.md)
makes every cache graph causal; a model that is not would fail the build's parity and greedy agreement. Anything
else (interleaved rotary, scaled cos/sin, a masked_fill Select instead of the additive mask, norms between the
projection and the rotation as in Qwen3, a head size that is not a multiple of 16, which ORT's kernel requires) is
left as it is and the pass says so. The rewritten model is checked against the original by the build like every artifact
(golden parity, the loop's greedy agreement); its own test compares greedy decoding through both.
"""

from __future__ import annotations

import numpy as np

from tapeout.core.onnx_graphs import GraphIndex, attribute_ints, drop_unused, static_dims
from tapeout.quantize.passes.base import NOT_A_CACHE_GRAPH, GraphPass, cache_graph

MS_DOMAIN = "com.microsoft"
_HEADS_FIRST = [0, 2, 1, 3]


def _skip(g: GraphIndex, name: str, op_type: str) -> str:
    node = g.op(name, op_type)
    return node.input[0] if node is not None else name


def _projection(g: GraphIndex, heads_first: str) -> str | None:
    """The [B, S, heads · D] projection output behind Transpose(Reshape(proj, [B, S, heads, D]), [0, 2, 1, 3])."""
    transpose = g.op(heads_first, "Transpose")
    if transpose is None or attribute_ints(transpose, "perm") != _HEADS_FIRST:
        return None
    reshape = g.op(transpose.input[0], "Reshape")
    return reshape.input[0] if reshape is not None else None


def _rotary(g: GraphIndex, rotated: str) -> dict | None:
    """x·cos + Concat(-x[D/2:], x[:D/2])·sin: x, and the cos and sin tensors."""
    add = g.op(rotated, "Add")
    if add is None:
        return None
    muls = [g.op(i, "Mul") for i in add.input]
    if None in muls:
        return None
    for by_cos, by_sin in (muls, muls[::-1]):
        half = next((i for i in by_sin.input if g.op(i, "Concat")), None)
        if half is None:
            continue
        sin = next(i for i in by_sin.input if i != half)
        concat = g.op(half, "Concat")
        neg = g.op(concat.input[0], "Neg") if len(concat.input) == 2 else None
        upper = g.op(neg.input[0], "Slice") if neg is not None else None
        lower = g.op(concat.input[1], "Slice")
        if upper is None or lower is None or upper.input[0] != lower.input[0]:
            continue
        x = upper.input[0]
        if x not in by_cos.input:
            continue
        cos = next(i for i in by_cos.input if i != x)
        return {"x": x, "cos": cos, "sin": sin}
    return None


def _frequencies(g: GraphIndex, cos: str, sin: str) -> np.ndarray | None:
    """The rotary frequencies [D / 2] behind cos = Unsqueeze(Cos(Concat(f, f))), f = positions · inv_freq, and the
    same f behind sin; None for any other form (a scaling after Cos, interleaved halves)."""
    roots = []
    for name, op_type in ((cos, "Cos"), (sin, "Sin")):
        node = g.op(_skip(g, name, "Unsqueeze"), op_type)
        concat = g.op(node.input[0], "Concat") if node is not None else None
        if concat is None or len(concat.input) != 2 or concat.input[0] != concat.input[1]:
            return None
        roots.append(concat.input[0])
    if roots[0] != roots[1]:
        return None
    mul = g.op(roots[0], "Mul")
    if mul is None:
        return None
    found = [g.const(i) for i in mul.input]
    freqs = next((f for f in found if f is not None), None)
    return None if freqs is None else np.asarray(freqs, np.float32).ravel()


def _core(g: GraphIndex, softmax) -> dict | None:
    """Softmax(scores · scale + mask) between the score MatMul (on present_key) and the context MatMul (on
    present_value), grouped or not."""
    add = g.op(softmax.input[0], "Add")
    mul = next((g.op(i, "Mul") for i in add.input if g.op(i, "Mul")), None) if add is not None else None
    if mul is None:
        return None
    scale = next((g.const(i) for i in mul.input if g.const(i) is not None and g.const(i).size == 1), None)
    scores_in = next((i for i in mul.input if g.const(i) is None), None)
    scores = g.op(_skip(g, scores_in, "Reshape"), "MatMul") if scale is not None and scores_in else None
    if scores is None:
        return None
    query = _skip(g, scores.input[0], "Reshape")
    key_t = g.op(scores.input[1], "Transpose")
    present_key = (
        g.op(key_t.input[0], "Concat") if key_t is not None and attribute_ints(key_t, "perm") == [0, 1, 3, 2] else None
    )
    after = g.only_reader(softmax.output[0], "Reshape", "MatMul")
    context = g.only_reader(after.output[0], "MatMul") if after is not None and after.op_type == "Reshape" else after
    if present_key is None or context is None:
        return None
    present_value = g.op(context.input[1], "Concat")
    out = context.output[0]
    ungroup = g.only_reader(out, "Reshape")
    out = ungroup.output[0] if ungroup is not None else out
    back = g.only_reader(out, "Transpose")
    flat = (
        g.only_reader(back.output[0], "Reshape")
        if back is not None and attribute_ints(back, "perm") == _HEADS_FIRST
        else None
    )
    if present_value is None or flat is None:
        return None
    return {
        "scale": float(scale.ravel()[0]),
        "query": query,
        "present_key": present_key,
        "present_value": present_value,
        "output": flat.output[0],
    }


class GroupQueryAttention(GraphPass):
    name = "group-query-attention"
    stage = "target"
    works_on = "proto"
    nothing_matched = (
        "no rotary attention over a KV cache in the exported form (Transpose(Reshape(projection)), "
        "rotate-half RoPE, Concat(past, new), Softmax(QKᵀ·scale + mask)V)"
    )

    def __init__(self, inputs: list, dims: dict[str, int]):
        # a target-stage pass is made from the project's inputs and dims; a generate workload's graph has
        # input_ids and past_* inputs, and dims["past"] = max_context - 1 (exporters/generation.py)
        self.cache_graph = cache_graph(inputs) and "past" in dims
        self.max_context = dims.get("past", 0) + 1  # the cos/sin tables' rows: every position the cache holds

    def match(self, model) -> list[dict]:
        g = GraphIndex(model.graph)
        inputs = {i.name for i in model.graph.input}
        shapes = static_dims(model)
        found = []
        for softmax in [n for n in model.graph.node if n.op_type == "Softmax"]:
            core = _core(g, softmax)
            if core is None:
                continue
            past_key, key = core["present_key"].input
            past_value, value = core["present_value"].input
            q_rot, k_rot = _rotary(g, core["query"]), _rotary(g, key)
            if q_rot is None or k_rot is None or past_key not in inputs or past_value not in inputs:
                continue
            freqs = _frequencies(g, q_rot["cos"], q_rot["sin"])
            if freqs is None or (q_rot["cos"], q_rot["sin"]) != (k_rot["cos"], k_rot["sin"]):
                continue
            q, k, v = (_projection(g, x) for x in (q_rot["x"], k_rot["x"], value))
            if None in (q, k, v):
                continue
            m = {**core, "q": q, "k": k, "v": v, "past_key": past_key, "past_value": past_value, "freqs": freqs}
            m["heads"] = _heads(g, shapes, m)
            if m["heads"] is None:
                continue
            head_size = _features(g, shapes, m["q"]) // m["heads"][0]
            if head_size % 16:  # ORT's CPU kernel refuses the model at load otherwise
                self.nothing_matched = (
                    f"attention matched, but its head size {head_size} is not a multiple of 16, "
                    "which ONNX Runtime's GroupQueryAttention requires"
                )
                continue
            found.append(m)
        return found

    def rewrite(self, model, matches: list[dict]) -> int:
        from onnx import helper, numpy_helper

        graph = model.graph
        ids, past = _input_ids(model), matches[0]["past_key"]
        freqs = matches[0]["freqs"]
        angles = np.arange(self.max_context, dtype=np.float32)[:, None] * freqs[None, :]
        tag = "group_query_attention"
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.cos(angles).astype(np.float32), f"{tag}/cos_cache"),
                numpy_helper.from_array(np.sin(angles).astype(np.float32), f"{tag}/sin_cache"),
                numpy_helper.from_array(np.array([0], np.int64), f"{tag}/axis0"),
                numpy_helper.from_array(np.array([1], np.int64), f"{tag}/axis1"),
                numpy_helper.from_array(np.array([2], np.int64), f"{tag}/axis2"),
                numpy_helper.from_array(np.array([1], np.int32), f"{tag}/one"),
            ]
        )
        # the kernel's lengths, from the inputs: total = past + new; seqlens_k = total - 1 for every row
        lengths = [
            helper.make_node("Shape", [ids], [f"{tag}/ids_shape"]),
            helper.make_node("Shape", [past], [f"{tag}/past_shape"]),
            helper.make_node("Gather", [f"{tag}/ids_shape", f"{tag}/axis0"], [f"{tag}/batch"], axis=0),
            helper.make_node("Gather", [f"{tag}/ids_shape", f"{tag}/axis1"], [f"{tag}/new"], axis=0),
            helper.make_node("Gather", [f"{tag}/past_shape", f"{tag}/axis2"], [f"{tag}/past"], axis=0),
            helper.make_node("Add", [f"{tag}/past", f"{tag}/new"], [f"{tag}/total64"]),
            helper.make_node("Cast", [f"{tag}/total64"], [f"{tag}/total1"], to=6),
            helper.make_node("Sub", [f"{tag}/total1", f"{tag}/one"], [f"{tag}/last"]),
            helper.make_node("Expand", [f"{tag}/last", f"{tag}/batch"], [f"{tag}/seqlens_k"]),
            helper.make_node("Squeeze", [f"{tag}/total1", f"{tag}/axis0"], [f"{tag}/total_sequence_length"]),
        ]
        for node in reversed(lengths):
            graph.node.insert(0, node)
        for i, m in enumerate(matches):
            heads, kv_heads = m["heads"]
            attention = helper.make_node(
                "GroupQueryAttention",
                [
                    m["q"],
                    m["k"],
                    m["v"],
                    m["past_key"],
                    m["past_value"],
                    f"{tag}/seqlens_k",
                    f"{tag}/total_sequence_length",
                    f"{tag}/cos_cache",
                    f"{tag}/sin_cache",
                ],
                [m["output"], m["present_key"].output[0], m["present_value"].output[0]],
                name=f"{tag}/{i}",
                domain=MS_DOMAIN,
                num_heads=heads,
                kv_num_heads=kv_heads,
                scale=m["scale"],
                do_rotary=1,
                rotary_interleaved=0,
            )
            for made in (m["present_key"], m["present_value"]):
                graph.node.remove(made)
            flat = next(n for n in graph.node if m["output"] in n.output)
            at = list(graph.node).index(flat)
            graph.node.remove(flat)
            graph.node.insert(at, attention)
        if not any(o.domain == MS_DOMAIN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
        drop_unused(graph)
        return len(matches)

    def precondition(self, model) -> str | None:
        """Decided from the project alone (the compile step asks before it loads the model)."""
        return None if self.cache_graph else NOT_A_CACHE_GRAPH

    def postcondition(self, model) -> str | None:
        left = sum(1 for n in model.graph.node if n.op_type == "Softmax")
        return f"{left} Softmax left beside the fused attention" if left and self.match(model) else None


def _input_ids(model) -> str | None:
    return next((i.name for i in model.graph.input if i.name == "input_ids"), None)


def _features(g: GraphIndex, shapes: dict, name: str) -> int | None:
    """The last dim of a projection's output: MatMulNBits' N, a MatMul's constant weight's columns, or inferred."""
    node = g.producer.get(name)
    if node is not None and node.op_type == "MatMulNBits":
        return next((a.i for a in node.attribute if a.name == "N"), None)
    if node is not None and node.op_type in ("MatMul", "FusedMatMul"):
        weight = g.const(node.input[1])
        if weight is not None:
            return int(weight.shape[-1])
    shape = shapes.get(name)
    return shape[-1] if shape else None


def _heads(g: GraphIndex, shapes: dict, m: dict) -> tuple[int, int] | None:
    """Query and key/value head counts: the projections' widths over the head size of the past [B, KVH, P, D]."""
    past = shapes.get(m["past_key"])
    q, k = _features(g, shapes, m["q"]), _features(g, shapes, m["k"])
    if not past or not past[1] or not past[3] or not q or not k or q % past[3] or k != past[1] * past[3]:
        return None
    return q // past[3], past[1]
