"""Step `analyze`: the model's architecture (families, roles, fusion groups), costs and peak activation memory
at the build's shapes, and its kernel structure for the estimator — computed once, saved in the build dir
(structure.json), and read back by check, estimate and calibrate. A generate workload's cache graph is also read
at each phase's shapes (a prompt's prefill, the decode step at the first position timed), so its TTFT and TPOT can
be estimated (estimation/generation.py)."""

from __future__ import annotations

from tapeout.estimation import cost_units
from tapeout.graph.analyze import analyze_view
from tapeout.graph.view import GraphView
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


def hints_of(loaded) -> dict:
    """What the torch side says about the architecture (a Hugging Face config), to back the graph's evidence."""
    config = getattr(getattr(loaded, "module", None), "config", None)
    if config is None:
        return {}
    return {"model_type": getattr(config, "model_type", None), "architectures": getattr(config, "architectures", None)}


class Analyze(Step):
    name = "analyze"
    needs = ("loaded", "fp32_model")
    adds = ("analysis", "kernels", "phases")

    def run(self, state: BuildState) -> None:
        project = state.setup.project
        with state.ui.step("analyze the model (architecture, costs, activation memory)"):
            view = GraphView.load(state.fp32_model, project.inputs, project.dims)
            state.analysis = analyze_view(view, hints=hints_of(state.loaded))
            state.kernels = cost_units.structure(view, state.analysis)  # priced once the precision is planned
            del view  # the weights it holds are not needed again
        state.phases = state.workload.phases(state)

    def report(self, state: BuildState) -> dict[str, object]:
        return {"analysis": state.analysis.to_json()}
