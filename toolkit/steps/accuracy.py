"""Step `accuracy`: the project's metric on the artifact (for an emulated target, on the graph it was compiled
from: golden parity covers the rest). A check cannot run it: the metric's data stays on the host, and the
build's verdicts are carried."""

from __future__ import annotations

from tapeout import targets
from tapeout.core.metric import evaluate
from tapeout.records.report import AccuracyInfo
from tapeout.steps.precision import evaluated_on
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


class Accuracy(Step):
    name = "accuracy"
    needs_at_build = ("model", "artifact", "quantization", "reference_metric")
    adds = ("accuracy",)

    def run(self, state: BuildState) -> str | None:
        setup = state.setup
        if state.opened is not None:
            state.accuracy = None
            return "the metric's data stays on the host: the build's accuracy verdicts are carried"
        project = setup.project
        if project.evaluation is None:
            state.accuracy = None
            return "the project has no [evaluation] metric"
        emulated = setup.emulated
        with state.ui.step(f"evaluate {project.evaluation.name} on the artifact"
                           + (" (CPU EP: emulated target)" if emulated else "")):
            if emulated:  # the metric on the graph the artifact was compiled from; golden parity covers the rest
                metric = ((state.quantization or {}).get("search") or {}).get("metric")  # the loop scored it already
                if metric is None:
                    metric = evaluate(project, targets.reference_session(state.model).run)
            else:
                metric = evaluate(project, setup.target.session(state.artifact).run)
        state.accuracy = AccuracyInfo(metric=project.evaluation.name, direction=project.evaluation.direction,
                                      reference=state.reference_metric, artifact=metric,
                                      where=evaluated_on(setup) if emulated else "at build, on this host")
        return None

    def report(self, state: BuildState) -> dict[str, object]:
        return {"accuracy": state.accuracy}
