"""Pass `untie-transposed-weight`: a planned MatMul whose weight is a Transpose of a constant gets that weight as
a constant of its own, already transposed, so a weight quantizer can take it.

A decoder with tied embeddings (Llama 3.2, SmolLM, Gemma, GPT-2, samples/llama-40m) exports its LM head as
MatMul(x, Transpose(embedding table)): the table is also the embedding Gather's, and ORT's MatMulNBits quantizer
skips a weight that is not an initializer, leaving the largest matmul of decode in FP32 (a 32 000 × 512 head is
65 MB read per token). The untied copy is what the quantizer then replaces; the table stays for the Gather.

It works on the protobuf, the main graph's nodes, in place: through onnx-ir the whole model would be serialized
again, every weight copied beside the loaded one (2.9 GB more on a 0.5 B decoder).
"""

from __future__ import annotations

import numpy as np

from tapeout.quantize.passes.base import GraphPass


def _transposes_of_initializers(graph) -> dict[str, object]:
    """Transpose nodes of an initializer, by their output's name."""
    initializers = {i.name for i in graph.initializer}
    return {n.output[0]: n for n in graph.node if n.op_type == "Transpose" and n.input and n.input[0] in initializers}


def tied_nodes(model_path, nodes: set[str]) -> list[str]:
    """The planned MatMuls of the model at `model_path` whose weight is a Transpose of an initializer (read without
    the weights): whether a method needs this pass before its quantizer."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    return _tied(graph, set(nodes))


def _tied(graph, nodes: set[str]) -> list[str]:
    transposed = _transposes_of_initializers(graph)
    return [
        n.name
        for n in graph.node
        if n.op_type == "MatMul" and n.name in nodes and len(n.input) == 2 and n.input[1] in transposed
    ]


class UntieTransposedWeight(GraphPass):
    name = "untie-transposed-weight"
    stage = "method"
    works_on = "proto"
    nothing_matched = "no planned MatMul whose weight is a Transpose of a constant"

    def __init__(self, nodes: set[str]):
        self.nodes = set(nodes)  # the planned nodes: only those are given a weight of their own
        self.untied: set[str] = set()

    def match(self, model) -> list[str]:
        return _tied(model.graph, self.nodes)

    def rewrite(self, model, matches: list[str]) -> int:
        from onnx import helper, numpy_helper

        graph, wanted = model.graph, set(matches)
        transposes = _transposes_of_initializers(graph)
        initializers = {i.name: i for i in graph.initializer}
        heads = [n for n in graph.node if n.name in wanted]
        was_read = {n.input[1] for n in heads}
        for node in heads:
            transpose = transposes[node.input[1]]
            table = numpy_helper.to_array(initializers[transpose.input[0]])
            perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), None)
            weight = np.ascontiguousarray(np.transpose(table, perm) if perm else table.T)
            del table
            own = graph.initializer.add()  # written in place: an appended tensor is a second copy of its bytes
            own.name, own.data_type = f"{node.name}.weight", helper.np_dtype_to_tensor_dtype(weight.dtype)
            own.dims.extend(weight.shape)
            raw = weight.tobytes()
            del weight
            own.raw_data = raw
            del raw
            node.input[1] = own.name
            self.untied.add(node.name)
        for output, transpose in transposes.items():  # a head was its only reader: no dead Transpose left behind
            if output in was_read and not _read(graph, output):
                graph.node.remove(transpose)
                for info in [v for v in graph.value_info if v.name == output]:
                    graph.value_info.remove(info)
        return len(heads)

    def postcondition(self, model) -> str | None:
        """Every untied MatMul reads an initializer of its own."""
        graph = model.graph
        initializers = {i.name for i in graph.initializer}
        readers: dict[str, int] = {}
        for n in graph.node:
            for name in n.input:
                readers[name] = readers.get(name, 0) + 1
        wrong = [
            n.name
            for n in graph.node
            if n.name in self.untied and not (n.input[1] in initializers and readers.get(n.input[1]) == 1)
        ]
        return f"still not reading a weight of its own: {', '.join(wrong[:3])}" if wrong else None


def _read(graph, name: str) -> bool:
    """Whether a node of the main graph or of a subgraph, or a graph output, reads `name`."""
    if any(o.name == name for o in graph.output):
        return True
    for node in graph.node:
        if name in node.input:
            return True
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
            if any(_read(g, name) for g in subgraphs):
                return True
    return False
