"""Step `golden`: the golden inputs and the reference outputs the artifact must reproduce. A build computes them
(from the calibration data, else seeded random inputs) and writes golden.npz; a check reads that file back,
verified against the manifest."""

from __future__ import annotations

from tapeout.core.inputs import sample_inputs
from tapeout.records.golden import load_golden, save_golden
from tapeout.records.report import GoldenInfo
from tapeout.steps.state import BuildState, Golden
from tapeout.steps.step import Step


class MakeGolden(Step):
    name = "golden"
    needs_at_build = ("loaded", "exported", "pruning")
    adds = ("golden",)

    def run(self, state: BuildState) -> None:
        if state.opened is not None:
            path = state.opened.golden()
            inputs, outputs = load_golden(path)
            state.golden = Golden(path, inputs, outputs, "golden.npz", "the build's reference outputs")
            return
        project = state.setup.project
        with state.ui.step("golden inputs and reference outputs"):
            inputs, source = state.workload.golden_inputs(state) or sample_inputs(project, project.golden_samples)
            outputs = [state.exported.reference(feeds) for feeds in inputs]
            path = state.out / "golden.npz"
            save_golden(path, inputs, outputs)
        if state.loaded.kind == "torch":
            reference = "the pruned torch module (FP32)" if state.pruning else "torch (FP32)"
        else:
            reference = "the source ONNX model (FP32, ORT CPU)"
        state.golden = Golden(path, inputs, outputs, source, reference)

    def report(self, state: BuildState) -> dict[str, object]:
        g = state.golden
        return {"golden": GoldenInfo(samples=len(g.outputs), source=g.source, reference=g.reference)}
