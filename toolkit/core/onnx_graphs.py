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


PROTOBUF_LIMIT = 1_800_000_000  # bytes; past ~2 GB a ModelProto must keep its weights outside


def save_model(proto, path) -> None:
    """`proto` written to `path` as `onnx.save_model` writes it, without its serialized copy in memory: past the
    protobuf limit the weights go to `<name>.data` beside it (ONNX external data, as before); below it the file
    is the very bytes `SerializeToString` gives, written a weight at a time (serializing a language model whole
    held two more copies of its weights at once, the export's peak memory)."""
    from pathlib import Path

    import onnx

    path = Path(path)
    if serialized_size(proto) > PROTOBUF_LIMIT:
        onnx.save_model(proto, str(path), save_as_external_data=True, location=f"{path.name}.data")
        return
    with path.open("wb") as sink:
        for part in _serialized_parts(proto):
            sink.write(part)


def serialized_size(proto) -> int:
    """About the bytes `proto` serializes to, summed a part at a time: protobuf's own `ByteSize()` of a model
    encodes the whole of it to count, a copy of every weight."""
    graph = proto.graph
    parts = (*graph.initializer, *graph.node, *graph.sparse_initializer, *proto.functions)
    return sum(part.ByteSize() for part in parts) + 1024


def _serialized_parts(proto):
    """`proto.SerializeToString()` in pieces: the fields before the graph, the graph's tag and length, its fields
    before the initializers, each initializer as the graph encodes it, its fields after them, and the model's
    fields after the graph, in field-number order as protobuf writes them."""
    import onnx

    graph_number = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
    init_number = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number

    def part(message, source, keep) -> bytes:
        for field, value in source.ListFields():
            if keep(field.number):
                target = getattr(message, field.name)
                if field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED:
                    target.extend(value)
                elif field.message_type is not None:
                    target.CopyFrom(value)
                else:
                    setattr(message, field.name, value)
        return message.SerializeToString()

    def tagged(number: int, payload_size: int) -> bytes:
        return _varint(number << 3 | 2) + _varint(payload_size)

    yield part(onnx.ModelProto(), proto, lambda n: n < graph_number)
    if proto.HasField("graph"):
        graph = proto.graph
        before = part(onnx.GraphProto(), graph, lambda n: n < init_number)
        after = part(onnx.GraphProto(), graph, lambda n: n > init_number)
        sizes = [init.ByteSize() for init in graph.initializer]
        inits = sum(len(tagged(init_number, s)) + s for s in sizes)
        yield tagged(graph_number, len(before) + inits + len(after))
        yield before
        for init, size in zip(graph.initializer, sizes, strict=True):
            yield tagged(init_number, size)
            yield init.SerializeToString()
        yield after
    yield part(onnx.ModelProto(), proto, lambda n: n > graph_number)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)
