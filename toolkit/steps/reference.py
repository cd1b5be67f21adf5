"""Step `reference`: the project's metric on the FP32 reference (the unpruned teacher where the model was
pruned), and on the pruned FP32 model: the most any precision can reach."""

from __future__ import annotations

from tapeout.core.metric import evaluate
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


class Reference(Step):
    name = "reference"
    needs = ("exported", "teacher", "pruning")
    adds = ("reference_metric",)

    def run(self, state: BuildState) -> str | None:
        project, profile = state.setup.project, state.setup.profile
        if project.evaluation is None:
            state.reference_metric = None
            return "the project has no [evaluation] metric"
        with state.ui.step(f"evaluate {project.evaluation.name} on the FP32 reference"):
            state.reference_metric = evaluate(project, state.teacher or state.exported.reference)
        if state.pruning is not None and profile.precision != "fp32":  # at fp32 the artifact's own evaluation says it
            with state.ui.step(f"evaluate {project.evaluation.name} on the pruned FP32 model"):
                state.pruning["metric_fp32"] = evaluate(project, state.exported.reference)
        return None
