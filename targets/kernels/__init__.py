"""Fused Triton kernels for what the compilers miss, one module each, found by name. The table is data: listing
kernels imports neither triton nor torch.

Adding a kernel = one module with one `Kernel` subclass (its Triton source, PyTorch reference, cases, tuning space
and the chain it replaces), one entry here, and its tests; `tapeout kernels verify` runs every entry through the
same checks.
"""

from __future__ import annotations

import importlib

from tapeout.core.errors import BadInput, TargetUnavailable

BUILT_IN = {
    "add-layernorm": "tapeout.targets.kernels.add_norm:AddLayerNorm",
    "add-rmsnorm": "tapeout.targets.kernels.add_norm:AddRmsNorm",
    "bias-gelu": "tapeout.targets.kernels.bias_gelu:BiasGelu",
    "silu-mul": "tapeout.targets.kernels.silu_mul:SiluMul",
    "rotary": "tapeout.targets.kernels.rotary:Rotary",
    "attention": "tapeout.targets.kernels.attention:ShortAttention",
    "gemv-int4": "tapeout.targets.kernels.weight_only_gemv:GemvInt4",
    "gemv-int8": "tapeout.targets.kernels.weight_only_gemv:GemvInt8",
}
INSTALL = 'pip install "tapeout[kernels]" (Triton; on a machine without a GPU its interpreter verifies the kernels)'


def names() -> list[str]:
    return list(BUILT_IN)


def probe() -> str | None:
    """Why the kernels cannot run here (no torch or no triton), or None. Found, not imported: whether Triton runs
    in its interpreter is read when it is imported, and the harness decides that after looking for a GPU."""
    import importlib.util

    for module in ("torch", "triton"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    return None


def get(name: str):
    """A fresh instance of the kernel registered as `name`."""
    if name not in BUILT_IN:
        raise BadInput(f"unknown kernel '{name}'", fix=f"use one of: {', '.join(BUILT_IN)}")
    why = probe()
    if why:
        raise TargetUnavailable(f"the kernels need Triton and torch: {why}", fix=INSTALL)
    module, _, attr = BUILT_IN[name].partition(":")
    return getattr(importlib.import_module(module), attr)()
