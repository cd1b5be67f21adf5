"""Step `precision`: rule table → first plan → quantize → sensitivity loop, on the host.

Candidates are evaluated with the project's metric (or the workload's own accuracy, core/workload.SearchMetric,
where the project has none) on the target's own runtime, so the accuracy the
loop sees is the accuracy the artifact has; an emulated target's candidates run on the FP32
reference runtime (ORT CPU) with the same graph. The rule set and the precision ladder are the
target's capabilities.
"""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from tapeout import targets
from tapeout.core import workload as workloads
from tapeout.core.artifact import Artifact
from tapeout.core.errors import BadInput
from tapeout.core.hashing import sha256_file
from tapeout.core.heap import collect_and_return
from tapeout.core.inputs import sample_inputs
from tapeout.core.metric import evaluate
from tapeout.core.verdict import Verdict
from tapeout.core.workload import SearchMetric
from tapeout.graph.analysis import Analysis
from tapeout.measurement import verdicts
from tapeout.steps.setup import Setup
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


class Precision(Step):
    name = "precision"
    needs = ("fp32_model", "analysis", "reference_metric", "pruning", "exported")  # exported: its program
    adds = ("quantization", "model", "compiled", "companions")

    def run(self, state: BuildState) -> str | None:
        state.compiled = None
        companions = state.workload.companions(state)
        state.companions = {c.name: c.path for c in companions}
        if state.setup.profile.precision == "fp32":
            state.quantization, state.model = None, state.fp32_model
            return "fp32: nothing to quantize"
        quantized_companions = {}
        for companion in companions:  # first: a workload's own accuracy runs the main graph beside them
            path, info = quantize_companion(state.setup, state.out, companion)
            state.companions[companion.name] = path
            quantized_companions[companion.name] = info
        ceiling = (state.pruning or {}).get("metric_fp32")
        if state.setup.capabilities.compiles_from != "torch.export":
            state.model, state.quantization = quantize(
                state.setup,
                state.out,
                state.fp32_model,
                state.analysis,
                state.reference_metric,
                ceiling,
                own_metric=lambda call_of: state.workload.search_metric(state, call_of),
            )
        else:  # quantized on the program (PT2E), not on the ONNX: saved where the method reads it
            from tapeout.exporters.torch_onnx import save_program

            source = state.out / "quantized" / "fp32.pt2"
            source.parent.mkdir(parents=True, exist_ok=True)
            save_program(state.exported.program, source)
            with ProgramCandidates(state) as compiled:
                state.model, state.quantization = quantize(
                    state.setup, state.out, source, state.analysis, state.reference_metric, ceiling, compiled=compiled
                )
                state.compiled = compiled.keep(state.model)
        state.passes += state.quantization.pop("passes")  # the report lists them with the export's
        if companions:
            state.quantization["companions"] = quantized_companions
        return None

    def report(self, state: BuildState) -> dict[str, object]:
        return {"quantization": state.quantization}


class ProgramCandidates:
    """Candidate programs (.pt2) of a target that compiles from torch.export, compiled by that target so the loop's
    metric is the artifact's: a PT2E model runs nowhere until it is lowered. The compiled candidates live in a
    scratch folder of the build dir, removed when the step ends."""

    def __init__(self, state: BuildState):
        self.state, self.scratch = state, state.out / "quantized" / ".compiled"
        self.compiled: dict[str, Artifact] = {}  # by the program's sha256: the model kept is asked for again
        self.engine_programs: dict[Path, str] = {}  # a device-compiled candidate's folder -> its program's sha256

    def __enter__(self) -> ProgramCandidates:
        self.scratch.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *_exc) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)

    def keep(self, path: Path) -> Artifact | None:
        """The artifact compiled from the program at `path`, moved out of the scratch folder for the compile step
        (compiling a program is the slow part: an ExecuTorch lowering, an Inductor build); None if none was."""
        done = self.compiled.get(sha256_file(path))
        if done is None:
            return None
        kept = self.scratch.parent / ".kept"
        shutil.rmtree(kept, ignore_errors=True)
        shutil.move(done.directory, kept)
        self._keep_engine(done)
        return replace(done, directory=kept)

    def _keep_engine(self, done: Artifact) -> None:
        """A device-compiled candidate's engine (compiled to score it) goes where the build's engine step looks, so
        the kept program is not compiled twice; the other candidates' engines go with the scratch folder."""
        from tapeout.targets.engine_cache import ENGINES_DIR, read_record

        engines, digest = self.scratch / ENGINES_DIR, self.engine_programs.get(done.directory)
        if digest is None or not engines.is_dir():
            return
        target = self.state.out / ENGINES_DIR
        for record_path in engines.glob("*.json"):
            record = read_record(record_path)
            if record and record["key"].get("program_sha256") == digest:
                target.mkdir(parents=True, exist_ok=True)
                for path in engines.glob(f"{record_path.stem}.*"):
                    shutil.move(path, target / path.name)

    def __call__(self, path: Path) -> Artifact:
        from tapeout.core import pt2

        digest = sha256_file(path)
        if digest not in self.compiled:
            setup = self.state.setup
            artifact = setup.target.compile_program(
                pt2.load(path),
                self.scratch / str(len(self.compiled)),
                setup.project.inputs,
                setup.project.dims,
                self.state.exported.info["output_names"],
            )
            if setup.capabilities.compile_on == "device":  # the device is here (a deferred build is fp32 only)
                setup.target.build_engine(artifact, self.state.ui.detail)
                self.engine_programs[artifact.directory] = sha256_file(artifact.path)
            self.compiled[digest] = artifact
        return self.compiled[digest]


