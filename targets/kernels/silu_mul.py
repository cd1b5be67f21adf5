"""SiLU-gated MLP epilogue, silu(gate) * up (Llama, Qwen, Gemma's MLP): one pass over the two projections'
outputs where the unfused chain writes and re-reads silu(gate)."""

from __future__ import annotations

import triton.language as tl

from tapeout.targets.kernels import elementwise
from tapeout.targets.kernels.base import Match, itemsize, same_shape, torch_dtype


def _silu_mul(gate_ptr, up_ptr, out_ptr, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < width
    gate = tl.load(gate_ptr + row * width + cols, mask=inside, other=0.0)
    g = gate.to(tl.float32)
    up = tl.load(up_ptr + row * width + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * width + cols, (g * tl.sigmoid(g) * up).to(gate.dtype), mask=inside)


class SiluMul(elementwise.Epilogue):
    name = "silu-mul"
    summary = "silu(gate) * up, the SiLU-gated MLP's epilogue"
    replaces = "aten.silu → aten.mul (same shapes)"
    op_schema = "tapeout::silu_mul"
    op_signature = "(Tensor gate, Tensor up, str config) -> Tensor"
    source = _silu_mul

    def inputs(self, case, dtype, generator, device):
        import torch

        t, shape = torch_dtype(dtype), (case["rows"], case["width"])
        return {
            "gate": (3 * torch.randn(shape, generator=generator)).to(device, t),
            "up": torch.randn(shape, generator=generator).to(device, t),
        }

    def outputs(self, case, dtype, inputs, device):
        import torch

        return {"out": torch.empty_like(inputs["gate"])}

    def eager(self, gate, up):
        import torch.nn.functional as F

        return {"out": F.silu(gate) * up}

    def run(self, inputs, outputs, config):
        gate = inputs["gate"]
        width = gate.shape[-1]
        self.launcher(gate)[elementwise.grid(gate.numel() // width, width, config["BLOCK"])](
            gate, inputs["up"], outputs["out"], width, **config.launch()
        )

    def traffic(self, case, dtype):
        elems = case["rows"] * case["width"]
        return 3 * elems * itemsize(dtype), 6.0 * elems

    def call(self, gate, up, config):
        import torch

        out = torch.empty_like(gate)
        self.run({"gate": gate.contiguous(), "up": up.contiguous()}, {"out": out}, self.config_named(config, None))
        return out

    def match(self, node):
        import torch

        aten = torch.ops.aten
        if node.op != "call_function" or node.target != aten.mul.Tensor or len(node.args) != 2:
            return None
        silu, up = node.args
        if getattr(silu, "target", None) != aten.silu.default or len(silu.users) != 1:
            silu, up = up, silu
        if getattr(silu, "target", None) != aten.silu.default or len(silu.users) != 1:
            return None
        vals = [getattr(v, "meta", {}).get("val") for v in (silu, up, node)]
        if (
            any(v is None for v in vals)
            or not same_shape(vals[0].shape, vals[1].shape, vals[2].shape)
            or vals[0].dtype != vals[1].dtype
        ):
            return None
        return Match(
            self.name,
            [silu, node],
            (silu.args[0], up),
            elementwise.case_of(vals[2]),
            str(vals[2].dtype).removeprefix("torch."),
        )
