"""Pass `untie-transposed-weight`: a planned MatMul whose weight is a Transpose of a constant gets that weight as
a constant of its own, already transposed, so a weight quantizer can take it.

A decoder with tied embeddings (Llama 3.2, SmolLM, Gemma, GPT-2, samples/llama-40m) exports its LM head as
MatMul(x, Transpose(embedding table)): the table is also the embedding Gather's, and ORT's MatMulNBits quantizer
skips a weight that is not an initializer, leaving the largest matmul of decode in FP32 (a 32 000 × 512 head is
65 MB read per token). The untied copy is what the quantizer then replaces; the table stays for the Gather.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from tapeout.quantize.passes.base import GraphPass


def _transposed_constant(value: ir.Value | None) -> np.ndarray | None:
    """The constant `value` is, when it is Transpose(initializer); else None."""
    producer = value.producer() if value is not None else None
    if producer is None or producer.op_type != "Transpose":
        return None
    source = producer.inputs[0]
    if source is None or source.const_value is None or not source.is_initializer():
        return None
    table = source.const_value.numpy()
    perm = producer.attributes.get_ints("perm", None)
    return np.ascontiguousarray(np.transpose(table, perm) if perm is not None else table.T)


def tied_nodes(model_path, nodes: set[str]) -> list[str]:
    """The planned MatMuls of the model at `model_path` whose weight is a Transpose of an initializer (read without
    the weights): whether a method needs this pass before its quantizer."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    transposed = {
        n.output[0] for n in graph.node if n.op_type == "Transpose" and n.input and n.input[0] in initializers
    }
    return [
        n.name
        for n in graph.node
        if n.op_type == "MatMul" and n.name in nodes and len(n.input) == 2 and n.input[1] in transposed
    ]


class UntieTransposedWeight(GraphPass):
    name = "untie-transposed-weight"
    stage = "method"
    nothing_matched = "no planned MatMul whose weight is a Transpose of a constant"

    def __init__(self, nodes: set[str]):
        self.nodes = set(nodes)  # the planned nodes: only those are given a weight of their own
        self.untied: set[str] = set()

    def match(self, model: ir.Model) -> list[ir.Node]:
        return [
            node
            for node in model.graph.all_nodes()
            if node.op_type == "MatMul"
            and node.name in self.nodes
            and len(node.inputs) == 2
            and _transposed_constant(node.inputs[1]) is not None
        ]

    def rewrite(self, model: ir.Model, matches: list[ir.Node]) -> int:
        for node in matches:
            transpose = node.inputs[1].producer()
            weight = _transposed_constant(node.inputs[1])
            own = ir.Value(
                name=f"{node.name}.weight",
                shape=ir.Shape(weight.shape),
                type=ir.TensorType(ir.DataType.from_numpy(weight.dtype)),
                const_value=ir.tensor(weight, name=f"{node.name}.weight"),
            )
            node.graph.register_initializer(own)
            node.replace_input_with(1, own)
            if not transpose.outputs[0].uses():  # the head was its only reader: no dead Transpose left behind
                transpose.graph.remove(transpose, safe=True)
            self.untied.add(node.name)
        return len(matches)

    def postcondition(self, model: ir.Model) -> str | None:
        """Every untied MatMul reads an initializer of its own."""
        wrong = [
            n.name
            for n in model.graph.all_nodes()
            if n.name in self.untied
            and not (n.inputs[1] is not None and n.inputs[1].is_initializer() and len(n.inputs[1].uses()) == 1)
        ]
        return f"still not reading a weight of its own: {', '.join(wrong[:3])}" if wrong else None
