"""Bias + GELU on a Linear layer's output (the transformer MLP's first epilogue): one read and one write of the
activation where the unfused chain reads it twice. The Linear itself stays with cuBLAS or Inductor's GEMM."""

from __future__ import annotations

import triton.language as tl

from tapeout.targets.kernels import elementwise
from tapeout.targets.kernels.base import Match, itemsize, torch_dtype


def _bias_gelu(y_ptr, bias_ptr, out_ptr, width, TANH: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < width
    y = tl.load(y_ptr + row * width + cols, mask=inside, other=0.0)
    h = y.to(tl.float32) + tl.load(bias_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    if TANH:
        # 0.5·h·(1 + tanh z) = h·sigmoid(2z): no tanh in every Triton backend's math library
        g = h * tl.sigmoid(1.5957691216057308 * (h + 0.044715 * h * h * h))
    else:
        g = 0.5 * h * (1 + tl.math.erf(h * 0.7071067811865476))
    tl.store(out_ptr + row * width + cols, g.to(y.dtype), mask=inside)


class BiasGelu(elementwise.Epilogue):
    name = "bias-gelu"
    summary = "bias add + GELU (erf or tanh) on a Linear layer's output"
    replaces = "aten.linear (with bias) → aten.gelu: the Linear without its bias, then this kernel"
    op_schema = "tapeout::bias_gelu"
    op_signature = "(Tensor y, Tensor bias, str approximate, str config) -> Tensor"
    source = _bias_gelu

    def inputs(self, case, dtype, generator, device):
        import torch

        t = torch_dtype(dtype)
        return {
            "y": (2 * torch.randn(case["rows"], case["width"], generator=generator)).to(device, t),
            "bias": torch.randn(case["width"], generator=generator).to(device, t),
            "approximate": "none" if case["rows"] % 2 else "tanh",
        }

    def outputs(self, case, dtype, inputs, device):
        import torch

        return {"out": torch.empty_like(inputs["y"])}

    def eager(self, y, bias, approximate):
        import torch.nn.functional as F

        return {"out": F.gelu(y + bias, approximate=approximate)}

    def run(self, inputs, outputs, config):
        y = inputs["y"]
        width = y.shape[-1]
        self.launcher(y)[elementwise.grid(y.numel() // width, width, config["BLOCK"])](
            y, inputs["bias"], outputs["out"], width, TANH=inputs["approximate"] == "tanh", **config.launch()
        )

    def traffic(self, case, dtype):
        elems = case["rows"] * case["width"]
        return (2 * elems + case["width"]) * itemsize(dtype), 10.0 * elems

    def call(self, y, bias, approximate, config):
        import torch

        out = torch.empty_like(y)
        self.run(
            {"y": y.contiguous(), "bias": bias, "approximate": approximate},
            {"out": out},
            self.config_named(config, None),
        )
        return out

    def rewrite(self, graph, match, op):
        import torch

        linear, gelu = match.nodes
        with graph.inserting_before(gelu):
            bare = graph.call_function(torch.ops.aten.linear.default, tuple(linear.args[:2]))
            new = graph.call_function(op, (bare, *match.args))
        bare.meta["val"] = linear.meta["val"]
        new.meta["val"] = gelu.meta["val"]
        gelu.replace_all_uses_with(new)
        return [(gelu, new)]

    def match(self, node):
        import torch

        aten = torch.ops.aten
        if node.op != "call_function" or node.target != aten.gelu.default:
            return None
        linear = node.args[0]
        if not (
            getattr(linear, "target", None) == aten.linear.default
            and len(linear.args) == 3
            and linear.args[2] is not None
            and len(linear.users) == 1
        ):
            return None
        val = linear.meta.get("val")
        if val is None:
            return None
        return Match(
            self.name,
            [linear, node],
            (linear.args[2], node.kwargs.get("approximate", "none")),
            elementwise.case_of(val),
            str(val.dtype).removeprefix("torch."),
        )
