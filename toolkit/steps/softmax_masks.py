"""Step `softmax masks`: each Softmax kernel's masked share, from one FP32 run on the first golden input, kept in its
shape (`masked`) so that the kernel predictors price a masked attention as the device runs it
(`estimation/softmax_masks.py`); a generate build's other phases (each prompt's prefill, the first decode step) one
run each at their own shapes. A check reads the shares with the build's kernels."""

from __future__ import annotations

import dataclasses

from tapeout.core.decoding import graph_layout
from tapeout.estimation import softmax_masks
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


class SoftmaxMasks(Step):
    name = "softmax masks"
    needs = ("kernels", "phases", "golden")
    needs_at_build = ("fp32_model",)
    adds = ("kernels", "phases")

    def run(self, state: BuildState) -> str | None:
        if state.opened is not None:
            return "the build's kernels keep their Softmax masks"
        if state.kernels is None or not any(k.cls == "reduce" for k in state.kernels) or not state.golden.inputs:
            return "no Softmax to read a mask of"
        with state.ui.step("the share of each Softmax's input its mask holds (one FP32 run on a golden input)"):
            percents = softmax_masks.measured(state.fp32_model, state.golden.inputs[0])
            analysed, state.kernels = state.kernels, softmax_masks.with_masks(state.kernels, percents)
        if state.phases:  # a generate build's decode step at max_context is its own kernels (the golden input's call)
            state.phases = [dataclasses.replace(p, kernels=state.kernels) if p.kernels is analysed else p
                            for p in state.phases]
            if percents:  # (none where the model has no Softmax, or could not be run on its golden input)
                project = state.setup.project
                with state.ui.step("the same at each phase of the generation loop (one FP32 run at its shapes)"):
                    layout = graph_layout(project.inputs, project.workload)
                    state.phases = softmax_masks.masked_phases(state.fp32_model, state.phases, layout, state.kernels)
        if percents is None:
            return "the FP32 model could not be run on its golden input: its Softmaxes are priced as unmasked"
        return None if percents else "no Softmax to read a mask of"
