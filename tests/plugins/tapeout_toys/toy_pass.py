"""Pass `toy-relu-as-max`: every Relu as Max(x, 0), on the onnx-ir model of a torch export; registered from outside
tapeout. Its precondition — a convolutional model — does not hold on an MLP, and the report says so."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.convenience import replace_nodes_and_values

from tapeout.quantize.passes.base import GraphPass


class ReluAsMax(GraphPass):
    name = "toy-relu-as-max"
    stage = "export"
    nothing_matched = "no Relu in the model"

    def precondition(self, model: ir.Model) -> str | None:
        if not any(node.op_type == "Conv" for node in model.graph):
            return "no Conv in the model: only convolutional nets are rewritten"
        return None

    def match(self, model: ir.Model) -> list:
        return [node for node in model.graph if node.op_type == "Relu"]

    def rewrite(self, model: ir.Model, matches: list) -> int:
        for node in matches:
            zero = ir.Value(name=f"{node.name}_zero", const_value=ir.tensor(np.array(0, np.float32)))
            model.graph.register_initializer(zero)
            relu_max = ir.node("Max", [node.inputs[0], zero], name=f"{node.name}_as_max")
            replace_nodes_and_values(model.graph, node, [node], [relu_max], node.outputs, relu_max.outputs)
        return len(matches)

    def postcondition(self, model: ir.Model) -> str | None:
        left = [n.name for n in model.graph if n.op_type == "Relu"]
        return f"Relu left: {', '.join(left[:3])}" if left else None
