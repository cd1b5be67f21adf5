"""Pass `gemm-as-matmul`: the planned Gemm nodes as MatMul (+ Add), for the quantizers that take MatMul only.

ORT's dynamic quantizer has no Gemm: it splits one into MatMul + Add under new names and then skips them as
not planned, leaving FP32; MatMulNBits replaces MatMul only. Rewritten first, the MatMul keeps the planned
name. A Gemm is rewritten where A is not transposed and B (and C, when beta is not 1) is a constant of its
own: B is transposed and scaled by alpha in place, C by beta; what cannot be rewritten stays Gemm, and the
quantizer's postcondition names it.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.convenience import replace_nodes_and_values

from tapeout.quantize.passes.base import GraphPass


def _own_constant(value: ir.Value | None) -> bool:
    return value is not None and value.const_value is not None and value.is_initializer() and len(value.uses()) == 1


class GemmAsMatMul(GraphPass):
    name = "gemm-as-matmul"
    stage = "method"
    nothing_matched = "no planned Gemm with a constant weight of its own and A untransposed"

    def __init__(self, nodes: set[str]):
        self.nodes = set(nodes)  # the planned nodes: only those are rewritten
        self.rewritten: set[str] = set()

    def precondition(self, model: ir.Model) -> str | None:
        if not any(n.op_type == "Gemm" and n.name in self.nodes for n in model.graph.all_nodes()):
            return "the plan quantizes no Gemm node"
        return None

    def match(self, model: ir.Model) -> list[ir.Node]:
        found = []
        for node in model.graph.all_nodes():
            if node.op_type != "Gemm" or node.name not in self.nodes or node.attributes.get_int("transA", 0):
                continue
            b = node.inputs[1] if len(node.inputs) > 1 else None
            c = node.inputs[2] if len(node.inputs) > 2 else None
            if _own_constant(b) and (c is None or node.attributes.get_float("beta", 1.0) == 1.0 or _own_constant(c)):
                found.append(node)
        return found

    def rewrite(self, model: ir.Model, matches: list[ir.Node]) -> int:
        self.rewritten = {node.name for node in matches}
        for node in matches:
            a, b = node.inputs[0], node.inputs[1]
            c = node.inputs[2] if len(node.inputs) > 2 else None
            alpha, beta = node.attributes.get_float("alpha", 1.0), node.attributes.get_float("beta", 1.0)
            weight = b.const_value.numpy()
            weight = (weight.T if node.attributes.get_int("transB", 0) else weight) * weight.dtype.type(alpha)
            b.const_value = ir.tensor(np.ascontiguousarray(weight), name=b.name)
            b.shape = ir.Shape(weight.shape)  # also where old IR versions list the initializer as a graph input
            if c is not None and beta != 1.0:
                bias = c.const_value.numpy()
                c.const_value = ir.tensor(bias * bias.dtype.type(beta), name=c.name)
            out = node.outputs[0]
            matmul = ir.node("MatMul", [a, b], name=node.name)
            new = [matmul]
            if c is not None:
                new.append(ir.node("Add", [matmul.outputs[0], c], name=f"{node.name}_bias"))
                matmul.outputs[0].name = f"{out.name}_matmul"
            replace_nodes_and_values(node.graph, node, [node], new, [out], [new[-1].outputs[0]])
        return len(matches)

    def postcondition(self, model: ir.Model) -> str | None:
        """Every rewritten Gemm is a MatMul under its own name (the name the plan and the quantizer use)."""
        kinds = {n.name: n.op_type for n in model.graph.all_nodes() if n.name in self.rewritten}
        wrong = sorted(name for name in self.rewritten if kinds.get(name) != "MatMul")
        return f"not a MatMul named as its Gemm after the rewrite: {', '.join(wrong[:3])}" if wrong else None
