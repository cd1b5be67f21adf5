"""Step `accuracy`: the project's metric on the artifact (for an emulated target, on the graph it was compiled
from: golden parity covers the rest). A check cannot run it: the metric's data stays on the host, and the
build's verdicts are carried."""

from __future__ import annotations

from tapeout import targets
from tapeout.core.hashing import sha256_file
from tapeout.core.metric import evaluate
from tapeout.records.report import AccuracyInfo
from tapeout.steps.precision import evaluated_on
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


class Accuracy(Step):
    name = "accuracy"
    needs_at_build = ("model", "artifact", "quantization", "reference_metric", "compiled")
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
        # a graph of static shapes is scored through a decode loop; a pipeline that runs nothing else (OpenVINO's NPU,
        # also on this host's CPU) through its own, even where its timings are emulated
        workload = state.workload
        static = workload.scored_by_own_loop(setup.target)
        pipeline = static and workload.scorer(setup.target) is not None
        emulated = setup.emulated and not pipeline
        scored = None if emulated or pipeline else _scored_by_the_loop(state)
        where = evaluated_on(setup) if emulated or pipeline else "at build, on this host"
        if scored is not None:
            state.ui.note(
                f"{project.evaluation.name} on the artifact: the sensitivity loop's evaluation of these same "
                f"files on {setup.target.name} ({scored:.6g}), not repeated"
            )
            state.accuracy = AccuracyInfo(
                metric=project.evaluation.name,
                direction=project.evaluation.direction,
                reference=state.reference_metric,
                artifact=scored,
                where=f"{where} (the sensitivity loop's evaluation of the artifact's own "
                "files, by the same target and options)",
            )
            return None
        with state.ui.step(
            f"evaluate {project.evaluation.name} on the artifact" + (" (CPU EP: emulated target)" if emulated else "")
        ):
            if emulated:  # the metric on the graph the artifact was compiled from; golden parity covers the rest
                metric = ((state.quantization or {}).get("search") or {}).get("metric")  # the loop scored it already
                if metric is None:
                    metric = _metric(project, targets.reference_session(state.model), static)
            else:
                metric = _metric(project, setup.target.session(state.artifact), static)
        state.accuracy = AccuracyInfo(
            metric=project.evaluation.name,
            direction=project.evaluation.direction,
            reference=state.reference_metric,
            artifact=metric,
            where=where,
        )
        return None

    def report(self, state: BuildState) -> dict[str, object]:
        return {"accuracy": state.accuracy}


def _metric(project, session, static: bool) -> float:
    """The project's metric on a session; a cache graph of static shapes (pinned to one decode step, or run only by
    its pipeline) through the session's decode loop, one token at a time (core/decoding.teacher_forced_loop)."""
    if not static:
        return evaluate(project, session.run)
    from tapeout.core.decoding import graph_layout, teacher_forced_loop

    decoder = session.decoder(graph_layout(project.inputs, project.workload))
    return evaluate(project, teacher_forced_loop(decoder), through_cache=False)


def _scored_by_the_loop(state: BuildState) -> float | None:
    """The sensitivity loop's metric of the model it kept, where the artifact is that model's files byte for byte (an
    OpenVINO IR the compile step copies) or the very artifact the loop compiled it into (a torch.export target's):
    the same target with the same options would repeat the same computation. None where it is anything else."""
    metric = ((state.quantization or {}).get("search") or {}).get("metric")
    if metric is None:
        return None
    if state.compiled is not None:  # the compile step took the loop's own compiled artifact of `model`
        return metric
    model = state.model
    files = [model, *([model.with_suffix(".bin")] if model.suffix == ".xml" else [])]
    artifact = state.artifact.directory
    if sorted(p.name for p in artifact.iterdir()) != sorted(f.name for f in files):
        return None
    return metric if all(sha256_file(f) == sha256_file(artifact / f.name) for f in files) else None
