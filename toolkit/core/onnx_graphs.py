"""Walking ONNX graphs, and `GraphIndex`, the lookups a protobuf pass matches with. The control-flow bodies of a graph: the graphs an If, Loop or Scan node holds as
attributes; and the Q/DQ zero points a symmetric-only runtime refuses.

Every walk that must see the whole model (analysis, the Gemm rewrite, postconditions, constant
folding, external-data discovery) goes through these two functions, nested bodies included; a pass that leaves
nodes nothing reads cleans up with `drop_unused`.
"""

from __future__ import annotations


def bodies(node) -> list[tuple[str, object]]:
    """(attribute name, graph) for each body `node` holds: an If's two branches, a Loop's or Scan's body."""
    return [
        (attr.name, graph)
        for attr in node.attribute
        for graph in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)
    ]


def graphs_in(graph):
    """`graph`, then every body in it, nested ones included, outermost first."""
    yield graph
    for node in graph.node:
        for _, body in bodies(node):
            yield from graphs_in(body)


def nonzero_zero_points(model) -> list[str]:
    """Q/DQ nodes (by name, else their zero point) whose constant zero point is not 0: TensorRT takes
    symmetric Q/DQ only."""
    import numpy as np
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    constants = {o: n for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    bad = []
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(node.input) < 3 or not node.input[2]:
            continue
        zp = node.input[2]
        if zp in inits:
            values = numpy_helper.to_array(inits[zp])
        elif zp in constants:
            values = numpy_helper.to_array(constants[zp].attribute[0].t)
        else:
            continue
        if np.any(values.astype(np.float32) != 0):
            bad.append(node.name or zp)
    return bad


def attribute_ints(node, name: str) -> list[int] | None:
    """An ints attribute of `node` (a Transpose's perm, an old Unsqueeze's axes), or None."""
    for attr in node.attribute:
        if attr.name == name:
            return list(attr.ints)
    return None


def static_dims(model) -> dict[str, list[int | None]]:
    """Each value's shape as far as it is static (None for a symbolic dim), from the graph's own value_info,
    inputs and outputs, inferring shapes where the exporter wrote none."""
    import onnx

    graph = model.graph
    infos = [*graph.value_info, *graph.input, *graph.output]
    if not graph.value_info:
        infos += list(onnx.shape_inference.infer_shapes(model).graph.value_info)
    out = {}
    for info in infos:
        shape = info.type.tensor_type.shape
        if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
            out[info.name] = [d.dim_value if d.HasField("dim_value") else None for d in shape.dim]
    return out


def drop_unused(graph) -> None:
    """Remove nodes whose outputs nothing reads (repeatedly), then initializers nothing reads; reads from
    If/Loop/Scan bodies count (a body reads outer-scope tensors by name)."""

    def read() -> set[str]:
        return {t for g in graphs_in(graph) for n in g.node for t in n.input if t} | {o.name for o in graph.output}

    while True:
        used = read()
        dead = [n for n in graph.node if not any(o in used for o in n.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    used = read()
    # deleted in place: clearing the list and extending it with the kept ones copies every weight (twice, where
    # protobuf's arena keeps the old bytes), which set a language model's export's peak memory
    for index in reversed([i for i, init in enumerate(graph.initializer) if init.name not in used]):
        del graph.initializer[index]


class GraphIndex:
    """Lookups over one ONNX graph (protobuf): producers, readers, constants (initializers and Constant nodes)."""

    def __init__(self, graph):
        from onnx import numpy_helper

        self.graph = graph
        self.producer = {o: n for n in graph.node for o in n.output}
        self.readers: dict[str, list] = {}
        for node in graph.node:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
        self.consts = {i.name: i for i in graph.initializer}
        self._array = numpy_helper.to_array
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.consts[node.output[0]] = node.attribute[0].t

    def const(self, name: str):
        tensor = self.consts.get(name)
        return None if tensor is None else self._array(tensor)

    def op(self, name: str, *types: str):
        node = self.producer.get(name)
        return node if node is not None and node.op_type in types else None

    def only_reader(self, name: str, *types: str):
        readers = self.readers.get(name, [])
        return readers[0] if len(readers) == 1 and readers[0].op_type in types else None
