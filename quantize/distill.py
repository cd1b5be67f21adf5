"""Recovery after pruning: the project's own hook, or a short built-in knowledge distillation.

The built-in one trains the pruned student to match the FP32 teacher's outputs on the calibration
inputs (mean squared error per output, scaled by the teacher's variance so outputs of any scale weigh
alike), with Adam, for a number of steps or a wall-time cap, whichever comes first. It needs no
labels, so every sample recovers out of the box on a CPU. 2:4 masks are re-applied after each step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tapeout.errors import user_code
from tapeout.quantize.prune import _tensors, reapply_masks
from tapeout.types import PruningSettings


def _loss(outs, targets, scales, mask):
    """Variance-scaled MSE per output; where `mask` (batch × tokens, 1 = real token) fits an output's leading dims,
    padding positions are left out (they carry no meaning and would dominate a padded batch)."""
    import torch

    total = 0.0
    for o, t, s in zip(outs, targets, scales, strict=True):
        err = (o.float() - t) ** 2
        if mask is not None and err.dim() >= 2 and tuple(err.shape[:2]) == tuple(mask.shape):
            weight = mask.to(err.dtype).reshape(*mask.shape, *([1] * (err.dim() - 2))).expand_as(err)
            total = total + (err * weight).sum() / weight.sum().clamp_min(1.0) / s
        else:
            total = total + torch.mean(err) / s
    return total


def distill(student, teacher, inputs: list[tuple], settings: PruningSettings, progress: Callable[[str], None],
            token_mask: int | None = None) -> dict:
    """`token_mask`: the index of an input that marks real tokens (an attention mask), if the model has one."""
    import torch

    if settings.distill_steps == 0 or not inputs:
        return {"method": "none", "steps": 0, "why": "distill_steps = 0" if inputs else "no calibration inputs"}
    with torch.no_grad():
        targets = [[t.detach().float() for t in _tensors(teacher(*args))] for args in inputs]
    masks = [args[token_mask] if token_mask is not None else None for args in inputs]
    scales = [[max(float(t.var()), 1e-8) for t in outs] for outs in targets]
    params = [p for p in student.parameters() if p.requires_grad]
    lr = settings.distill_lr or 1e-3  # the build step fills it in per family (toolkit/pruning.py)
    optimizer = torch.optim.Adam(params, lr=lr)
    student.eval()  # dropout off: the teacher's outputs are deterministic, so are the student's
    start, last, losses, step = time.perf_counter(), 0.0, [], 0
    for step in range(1, settings.distill_steps + 1):
        i = (step - 1) % len(inputs)
        optimizer.zero_grad()
        outs = _tensors(student(*inputs[i]))
        loss = _loss(outs, targets[i], scales[i], masks[i])
        loss.backward()
        optimizer.step()
        reapply_masks(student)
        losses.append(float(loss.detach()))
        now = time.perf_counter()
        if now - last > 1.0:
            last = now
            progress(f"distillation step {step}/{settings.distill_steps}, loss {losses[-1]:.4g}")
        if now - start > settings.distill_max_s:
            break
    window = max(1, len(inputs))
    return {"method": "built-in distillation (MSE to the FP32 teacher's outputs, variance-scaled"
                      + (", padding tokens left out)" if token_mask is not None else ")"), "steps": step,
            "seconds": time.perf_counter() - start, "lr": lr, "samples": len(inputs),
            "loss_first": sum(losses[:window]) / len(losses[:window]),
            "loss_last": sum(losses[-window:]) / len(losses[-window:]),
            "stopped": "time cap" if step < settings.distill_steps else "steps done"}


def recover(student, teacher, inputs: list[tuple], settings: PruningSettings, root, progress,
            token_mask: int | None = None) -> dict:
    """The project's hook when [pruning] recover names one, else the built-in distillation."""
    if settings.recover is None:
        return distill(student, teacher, inputs, settings, progress, token_mask)
    from tapeout.exporters.sources import resolve_callable

    hook = resolve_callable(settings.recover, root, "[pruning] recover")
    start = time.perf_counter()
    with user_code(f"[pruning] recover {settings.recover}", root):
        hook(student, teacher, inputs)
    reapply_masks(student)
    return {"method": f"project hook {settings.recover}", "seconds": time.perf_counter() - start}
