"""Step `golden`: the golden inputs and the reference outputs the artifact must reproduce. A build computes them
(from the calibration data, else seeded random inputs) and writes golden.npz; a check reads that file back,
verified against the manifest."""

from __future__ import annotations

from tapeout.core.inputs import sample_inputs
from tapeout.records.golden import load_golden, save_golden
from tapeout.records.report import GoldenInfo
from tapeout.steps.state import BuildState, Golden
from tapeout.steps.step import Step


def decode_steps(state: BuildState):
    """A generate workload's golden inputs: one decode step each at the maximum context, its cache filled by the
    torch decoder from a prompt (the project's prompts where they are long enough, else seeded random tokens)."""
    from tapeout.core.decoding import graph_layout
    from tapeout.core.errors import BadInput
    from tapeout.exporters import generation

    project = state.setup.project
    layout = graph_layout(project.inputs, project.workload)
    try:
        sequences, source = generation.prompt_tokens(project, layout, project.golden_samples, layout.max_context)
    except BadInput:
        if project.workload.prompts is None:
            raise
        state.ui.note(
            f"[workload] prompts has fewer than {project.golden_samples} sequences of max_context "
            f"({layout.max_context}) tokens: the golden decode steps start from random tokens"
        )
        project = project.model_copy(update={"workload": project.workload.model_copy(update={"prompts": None})})
        sequences, source = generation.prompt_tokens(project, layout, project.golden_samples, layout.max_context)
    feeds = generation.decode_feeds(
        generation.torch_step(state.loaded.module, layout), layout, sequences, project.workload.batch
    )
    return feeds, f"one decode step at position {layout.max_context - 1} after {source}"


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
            if project.workload.kind == "generate":
                inputs, source = decode_steps(state)
            else:
                inputs, source = sample_inputs(project, project.golden_samples)
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
