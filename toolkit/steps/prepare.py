"""Step `prepare`: the target's rewrite of the FP32 model before quantization and compile (an NPU pins its
shapes); the model everything after starts from."""

from __future__ import annotations

from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


class Prepare(Step):
    name = "prepare"
    needs = ("exported",)
    adds = ("fp32_model",)

    def run(self, state: BuildState) -> None:
        project = state.setup.project
        state.fp32_model = state.setup.target.prepare(state.exported.path, project.inputs, project.dims)
