"""Pass `rms-norm-division`: RMSNorm's x · rsqrt(mean(x²) + eps) written as x / sqrt(mean(x²) + eps).

torch's exporter writes `torch.rsqrt` as Sqrt → Reciprocal, so an RMSNorm (Llama, Qwen, Gemma, tiny-lm) arrives as
Pow → ReduceMean → Add → Sqrt → Reciprocal → Mul(x) → Mul(weight). ONNX Runtime's SimplifiedLayerNormFusion
recognises the norm only with a Div where the Reciprocal and the first Mul are, so every norm ran as six small
kernels: 17 of them in each llama-40m decode step. As a Div the runtime fuses each into one
SimplifiedLayerNormalization; OpenVINO fuses either form. The value is the same to rounding, and the export is
verified against torch after its passes like any export.

    Mul(x, Reciprocal(Sqrt(s)))  ->  Div(x, Sqrt(s))      (where every reader of the Reciprocal is such a Mul)
"""

from __future__ import annotations

from tapeout.quantize.passes.base import GraphPass


class RmsNormDivision(GraphPass):
    name = "rms-norm-division"
    stage = "export"
    works_on = "proto"
    nothing_matched = "no Mul by Reciprocal(Sqrt(...)) (an rsqrt-written norm)"

    def match(self, model) -> list[dict]:
        graph = model.graph
        producer = {o: n for n in graph.node for o in n.output}
        readers: dict[str, list] = {}
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node)
        outputs = {o.name for o in graph.output}
        found = []
        for node in graph.node:
            if node.op_type != "Reciprocal" or node.output[0] in outputs:
                continue
            root = producer.get(node.input[0])
            users = readers.get(node.output[0], [])
            if root is None or root.op_type != "Sqrt" or not users:
                continue
            if all(u.op_type == "Mul" and list(u.input).count(node.output[0]) == 1 for u in users):
                found.append({"reciprocal": node, "sqrt": root, "muls": users})
        return found

    def rewrite(self, model, matches: list[dict]) -> int:
        from onnx import helper

        graph = model.graph
        for m in matches:
            rsqrt = m["reciprocal"].output[0]
            for mul in m["muls"]:
                x = mul.input[1] if mul.input[0] == rsqrt else mul.input[0]
                div = helper.make_node(
                    "Div", [x, m["sqrt"].output[0]], list(mul.output), name=f"{mul.name}/as_division"
                )
                at = list(graph.node).index(mul)
                graph.node.remove(mul)
                graph.node.insert(at, div)
            graph.node.remove(m["reciprocal"])
        return len(matches)

    def postcondition(self, model) -> str | None:
        left = self.match(model)
        return f"{len(left)} Reciprocal(Sqrt) left after the rewrite" if left else None
