"""Step `prune`, on the torch module before export: structure → prune → recover.

The FP32 teacher (a copy taken before pruning) stays the accuracy reference; the pruned module
becomes the model the export is verified against and the golden outputs come from. Channel counts
are kept a multiple of the target's preferred width at the profile's precision.
"""

from __future__ import annotations

import copy
from typing import Any

from tapeout.core.errors import BadInput
from tapeout.core.host import host_fingerprint
from tapeout.core.inputs import read_inputs, sample_inputs
from tapeout.core.schemas import InputSpec
from tapeout.steps.load import require_torch
from tapeout.steps.setup import Setup
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step

DEFAULT_MULTIPLE = 8
# MiniLM, FFN width −25 %, 150 steps on 64 sentences: lr 1e-3 took mean cosine 0.84 → 0.59; 5e-5 → 0.92
TRANSFORMER_LR, DEFAULT_LR = 5e-5, 1e-3


class Prune(Step):
    name = "prune"
    needs = ("loaded",)
    adds = ("pruning", "teacher")

    def run(self, state: BuildState) -> str | None:
        if state.setup.profile.pruning is None:
            state.pruning = state.teacher = None
            return "the profile has no [pruning]"
        from tapeout.exporters import torch_onnx

        loaded = state.loaded
        loaded.module, state.pruning, teacher = prune_model(state.setup, loaded)
        names = [s.name for s in state.setup.project.inputs]

        def predict(feeds):
            return torch_onnx.torch_outputs(teacher, feeds, names, loaded.output_names)

        state.teacher = predict
        return None

    def report(self, state: BuildState) -> dict[str, object]:
        return {"pruning": state.pruning}


def round_to(setup: Setup) -> int:
    settings = setup.profile.pruning
    if settings.round_to:
        return settings.round_to
    return setup.capabilities.channel_multiple.get(setup.profile.precision, DEFAULT_MULTIPLE)


def batch_layout(inputs: list[InputSpec], token_mask: int | None):
    """Stack recovery inputs where every input leads with the same named batch dim; trim, per input, the axis
    named like the token mask's sequence dim (distill checks both on the teacher before using them)."""
    from tapeout.quantize.distill import Layout

    leading = {spec.shape[0] if spec.shape else None for spec in inputs}
    stack = len(leading) == 1 and isinstance(next(iter(leading)), str)
    shape = inputs[token_mask].shape if token_mask is not None else []
    if len(shape) != 2 or not isinstance(shape[1], str):
        return Layout(stack=stack)
    trim = tuple(
        next((axis for axis, dim in enumerate(spec.shape) if axis > 0 and dim == shape[1]), None) for spec in inputs
    )
    return Layout(stack=stack, trim=trim)


def prune_model(setup: Setup, loaded) -> tuple[Any, dict, Any]:
    """(pruned module, what was done, the FP32 teacher module)."""
    import numpy as np
    import torch

    from tapeout.quantize import distill, prune
    from tapeout.reports.build_sections import pruning_how

    project, settings, ui = setup.project, setup.profile.pruning, setup.ui
    require_torch(project.model.source, loaded)
    names = [s.name for s in project.inputs]

    def args(feeds) -> tuple:
        return tuple(torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in names)

    calibration, source = sample_inputs(project, setup.profile.quantization.calibration_samples)
    tensors = [args(f) for f in calibration]
    if settings.data:  # recovery has its own, larger set; ranking importance stays on the calibration data
        recovery = [args(f) for f in read_inputs(project, settings.data, settings.data_samples, "[pruning] data")]
        source = f"[pruning] data {settings.data}"
    else:
        recovery = tensors
    teacher = copy.deepcopy(loaded.module).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    multiple = round_to(setup)
    mask = next((i for i, n in enumerate(names) if n == "attention_mask"), None)  # real tokens, if marked
    layout = batch_layout(project.inputs, mask)

    def pruned_at(ratio: float, base) -> tuple[Any, dict]:
        step = settings.model_copy(update={"ratio": ratio})
        for p in base.parameters():  # a copy of the frozen teacher: trainable again for pruning and recovery
            p.requires_grad_(True)
        how = pruning_how(settings.what, settings.importance, multiple)
        with ui.step(f"prune {', '.join(settings.what)} by {ratio:.0%} ({how})"):
            module, info = prune.apply(base, tensors[0], step, multiple, tensors, ui.note, mask)
        if step.distill_lr is None:  # pretrained transformers take fine-tuning rates; small CNNs a larger one
            step = step.model_copy(update={"distill_lr": TRANSFORMER_LR if info["transformer"] else DEFAULT_LR})
        with ui.step(
            "recover: "
            + (
                f"project hook {settings.recover}"
                if settings.recover
                else f"distil from the FP32 teacher on {len(recovery)} inputs ({source})"
            )
        ):
            info["recovery"] = distill.recover(module, teacher, recovery, step, project.root, ui.detail, mask, layout)
        for p in module.parameters():
            p.requires_grad_(False)
        return module.eval(), info

    if settings.until == "latency":
        module, info = _latency_search(setup, loaded, teacher, pruned_at, calibration[0])
    else:
        module, info = pruned_at(settings.ratio, loaded.module)
    info["recovery_data"] = source
    ui.note(
        f"pruned: FLOPs −{info['flops_reduction']:.0%} ({info['macs_before']:,.0f} → {info['macs_after']:,.0f} "
        f"MACs), parameters {info['params_before']:,} → {info['params_after']:,}"
    )
    return module, info, teacher


