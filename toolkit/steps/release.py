"""Step `release`: the torch module let go once every step that runs it has (export, the reference metric, the golden
outputs, the workload's record): the rest of the build works from the FP32 ONNX model, and its peaks (quantization,
compilation, the measuring processes) no longer stack on the module's weights, 2 GB for a 0.5 B decoder."""

from __future__ import annotations

from tapeout.steps.state import BuildState
from tapeout.steps.step import Step, collect_all


class Release(Step):
    name = "release"
    needs = ("loaded",)

    def run(self, state: BuildState) -> str | None:
        at = state.flow.index(self) if self in state.flow else len(state.flow)
        later = [s.name for s in state.flow[at + 1 :] if "loaded" in (*s.needs, *s.needs_at_build)]
        if later:
            raise RuntimeError(f"internal: the torch module is released before {later}, which run it")
        if state.loaded.module is None:
            return "the model is an ONNX file: no torch module is held"
        state.loaded.module = None
        collect_all()  # an HF model can sit in reference cycles, and the runner's frozen heap would keep them
        return None
