"""The build's pruning step, on the torch module before export: structure → prune → recover.

The FP32 teacher (a copy taken before pruning) stays the accuracy reference; the pruned module
becomes the model the export is verified against and the golden outputs come from. Channel counts
are kept a multiple of the target's preferred width at the profile's precision.
"""

from __future__ import annotations

import copy
from typing import Any

from tapeout.context import Context
from tapeout.data import sample_inputs
from tapeout.errors import BadInput

DEFAULT_MULTIPLE = 8


def round_to(ctx: Context) -> int:
    settings = ctx.profile.pruning
    if settings.round_to:
        return settings.round_to
    return ctx.capabilities.channel_multiple.get(ctx.profile.precision, DEFAULT_MULTIPLE)


def run(ctx: Context, loaded) -> tuple[Any, dict, Any]:
    """(pruned module, what was done, the FP32 teacher module)."""
    import numpy as np
    import torch

    from tapeout.quantize import distill, prune

    project, settings, ui = ctx.project, ctx.profile.pruning, ctx.ui
    if loaded.kind != "torch":
        raise BadInput(f"[pruning] needs a torch model, and [model] source = \"{project.model.source}\" is ONNX",
                       fix="point [model] source at the torch module (file.py:callable, a Hugging Face directory "
                           "or a .pt2), or remove [pruning] from the profile")
    names = [s.name for s in project.inputs]

    def args(feeds) -> tuple:
        return tuple(torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in names)

    calibration, source = sample_inputs(project, ctx.profile.quantization.calibration_samples)
    module = loaded.module
    teacher = copy.deepcopy(module).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    multiple = round_to(ctx)
    with ui.step(f"prune {', '.join(settings.what)} by {settings.ratio:.0%} ({settings.importance} importance, "
                 f"channels a multiple of {multiple})"):
        module, info = prune.apply(module, args(calibration[0]), settings, multiple,
                                   [args(f) for f in calibration], ui.note)
    with ui.step("recover: " + (f"project hook {settings.recover}" if settings.recover else
                                f"distil from the FP32 teacher on {len(calibration)} calibration inputs ({source})")):
        info["recovery"] = distill.recover(module, teacher, [args(f) for f in calibration], settings, project.root,
                                           ui.detail)
    for p in module.parameters():
        p.requires_grad_(False)
    module.eval()
    info["recovery_data"] = source
    ui.note(f"pruned: FLOPs −{info['flops_reduction']:.0%} ({info['macs_before']:,.0f} → {info['macs_after']:,.0f} "
            f"MACs), parameters {info['params_before']:,} → {info['params_after']:,}")
    return module, info, teacher
