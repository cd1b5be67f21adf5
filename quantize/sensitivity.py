"""The sensitivity loop: evaluate the plan; while the accuracy budget is missed, move the fusion group
that introduces the most error one rung up the target's ladder, re-evaluate, repeat.

Ranking (research quant-prune §6.3, isolation variant): each quantized group is quantized *alone*
and the model's outputs on a few calibration samples are compared with FP32; the relative error
(‖y − y_fp32‖² / ‖y_fp32‖²) is the error that group introduces. One quantization and a few runs per
group; the full metric is spent only on the plans the loop actually tries.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tapeout.quantize.apply import QuantizerFailed, apply, apply_with_fallback
from tapeout.quantize.plan import Plan

Predict = Callable[[dict], dict]
# The accuracy budget as the build will judge it: metric -> (drop in the budget's units, met?).
Judge = Callable[[float], tuple[float, bool]]


@dataclass
class Candidates:
    """How the loop makes and scores a candidate plan: the target's session on a model file, the project's
    metric and the budget's judgement, the data quantizers calibrate and rank on, the compile check of the first
    plan (`vet`), and where progress goes."""

    session: Callable[[Path], Predict]
    evaluate: Callable[[Predict], float]
    judge: Judge
    calibration: list[dict] | None
    rank_samples: list[dict]
    latency_feeds: dict
    max_ir_version: int | None = None
    vet: Callable[[Path], None] | None = None
    log: Callable[[str], None] = print
    macs: dict[str, int] = field(default_factory=dict)
    # outputs the model hands its next call (a stream's state): their error compounds call after call, so the
    # groups on their path rank first
    carried: tuple[str, ...] = ()


@dataclass(frozen=True)
class Limits:
    """What the loop may spend, and where it must stop."""

    max_evaluations: int
    enabled: bool = True  # [quantization] sensitivity
    latency_limit_ms: float | None = None  # a step that breaks it is not kept (quick, in-process estimate)
    max_ranked_groups: int = 10**6
    max_seconds: float = float("inf")


@dataclass(frozen=True)
class Step:
    index: int
    action: str  # "initial plan", or "<group>: int8 → fp32"
    group: str | None
    precision: str | None
    metric: float
    drop: float  # in the budget's units (absolute, or a share of the reference)
    latency_ms: float  # quick in-process median: for comparing steps, never judged
    meets_accuracy: bool


@dataclass
class Search:
    plan: Plan
    steps: list[Step] = field(default_factory=list)
    ranking: list[dict] = field(default_factory=list)
    unranked: list[dict] = field(default_factory=list)  # groups ranking skipped, and why
    stopped: str = ""
    evaluations: int = 0
    metric: float | None = None  # the metric of the plan the loop kept (the model at out_path)
    applied: dict = field(default_factory=dict)  # what the method did for the plan kept

    def to_json(self) -> dict:
        return {
            "steps": [asdict(s) for s in self.steps],
            "ranking": self.ranking,
            "unranked": self.unranked,
            "stopped": self.stopped,
            "evaluations": self.evaluations,
            "metric": self.metric,
        }


def quick_latency_ms(predict: Predict, feeds: dict, runs: int = 15) -> float:
    for _ in range(3):
        predict(feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        predict(feeds)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _files_of(path: Path) -> list[Path]:
    """A model's files: the .onnx, or OpenVINO IR's .xml and its .bin of weights."""
    return [path, path.with_suffix(".bin")] if path.suffix == ".xml" else [path]


def move_model(source: Path, target: Path) -> None:
    for src, dst in zip(_files_of(source), _files_of(target), strict=True):
        src.replace(dst)


def remove_model(path: Path) -> None:
    for file in _files_of(path):
        file.unlink(missing_ok=True)


def rank_groups(
    plan: Plan,
    fp32_path: Path,
    work: Path,
    candidates: Candidates,
    max_groups: int = 10**6,
    deadline: float = float("inf"),
) -> tuple[list[dict], list[dict]]:
    """Quantized groups, worst first, by the output error each introduces when quantized alone (where the model
    carries outputs into its next call, by their worst relative error first, then all outputs'); and the groups it
    did not rank (over `max_groups`, past `deadline` on the perf_counter clock, or refused by the quantizer when
    alone), largest by MACs first, each with why. Groups are ranked largest by MACs first, so a cut leaves the small
    ones."""
    reference = candidates.session(fp32_path)
    samples = candidates.rank_samples
    expected = [reference(f) for f in samples]
    ranking, skipped = [], []
    macs = candidates.macs
    ordered = sorted(plan.quantized(), key=lambda g: -macs.get(g.group, 0))
    for i, group in enumerate(ordered):
        why = (
            "over max_ranked_groups"
            if i >= max_groups
            else "max_search_s ran out"
            if time.perf_counter() > deadline
            else ""
        )
        if why:
            skipped.append({"group": group.group, "role": group.role, "precision": group.precision, "skipped": why})
            continue
        candidates.log(f"ranking {i + 1}/{min(len(ordered), max_groups)}: {group.group}")
        path = work / f"rank-{i}{plan.model_suffix}"
        try:
            apply(plan.only(group.group), fp32_path, path, candidates.calibration, candidates.max_ir_version)
        except QuantizerFailed as exc:  # the quantizer takes it with the others, not alone: unranked, not fatal
            skipped.append(
                {
                    "group": group.group,
                    "role": group.role,
                    "precision": group.precision,
                    "skipped": f"its quantizer failed on it alone ({exc.problem[:120]})",
                }
            )
            remove_model(path)
            continue
        predict = candidates.session(path)
        num: dict[str, float] = {}
        den: dict[str, float] = {}
        for feeds, ref in zip(samples, expected, strict=True):
            out = predict(feeds)
            for name, value in ref.items():
                diff = out[name].astype(np.float64) - value.astype(np.float64)
                num[name] = num.get(name, 0.0) + float((diff**2).sum())
                den[name] = den.get(name, 0.0) + float((value.astype(np.float64) ** 2).sum())
        remove_model(path)
        total, scale = sum(num.values()), sum(den.values())
        entry = {
            "group": group.group,
            "role": group.role,
            "precision": group.precision,
            "relative_error": total / scale if scale else total,
        }
        carried = [name for name in candidates.carried if name in num]
        if carried:
            entry["carried_relative_error"] = max(num[n] / den[n] if den[n] else num[n] for n in carried)
        ranking.append(entry)
    return sorted(ranking, key=lambda r: (-r.get("carried_relative_error", 0.0), -r["relative_error"])), skipped


def search(plan: Plan, fp32_path: Path, out_path: Path, candidates: Candidates, limits: Limits) -> Search:
    """Apply `plan`, then move groups up the ladder until the budget holds; `out_path` ends as the chosen model.

    The first plan is applied with the fallback (a group its quantizer fails on moves up a rung), and the
    target compiles it (`candidates.vet`) before anything is spent on it; ranking and the loop stop when
    `limits.max_seconds` have passed. Where the loop ends with the budget missed, the most accurate plan it scored
    is the one kept (a metric over a loop, such as greedy agreement, need not improve with every step)."""
    result = Search(plan)
    deadline = time.perf_counter() + limits.max_seconds

    def score(path: Path) -> tuple[float, float]:
        predict = candidates.session(path)
        result.evaluations += 1
        return candidates.evaluate(predict), quick_latency_ms(predict, candidates.latency_feeds)

    def try_plan(candidate: Plan, path: Path) -> tuple[float, float]:
        result.applied = apply(candidate, fp32_path, path, candidates.calibration, candidates.max_ir_version)
        return score(path)

    plan, result.applied = apply_with_fallback(
        plan, fp32_path, out_path, candidates.calibration, candidates.max_ir_version, candidates.log
    )
    result.plan = plan
    if candidates.vet is not None:
        candidates.vet(out_path)
    metric, latency = score(out_path)
    result.metric = metric
    drop, met = candidates.judge(metric)
    result.steps.append(Step(0, "initial plan", None, None, metric, drop, latency, met))
    if met:
        result.stopped = "accuracy budget met by the rule table's plan"
        return result
    if not limits.enabled:
        result.stopped = "accuracy budget missed; the sensitivity loop is off ([quantization] sensitivity = false)"
        return result
    best = (drop, 0, result.plan, metric)  # the most accurate plan scored: kept where the budget stays missed
    met = False
    work = out_path.parent / ".sensitivity"
    work.mkdir(exist_ok=True)
    try:
        result.ranking, result.unranked = rank_groups(
            plan, fp32_path, work, candidates, limits.max_ranked_groups, deadline
        )
        order = [r["group"] for r in result.ranking] + [r["group"] for r in result.unranked]
        while True:
            if time.perf_counter() > deadline:
                result.stopped = (
                    f"max_search_s ran out after {len(result.steps) - 1} step(s) with the accuracy budget still missed"
                )
                break
            if result.evaluations >= limits.max_evaluations:
                result.stopped = (
                    f"evaluation cap reached ({limits.max_evaluations}) with the accuracy budget still missed"
                )
                break
            movable = [g for g in order if result.plan.next_rung(g) is not None]
            if not movable:
                result.stopped = "every group is at the top of the ladder and the accuracy budget is still missed"
                break
            group = movable[0]
            before = next(g.precision for g in result.plan.groups if g.group == group)
            rung = result.plan.next_rung(group)
            candidate = result.plan.with_group(
                group, rung, f"sensitivity loop step {len(result.steps)}: ranked worst ({before} → {rung})"
            )
            trial = work / f"candidate{plan.model_suffix}"
            kept = result.applied
            metric, latency = try_plan(candidate, trial)
            drop, met = candidates.judge(metric)
            step = Step(len(result.steps), f"{group}: {before} → {rung}", group, rung, metric, drop, latency, met)
            candidates.log(f"step {step.index}: {step.action}: metric {metric:.6g}, quick latency {latency:.3f} ms")
            limit = limits.latency_limit_ms
            if limit is not None and latency > limit:
                result.steps.append(step)
                result.applied = kept
                result.stopped = (
                    f"moving {group} to {rung} breaks the latency budget "
                    f"({latency:.3f} ms > {limit:g} ms, quick estimate); kept the previous plan"
                )
                break
            result.steps.append(step)
            result.plan, result.metric = candidate, metric
            move_model(trial, out_path)
            if step.meets_accuracy:
                result.stopped = f"accuracy budget met after {len(result.steps) - 1} step(s)"
                met = True
                break
            if drop < best[0]:
                best = (drop, step.index, candidate, metric)
        if not met and best[2] is not result.plan:
            _, index, kept_plan, kept_metric = best
            result.applied = apply(kept_plan, fp32_path, out_path, candidates.calibration, candidates.max_ir_version)
            result.plan, result.metric = kept_plan, kept_metric
            result.stopped += f"; the most accurate plan scored, step {index}'s ({kept_metric:.6g}), is kept instead"
    finally:
        for leftover in work.glob("*"):
            leftover.unlink()
        work.rmdir()
    return result