def quantize(
    setup: Setup,
    out_dir: Path,
    fp32_path: Path,
    analysis: Analysis,
    reference_metric: float | None,
    float_metric: float | None = None,
    compiled: Callable[[Path], Artifact] | None = None,
    own_metric: Callable[[Callable[[Path], Any]], SearchMetric | None] | None = None,
) -> tuple[Path, dict]:
    """`float_metric`: the metric of the FP32 model being quantized where it differs from the reference (a pruned
    model): when it already misses the accuracy budget, no precision can meet it, and the loop is not run.
    `compiled`: how a candidate becomes the target's artifact, where the model quantized is not what the target
    runs (a torch.export program); None: the target runs the quantized model itself. `own_metric`: the workload's
    own accuracy for the loop (core/workload.SearchMetric) given how a candidate becomes a call, used where the
    project has no [evaluation] metric."""
    from tapeout.quantize import methods, rules, sensitivity
    from tapeout.quantize.apply import apply_with_fallback
    from tapeout.quantize.carried import carried_state

    project, profile, target, ui, emulated = setup.project, setup.profile, setup.target, setup.ui, setup.emulated
    settings = profile.quantization
    plan = rules.first_plan(
        analysis, profile.target, setup.capabilities, profile.precision, settings, isa=rules.isa_for(setup.device)
    )
    calibration = None
    workload = workloads.of(project)
    carried_out = workload.carried_outputs(project)
    if carried_out and fp32_path.suffix == ".onnx":  # what one call hands the next keeps a state's precision
        state = carried_state(fp32_path, workload.carried_inputs(project), carried_out)
        plan = methods.get(plan.method).carry(plan, state)
    workload.check_quantization(plan.method, methods.get(plan.method).needs_calibration(plan))
    if project.calibration is not None:
        calibration, _ = sample_inputs(project, settings.calibration_samples)
    elif methods.get(plan.method).needs_calibration(plan):
        raise BadInput(
            f"{plan.method} quantization of this {plan.family} model needs calibration data, and "
            f"{project.file} has no [calibration] section",
            fix='add [calibration] data = "….npz" (or module:callable) with real inputs',
        )
    # Ranking and latency probes: real inputs when the project has them (already loaded), else seeded random.
    probe_inputs = (
        calibration[: settings.rank_samples] if calibration else sample_inputs(project, settings.rank_samples)[0]
    )
    out = out_dir / "quantized" / f"model{plan.model_suffix}"
    max_ir = target.limits().max_ir_version

    # a static-shape decode pipeline runs no single call of the cache graph: candidates are scored where one runs
    scorer = workload.scorer(target)

    def session(path: Path):
        if scorer is not None:
            return scorer.session(Artifact(profile.target, path.parent, path.name)).run
        if emulated:  # same QDQ graph, integer semantics on the CPU EP: the emulator is ~25-400× slower
            return targets.reference_session(path).run
        if compiled is not None:
            return target.session(compiled(path)).run
        return target.session(Artifact(profile.target, path.parent, path.name)).run

    def vet(path: Path) -> None:
        """An accelerator compiles the first plan (lint: what it would not take, and why) before any time goes
        into ranking and evaluating it: a plan the compiler refuses fails here, naming the node."""
        if not setup.capabilities.accelerator or compiled is not None:  # a program is vetted by compiling it
            return
        errors = [i for i in target.lint(path, project.inputs, project.dims) if i.severity == "error"]
        if errors:
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            where = f"node {errors[0].node}: " if errors[0].node else ""
            raise BadInput(
                f"the {plan.method} plan's model does not compile for {profile.target}: "
                f"{where}{errors[0].problem}{more}",
                fix=f"{errors[0].fix}; or keep the node's group float with [quantization] keep_float",
            )

    budgets = profile.budgets
    has_budget = budgets.accuracy_max_drop is not None or budgets.accuracy_max_rel_drop is not None
    info: dict = {"precision": profile.precision, "evaluated_on": evaluated_on(setup)}
    searched = None
    if project.evaluation is None and own_metric is not None:
        searched = own_metric(session)
    elif project.evaluation is not None and has_budget and reference_metric is not None:
        evaluation = project.evaluation

        def judge(metric: float) -> tuple[float, bool]:  # the very verdict the build will give the artifact
            results = verdicts.judge_accuracy(budgets, reference_metric, metric, evaluation.direction, evaluation.name)
            return results[0].measured, all(r.verdict == Verdict.PASS for r in results)

        searched = SearchMetric(evaluation.name, lambda predict: evaluate(project, predict), judge, "")
    if searched is None:
        with ui.step(f"quantize ({plan.method}, {len(plan.quantized())} of {len(plan.groups)} groups)"):
            plan, info["apply"] = apply_with_fallback(plan, fp32_path, out, calibration, max_ir, ui.note)
            vet(out)
        applied = info["apply"]
        info["search"] = {
            "steps": [],
            "ranking": [],
            "evaluations": 0,
            "stopped": "no sensitivity loop: the project has no [evaluation] metric or the profile no "
            "accuracy budget; parity with FP32 is the only accuracy evidence",
        }
    else:
        beyond_reach = float_metric is not None and not searched.judge(float_metric)[1]
        with ui.step(
            f"quantize ({plan.method}, {len(plan.quantized())} of {len(plan.groups)} groups) and evaluate "
            f"{searched.name}{searched.how}"
        ):
            candidates = sensitivity.Candidates(
                session=session,
                evaluate=searched.evaluate,
                judge=searched.judge,
                calibration=calibration,
                rank_samples=probe_inputs,
                latency_feeds=probe_inputs[0],
                max_ir_version=max_ir,
                vet=vet,
                log=ui.detail,
                macs={g.name: g.macs for g in analysis.groups},
                carried=workload.carried_outputs(project),
            )
            limits = sensitivity.Limits(
                max_evaluations=settings.max_evaluations,
                enabled=settings.sensitivity and not beyond_reach,
                latency_limit_ms=None if emulated else budgets.latency_p50_ms,
                max_ranked_groups=settings.max_ranked_groups,
                max_seconds=settings.max_search_s,
            )
            search = sensitivity.search(plan, fp32_path, out, candidates, limits)
        if beyond_reach and not search.steps[-1].meets_accuracy:
            # moving groups to float would only give up speed: the float model itself misses the budget
            search.stopped = (
                f"accuracy budget missed, and the loop was not run: the pruned FP32 model already "
                f"misses it ({searched.name} {float_metric:.6g}, reference {reference_metric:.6g}), "
                "so no precision can meet it; recover the pruning's loss or prune less"
            )
        plan = search.plan
        applied = search.applied
        info["search"] = search.to_json()
        if search.unranked:
            ui.note(
                f"sensitivity: ranked {len(search.ranking)} of {len(search.ranking) + len(search.unranked)} groups "
                f"({search.unranked[0]['skipped']}); the unranked follow the ranked, largest by MACs first"
            )
        ui.note(f"sensitivity: {search.stopped}")
    info["fallbacks"] = applied.pop("fallbacks", [])  # the quantizer failed on a group: it moved up, the build went on
    for move in info["fallbacks"]:
        ui.note(f"{move['group']} moved {move['from']} → {move['to']}: {move['why']}")
    info["passes"] = applied.pop("passes", [])  # listed with the other steps' passes
    plan = methods.get(plan.method).reconcile(plan, out)
    notes = []
    other_groups = applied.get("group_sizes") or {}
    if other_groups:
        listed = ", ".join(f"{node} ({size})" for node, size in list(other_groups.items())[:6])
        notes.append(
            f"{len(other_groups)} INT4 layer(s) grouped by another size than {plan.block_size}, which does not "
            f"divide their input channels: {listed}{' …' if len(other_groups) > 6 else ''}"
        )
        ui.note(notes[-1])
    note = _speed_note(
        profile.precision,
        emulated,
        info,
        lambda: _compare_latency(lambda: session(fp32_path), lambda: session(out), probe_inputs[0]),
    )
    if note:
        notes.append(note)
        if not emulated:
            ui.note(note)
    if notes:
        info["notes"] = notes
    weights = out.with_suffix(".bin")  # OpenVINO IR keeps its weights beside the .xml
    info.update(
        plan=plan.to_json(),
        model_sha256=sha256_file(out),
        fp32_bytes=fp32_path.stat().st_size,
        quantized_bytes=out.stat().st_size + (weights.stat().st_size if out.suffix == ".xml" else 0),
    )
    return out, info


