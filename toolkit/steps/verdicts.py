"""Step `verdicts`: every budget judged — on the device's measurements (through an emulator, latency on the
estimate: estimated-pass / estimated-fail), the artifact's size, placement, golden parity and accuracy. A
check carries the accuracy and placement verdicts over from the build's report, verified by hash."""

from __future__ import annotations

from tapeout.core import workload as workloads
from tapeout.core.profile_schema import Profile
from tapeout.core.schemas import Budgets
from tapeout.core.verdict import BudgetResult, Verdict
from tapeout.estimation.estimate import Estimate, judge
from tapeout.measurement import verdicts
from tapeout.records.report import Report
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


def estimated_verdicts(budgets: Budgets, est: Estimate | None, emulated: str | None) -> list[BudgetResult]:
    """estimated-pass / estimated-fail for the latency budgets of an emulated build with an estimate; none
    otherwise (measured timings are judged as measured)."""
    if emulated is None or est is None:
        return []
    return judge(budgets, est, f"emulated: {emulated}")


def carried(build: Report, profile: Profile) -> list[BudgetResult]:
    """The build's verdicts that a check cannot recompute, marked carried: accuracy (the metric's data
    stays on the host), placement (the compile-time op trace; the artifact is that compiled graph) and a
    transcription's word error rate (its transcripts and tokenizer stay on the host)."""
    built = {b.budget: b for b in build.budgets}
    results = []
    for budget, limit, why in (
        ("accuracy_max_drop", profile.budgets.accuracy_max_drop, "the metric's data stays on the host"),
        ("accuracy_max_rel_drop", profile.budgets.accuracy_max_rel_drop, "the metric's data stays on the host"),
        ("placement_max_off_share", profile.budgets.placement_max_off_share, "from the compile-time op trace"),
        ("max_wer", profile.budgets.max_wer, "the transcripts and the tokenizer stay on the host"),
    ):
        if limit is None:
            continue
        if budget not in built:
            results.append(
                BudgetResult(
                    budget,
                    limit,
                    "",
                    Verdict.UNMEASURED,
                    carried=True,
                    reason="the build's report has no verdict for it",
                )
            )
            continue
        b = built[budget]
        results.append(
            BudgetResult(
                b.budget,
                b.limit,
                b.unit,
                b.verdict,
                b.measured,
                b.bound,
                f"judged at build ({why}); carried over, its report verified by hash. {b.reason}",
                carried=True,
            )
        )
    return results


class Verdicts(Step):
    name = "verdicts"
    needs = ("measurement", "artifact_info", "parity", "loop", "placement", "accuracy", "estimate")
    adds = ("budgets",)

    def run(self, state: BuildState) -> None:
        setup, settings = state.setup, state.settings
        budgets = setup.profile.budgets
        results = [
            *verdicts.judge_on_device(
                budgets,
                state.measurement,
                settings,
                setup.emulated,
                estimated_verdicts(budgets, state.estimate, setup.emulated),
            ),
            *verdicts.judge_artifact(budgets, state.artifact_info.bytes),
        ]
        if state.opened is None:
            results += verdicts.judge_placement(budgets, state.placement)
        results.append(verdicts.judge_parity(state.parity, settings.parity))
        ran = state.workload
        # a [budgets] budget of a built-in workload the build did not run is unmeasured, with the reason; a plug-in's
        # budgets are its own settings, judged where it runs (no other plug-in is imported for this). A budget two
        # kinds share (ttft_ms) is judged once, by the kind that ran.
        own = ran.judge(budgets, state.loop, settings, setup.emulated)
        seen = {r.budget for r in own}
        for kind in dict.fromkeys([*workloads.BUILT_IN, ran.kind]):
            if kind == ran.kind:
                results += own
                continue
            for result in workloads.get(kind).judge(budgets, None, settings, setup.emulated):
                if result.budget not in seen:
                    seen.add(result.budget)
                    results.append(result)
        if state.opened is None:
            acc = state.accuracy
            results += verdicts.judge_accuracy(
                budgets,
                acc and acc.reference,
                acc and acc.artifact,
                acc and acc.direction,
                acc.metric if acc else "metric",
            )
        else:
            judged = {r.budget for r in results}  # a budget of a workload the build did not run: said once
            results += [r for r in carried(state.opened.report, setup.profile) if r.budget not in judged]
        state.budgets = results

    def report(self, state: BuildState) -> dict[str, object]:
        return {"budgets": state.budgets}
