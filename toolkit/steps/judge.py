"""Budgets an emulated build cannot measure, decided on the estimate for the device instead."""

from __future__ import annotations

from tapeout.core.schemas import Budgets
from tapeout.core.verdict import BudgetResult
from tapeout.estimation.estimate import Estimate, judge


def estimated_verdicts(budgets: Budgets, est: Estimate | None, emulated: str | None) -> list[BudgetResult]:
    """estimated-pass / estimated-fail for the latency budgets of an emulated build with an estimate; none
    otherwise (measured timings are judged as measured)."""
    if emulated is None or est is None:
        return []
    return judge(budgets, est, f"emulated: {emulated}")