def quantize_companion(setup: Setup, out_dir: Path, companion) -> tuple[Path, dict]:
    """A companion graph (core/workload.Companion) at the profile's precision: the rule table's first plan for its own
    architecture, applied as is (the sensitivity loop judges the main graph; the loop's accuracy, measured through
    both, judges the pair), its INT4 groups at the ladder's next rung. A plan that needs calibration keeps the
    companion FP32, and the record says why."""
    from tapeout.graph.analyze import analyze_view
    from tapeout.graph.view import GraphView
    from tapeout.quantize import methods, rules
    from tapeout.quantize.apply import apply_with_fallback

    profile, ui = setup.profile, setup.ui
    with ui.step(f"quantize the {companion.name} graph (the first plan of its own architecture)"):
        view = GraphView.load(companion.path, companion.inputs, companion.dims)
        analysis = analyze_view(view)
        del view
        plan = rules.first_plan(
            analysis,
            profile.target,
            setup.capabilities,
            profile.precision,
            profile.quantization,
            isa=rules.isa_for(setup.device),
        )
        if profile.precision == "int4":
            # 4-bit weights pay in the decoder's memory-bound steps; an encoder's one compute-bound call keeps 8
            for group in plan.quantized():
                rung = plan.next_rung(group.group)
                if rung is not None and rung != plan.ladder[-1]:
                    plan = plan.with_group(group.group, rung, f"{companion.name}: 8-bit weights in an INT4 build")
        if methods.get(plan.method).needs_calibration(plan):
            why = f"{plan.method} calibrates activations, and nothing samples the {companion.name}'s: kept FP32"
            ui.note(f"{companion.name}: {why}")
            return companion.path, {"method": None, "family": analysis.family, "kept_float": why}
        out = out_dir / "quantized" / companion.name / f"model{plan.model_suffix}"
        plan, applied = apply_with_fallback(
            plan, companion.path, out, None, setup.target.limits().max_ir_version, ui.note
        )
    plan = methods.get(plan.method).reconcile(plan, out)
    return out, {
        "method": plan.method,
        "family": analysis.family,
        "groups": len(plan.groups),
        "quantized_groups": len(plan.quantized()),
        "rungs": {
            rung: sum(g.precision == rung for g in plan.groups)
            for rung in dict.fromkeys(g.precision for g in plan.groups)
        },
        "fallbacks": applied.get("fallbacks", []),
        "model_sha256": sha256_file(out),
    }


