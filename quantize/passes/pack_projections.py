"""Pass `pack-projections`: the quantized projections that read one activation (a layer's Q, K and V; its MLP's
gate and up) as one matrix multiply, for the ONNX Runtime CPU target's KV-cache graphs.

Decoding multiplies one row at a time, so each projection is a matrix-vector product whose cost is the weight it
reads plus a fixed price per kernel: ONNX Runtime quantizes the activation, dispatches to its threads and joins
them once per node. A Llama-style layer pays that seven times; packed, four (Q/K/V, O, gate/up, down). Measured
on samples/llama-40m's shapes, 2 threads: a packed 512 → 1024 dynamic INT8 product takes 7 µs where the three it
replaces take 11, and a 512 → 3072 one 15 µs where two 512 → 1536 take 22 (docs/workloads.md has the model-level
figures).

Packing is exact: every quantized form here keeps its scales and zero points per output column (a per-tensor
scale is repeated across its columns), so the packed product computes each column as its own projection did.
What it packs, when every member reads the same activation and shares the packing key:

    MatMulNBits(x, B, scales[, zp])     same K, bits, block size,      packed along N (B's rows, the
                                        accuracy level                  scales' and zero points' rows)
    MatMulInteger(DynamicQuantizeLinear(x), Wq, x_zp, w_zp) → Cast → Mul(·, x_scale · w_scale)
                                        (ONNX Runtime's dynamic INT8)   packed along N, w_zp and w_scale
                                                                        per column

FP32 MatMuls are left as exported: their time is the weights they read, which packing does not change, and on
llama-40m (old and new builds alternated in fresh processes, four rounds) packing them made decode 0–13 % faster
at 2 threads but up to 7 % slower at 1, and prefill 2–3 % slower (the Split's copy).

Three that feed a GroupQueryAttention's query, key and value, in that order, become its packed QKV input (the
kernel splits it by its head counts); any other group is followed by a Split back into the members' outputs, so
nothing downstream changes. A projection with a g_idx, or one whose partial results something else reads, is
left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tapeout.core.onnx_graphs import GraphIndex, drop_unused
from tapeout.quantize.passes.base import NOT_A_CACHE_GRAPH, GraphPass, cache_graph

MS_DOMAIN = "com.microsoft"
_FLOAT = 1  # TensorProto.FLOAT


@dataclass
class _Projection:
    """One projection: what it reads, what it writes, the nodes that are it, and what siblings must share."""

    kind: str
    source: str  # the activation (for the dynamic chain, its quantized form: siblings share the quantizer)
    output: str
    nodes: list
    key: tuple
    width: int  # N, the output features
    weights: dict = field(default_factory=dict)  # the arrays packing concatenates, by role


def _attr(node, name: str, default=None):
    from onnx import helper

    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


def _input(node, i: int) -> str:
    return node.input[i] if len(node.input) > i else ""


def _nbits(g: GraphIndex, node) -> _Projection | None:
    if node.domain != MS_DOMAIN or _input(node, 4):  # a g_idx reorders K per projection: not packed
        return None
    parts = {"B": _input(node, 1), "scales": _input(node, 2), "zero_points": _input(node, 3), "bias": _input(node, 5)}
    arrays = {role: g.const(name) for role, name in parts.items() if name}
    if any(a is None for a in arrays.values()):
        return None
    shape_of = tuple((role, arrays[role].ndim, str(arrays[role].dtype)) for role in sorted(arrays))
    key = (
        "nbits",
        _attr(node, "K"),
        _attr(node, "bits", 4),
        _attr(node, "block_size"),
        _attr(node, "accuracy_level", 0),
        shape_of,
    )
    return _Projection("nbits", node.input[0], node.output[0], [node], key, int(_attr(node, "N")), arrays)


def _dynamic(g: GraphIndex, node) -> _Projection | None:
    """MatMulInteger(DynamicQuantizeLinear(x), Wq, x_zp, w_zp) → Cast(float) → Mul(·, Mul(x_scale, w_scale))."""
    quantizer = g.op(node.input[0], "DynamicQuantizeLinear")
    weight = g.const(node.input[1])
    if quantizer is None or weight is None or weight.ndim != 2 or _input(node, 2) != quantizer.output[2]:
        return None
    zero = g.const(_input(node, 3)) if _input(node, 3) else np.zeros((), weight.dtype)
    cast = g.only_reader(node.output[0], "Cast")
    if zero is None or cast is None or _attr(cast, "to") != _FLOAT:
        return None
    rescale = g.only_reader(cast.output[0], "Mul")
    scales = g.op(next((i for i in rescale.input if i != cast.output[0]), ""), "Mul") if rescale is not None else None
    if (
        scales is None
        or g.only_reader(scales.output[0], "Mul") is not rescale
        or quantizer.output[1] not in scales.input
    ):
        return None
    w_scale = g.const(next((i for i in scales.input if i != quantizer.output[1]), ""))
    if w_scale is None:
        return None
    width = weight.shape[1]
    column = {
        "w_zp": np.broadcast_to(zero.reshape(-1), (width,)) if zero.size == 1 else zero.reshape(-1),
        "w_scale": np.broadcast_to(w_scale.reshape(-1), (width,)) if w_scale.size == 1 else w_scale.reshape(-1),
    }
    if column["w_zp"].shape != (width,) or column["w_scale"].shape != (width,):
        return None
    return _Projection(
        "dynamic",
        node.input[0],
        rescale.output[0],
        [node, cast, scales, rescale],
        ("dynamic", str(weight.dtype), weight.shape[0], str(w_scale.dtype)),
        width,
        {"W": weight, **column, "quantizer": quantizer},
    )


_READERS = {"MatMulNBits": _nbits, "MatMulInteger": _dynamic}


def projections(g: GraphIndex) -> list[_Projection]:
    """Every projection of the graph in one of the packable forms, in graph order."""
    found = []
    for node in g.graph.node:
        reader = _READERS.get(node.op_type)
        made = reader(g, node) if reader is not None and len(node.input) >= 2 else None
        if made is not None:
            found.append(made)
    return found


def _groups(g: GraphIndex) -> list[tuple[list[_Projection], object]]:
    """(members, attention) for each packable group: the attention whose Q, K, V the three members are, or None
    for a group unpacked again by a Split."""
    by_source: dict[tuple, list[_Projection]] = {}
    for projection in projections(g):
        by_source.setdefault((projection.source, projection.key), []).append(projection)
    found = []
    for members in by_source.values():
        if len(members) < 2:
            continue
        by_output = {m.output: m for m in members}
        for attention in g.graph.node:
            if attention.op_type != "GroupQueryAttention" or len(attention.input) < 3:
                continue
            qkv = [by_output.get(name) for name in attention.input[:3]]
            if None not in qkv and all(g.readers.get(m.output) == [attention] for m in qkv):
                found.append((qkv, attention))
                members = [m for m in members if m not in qkv]
        if len(members) >= 2:
            found.append((members, None))
    return found


class PackProjections(GraphPass):
    name = "pack-projections"
    stage = "target"
    works_on = "proto"
    nothing_matched = (
        "no two quantized projections (MatMulNBits, dynamic INT8) of one activation with the same form "
        "(FP32 MatMuls are left as exported)"
    )

    def __init__(self, inputs: list, dims: dict[str, int]):
        # decided from the project, like group-query-attention: only a generate workload's cache graph, whose
        # one-row decode pays the per-kernel price this saves (exporters/generation.py's signature)
        self.cache_graph = cache_graph(inputs)
        self.packed: dict[str, int] = {}  # packed output -> the width it must have

    def precondition(self, model) -> str | None:
        return None if self.cache_graph else NOT_A_CACHE_GRAPH

    def match(self, model) -> list:
        return _groups(GraphIndex(model.graph))

    def rewrite(self, model, matches: list) -> int:
        graph = model.graph
        for i, (members, attention) in enumerate(matches):
            tag = f"pack_projections/{i}"
            packed = f"{tag}/output"
            initializers, nodes = _packed(members, packed, tag)
            if attention is not None:
                attention.input[0], attention.input[1], attention.input[2] = packed, "", ""
            else:
                nodes.append(_split(model, members, packed, tag))
            # where the first member was: its inputs are computed by then, and every reader comes after
            at = min(list(graph.node).index(n) for m in members for n in m.nodes)
            for m in members:
                for node in m.nodes:
                    graph.node.remove(node)
            for j, node in enumerate(nodes):
                graph.node.insert(at + j, node)
            graph.initializer.extend(initializers)
            self.packed[packed] = sum(m.width for m in members)
        drop_unused(graph)
        return len(matches)

    def postcondition(self, model) -> str | None:
        """Each packed product is there, in a form this pass reads, as wide as its members together. (Not "no
        group left": where attention and MLP read one activation, as in Phi-2, the packed QKV and the MLP's
        first projection are siblings again, and are left so.)"""
        widths = {p.output: p.width for p in projections(GraphIndex(model.graph))}
        wrong = [name for name, width in self.packed.items() if widths.get(name) != width]
        if wrong:
            return f"packed projection {wrong[0]} is {widths.get(wrong[0])} wide, its members {self.packed[wrong[0]]}"
        return None


def _packed(members: list[_Projection], output: str, tag: str) -> tuple[list, list]:
    """(initializers, nodes) of the one product that computes every member's columns, writing `output`."""
    from onnx import helper, numpy_helper

    first = members[0]
    node = first.nodes[0]

    def joined(role: str, axis: int, name: str):
        return numpy_helper.from_array(
            np.ascontiguousarray(np.concatenate([m.weights[role] for m in members], axis)), f"{tag}/{name}"
        )

    if first.kind == "nbits":
        inits = {role: joined(role, 0, role) for role in first.weights}
        inputs = [
            first.source,
            inits["B"].name,
            inits["scales"].name,
            inits["zero_points"].name if "zero_points" in inits else "",
            "",
            inits["bias"].name if "bias" in inits else "",
        ]
        while inputs[-1] == "":
            inputs.pop()
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs["N"] = sum(m.width for m in members)
        made = helper.make_node("MatMulNBits", inputs, [output], name=f"{tag}/MatMulNBits", domain=MS_DOMAIN, **attrs)
        return list(inits.values()), [made]
    quantizer = first.weights["quantizer"]
    weight, zero, scale = joined("W", 1, "weight"), joined("w_zp", 0, "w_zero_point"), joined("w_scale", 0, "w_scale")
    integer = helper.make_node(
        "MatMulInteger",
        [first.source, weight.name, quantizer.output[2], zero.name],
        [f"{tag}/integer"],
        name=f"{tag}/MatMulInteger",
    )
    cast = helper.make_node("Cast", [f"{tag}/integer"], [f"{tag}/float"], name=f"{tag}/Cast", to=_FLOAT)
    scales = helper.make_node("Mul", [quantizer.output[1], scale.name], [f"{tag}/scales"], name=f"{tag}/scales")
    rescale = helper.make_node("Mul", [f"{tag}/float", f"{tag}/scales"], [output], name=f"{tag}/rescale")
    return [weight, zero, scale], [integer, cast, scales, rescale]


def _split(model, members: list[_Projection], packed: str, tag: str):
    """The Split of the packed output back into the members' outputs (sizes as an input from opset 13, an
    attribute before)."""
    from onnx import helper, numpy_helper

    sizes = [m.width for m in members]
    outputs = [m.output for m in members]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset >= 13:
        model.graph.initializer.append(numpy_helper.from_array(np.array(sizes, np.int64), f"{tag}/sizes"))
        return helper.make_node("Split", [packed, f"{tag}/sizes"], outputs, name=f"{tag}/Split", axis=-1)
    return helper.make_node("Split", [packed], outputs, name=f"{tag}/Split", axis=-1, split=sizes)