def _latency_search(setup: Setup, loaded, teacher, pruned_at, feeds) -> tuple[Any, dict]:
    """Prune the FP32 teacher at `step`, 2·`step`, … up to `ratio`; after each, export and time it on the target (a
    quick in-process median: for comparing steps, never judged), or, where this host cannot run the target, take
    the calibrated estimate for the profile's device; and evaluate the metric. Stop at the first step whose latency
    meets latency_p50_ms, or before the step that breaks the accuracy budget."""
    import tempfile
    from pathlib import Path

    from tapeout.core.artifact import Artifact
    from tapeout.core.metric import evaluate
    from tapeout.core.verdict import Verdict
    from tapeout.exporters import torch_onnx
    from tapeout.measurement import verdicts
    from tapeout.quantize.sensitivity import quick_latency_ms

    project, profile, target, settings = setup.project, setup.profile, setup.target, setup.profile.pruning
    limit = profile.budgets.latency_p50_ms
    if limit is None:
        raise BadInput(
            '[pruning] until = "latency" needs a latency_p50_ms budget in the profile',
            fix='add [budgets] latency_p50_ms, or prune by ratio (until = "ratio")',
        )
    method = (
        "quick in-process median on the target, FP32 pruned model (the precision step follows)"
        if not setup.emulated
        else _estimate_method(setup)
    )
    names = [s.name for s in project.inputs]
    evaluation = project.evaluation

    def metric(module) -> float | None:
        if evaluation is None:
            return None
        return evaluate(project, lambda f: torch_onnx.torch_outputs(module, f, names, loaded.output_names))

    def latency(module) -> float:
        with tempfile.TemporaryDirectory(prefix="tapeout-prune-") as tmp:
            candidate = copy.copy(loaded)
            candidate.module = module
            path = Path(tmp) / "model.onnx"
            limits = target.limits()  # exported as the build's own export is, with one input to verify on
            options = torch_onnx.ExportOptions.for_project(project, limits.max_opset, limits.max_ir_version, samples=1)
            torch_onnx.export(candidate, project.inputs, project.dims, path, options)
            if setup.emulated:
                return _estimated_ms(setup, path)
            session = target.session(Artifact(profile.target, path.parent, path.name))
            return quick_latency_ms(session.run, feeds)

    reference = metric(teacher)
    steps, chosen = [], None
    base_latency = latency(teacher)
    steps.append({"ratio": 0.0, "latency_ms": base_latency, "metric": reference, "accepted": True})
    ratio = 0.0
    while ratio + settings.step <= settings.ratio + 1e-9:
        ratio = round(ratio + settings.step, 6)
        module, info = pruned_at(ratio, copy.deepcopy(teacher))
        value, ms = metric(module), latency(module)
        ok = True
        if value is not None:
            results = verdicts.judge_accuracy(profile.budgets, reference, value, evaluation.direction, evaluation.name)
            ok = all(r.verdict == Verdict.PASS for r in results)
        steps.append(
            {
                "ratio": ratio,
                "latency_ms": ms,
                "metric": value,
                "macs": info["macs_after"],
                "params": info["params_after"],
                "accepted": ok,
            }
        )
        setup.ui.note(
            f"pruning {ratio:.0%}: {'estimated' if setup.emulated else 'quick'} latency {ms:.3f} ms "
            f"(limit {limit:g} ms)" + (f", {evaluation.name} {value:.4g}" if value is not None else "")
        )
        if not ok:
            break
        chosen = (module, info)
        if ms <= limit:
            break
    if chosen is None:
        raise BadInput(
            f"[pruning] the first step ({settings.step:.0%}) already breaks the accuracy budget",
            fix="lower [pruning] step, recover longer (distill_steps), or relax the accuracy budget",
        )
    module, info = chosen
    last = steps[-1]
    info["search"] = {
        "steps": steps,
        "limit_ms": limit,
        "method": method,
        "estimated": bool(setup.emulated),
        "stopped": (
            "latency budget met"
            if last["accepted"] and last["latency_ms"] <= limit
            else "accuracy budget broken: kept the previous step"
            if not last["accepted"]
            else f"reached the maximum ratio {settings.ratio:.0%} with the latency budget still missed"
        ),
    }
    return module, info


def _estimate_method(setup: Setup) -> str:
    """Where the target cannot be timed here, each step is estimated for the profile's device: only with a
    calibration, since a roofline bound alone is a floor, not a prediction to stop on."""
    from tapeout.estimation.estimate import device_name, find_calibration, why_not_priced

    unpriced = why_not_priced(setup.target.name, setup.device)
    if unpriced:
        raise BadInput(
            f'[pruning] until = "latency": this host cannot time {setup.profile.target} ({setup.emulated}), '
            f"and {unpriced}",
            fix="name the device its target runs on, prune by ratio, or build on the device",
        )
    if setup.device is None:
        raise BadInput(
            f'[pruning] until = "latency": this host cannot time {setup.profile.target} ({setup.emulated}), '
            "and the profile names no device to estimate each step for",
            fix='name the device (device = "...") and calibrate it, prune by ratio, or build on the device',
        )
    device = device_name(setup.device, host_fingerprint())
    found = find_calibration(device, setup.target.name, host_fingerprint(), setup.device)
    if found is None:
        raise BadInput(
            f'[pruning] until = "latency": this host cannot time {setup.profile.target} ({setup.emulated}), '
            f"and there is no calibration for {device} × {setup.target.name} to estimate each step with",
            fix=f"run `tapeout check` on a {device} and `tapeout calibrate` those builds (docs/estimator.md), "
            "or prune by ratio",
        )
    return (
        f"estimated p50 on {device} at the profile's float precision (calibration {found[1]}), FP32 pruned "
        "model before the precision step"
    )


def _estimated_ms(setup: Setup, path) -> float:
    from tapeout.estimation import build_structure, estimate

    est = estimate.for_model(setup, build_structure.model_kernels(path, setup.project.inputs, setup.project.dims), None)
    return est.quantile_ms("p50")[0]