def _speed_note(precision: str, emulated: str | None, info: dict, compare) -> str:
    """Does quantization pay on this host? Say so when it does not (never on an emulator's timings)."""
    if emulated:
        return f"no speed comparison with fp32: {emulated}"
    fp32_ms, quant_ms = compare()
    info["quick_latency_ms"] = {"fp32": fp32_ms, "quantized": quant_ms}
    if quant_ms < fp32_ms:
        return ""
    return (
        f"{precision} is not faster than fp32 for this model on this host ({quant_ms:.3g} ms vs {fp32_ms:.3g} ms, "
        'quick in-process medians): quantization does not pay here; consider precision = "fp32"'
    )


def _compare_latency(fp32, quantized, feeds: dict, rounds: int = 5) -> tuple[float, float]:
    """Median quick latency of each model, one model loaded in the runtime at a time (`fp32`, `quantized`: what opens
    each): two open at once hold both models' weights and the runtime's prepacked copies (several GB at 0.5 B)."""
    from tapeout.quantize.sensitivity import quick_latency_ms

    collect_and_return()  # the quantizer's models (in reference cycles) go before the runtime holds the FP32 weights
    medians = []
    for opened in (fp32, quantized):
        run = opened()
        medians.append(statistics.median(quick_latency_ms(run, feeds) for _ in range(rounds)))
        del run
    return medians[0], medians[1]


def evaluated_on(setup: Setup) -> str:
    model = "model" if setup.profile.precision == "fp32" else "quantized model"
    if workloads.of(setup.project).scorer(setup.target) is not None:
        return (
            f"{setup.target.name}'s own decode loop for the artifact; the sensitivity loop's candidates on OpenVINO "
            "CPU (the same IR, dynamic shapes): the static-shape pipeline runs no single call of the cache graph"
        )
    if setup.deferred:
        return (
            f"ONNX Runtime CPU EP running the {model} the {setup.target.name} engine is compiled from (no "
            "engine on this host); the engine's numerics are checked by golden parity at `tapeout check`"
        )
    if setup.emulated:
        return (
            f"ONNX Runtime CPU EP running the {model} the {setup.target.name} artifact is compiled from "
            f"({setup.emulated}; too slow for the metric); the device's numerics are checked by golden parity"
        )
    return f"{setup.target.name}, on this host"
