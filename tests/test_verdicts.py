import numpy as np

from tapeout import verdicts
from tapeout.errors import EXIT_BUDGET_FAILED, EXIT_INCONCLUSIVE, EXIT_OK
from tapeout.parity import compare
from tapeout.types import BudgetResult, Budgets, ParitySettings, Verdict


def test_latency_verdict_uses_bounds_and_guard_band():
    judge = verdicts.judge_bounded
    assert judge("l", 10, "ms", 5, 4, 6, 0.05, "").verdict is Verdict.PASS
    assert judge("l", 10, "ms", 12, 11, 13, 0.05, "").verdict is Verdict.FAIL
    # point under the limit but the upper bound over it: not a pass
    assert judge("l", 10, "ms", 9, 8, 11, 0.05, "").verdict is Verdict.INCONCLUSIVE
    # upper bound under the limit but inside the guard band
    assert judge("l", 10, "ms", 9.6, 9.5, 9.8, 0.05, "").verdict is Verdict.INCONCLUSIVE


def _r(verdict):
    return BudgetResult("b", 1, "x", verdict)


def test_exit_codes_follow_design():
    assert verdicts.exit_code([_r(Verdict.PASS)]) == EXIT_OK
    assert verdicts.exit_code([_r(Verdict.PASS), _r(Verdict.INCONCLUSIVE)]) == EXIT_INCONCLUSIVE
    assert verdicts.exit_code([_r(Verdict.INCONCLUSIVE), _r(Verdict.FAIL)]) == EXIT_BUDGET_FAILED
    assert verdicts.exit_code([_r(Verdict.UNMEASURED)]) == EXIT_OK
    assert verdicts.exit_code([_r(Verdict.UNMEASURED)], strict=True) == EXIT_BUDGET_FAILED
    assert verdicts.exit_code([_r(Verdict.ESTIMATED_PASS)], strict=True) == EXIT_BUDGET_FAILED


def test_parity_names_the_output_that_is_off():
    ref = [{"a": np.ones(4, np.float32), "b": np.arange(4, dtype=np.float32)}]
    act = [{"a": np.ones(4, np.float32), "b": np.arange(4, dtype=np.float32) + 0.5}]
    result = verdicts.judge_parity(compare(ref, act, 1e-4, 1e-3), ParitySettings())
    assert result.verdict is Verdict.FAIL and "b" in result.reason and "a," not in result.reason


def test_accuracy_direction():
    higher = verdicts.judge_accuracy(Budgets(accuracy_max_drop=0.01), 0.90, 0.885, "higher", "top1")[0]
    lower = verdicts.judge_accuracy(Budgets(accuracy_max_drop=0.5), 10.0, 10.4, "lower", "ppl")[0]
    assert higher.verdict is Verdict.FAIL and abs(higher.measured - 0.015) < 1e-12
    assert lower.verdict is Verdict.PASS
    missing = verdicts.judge_accuracy(Budgets(accuracy_max_drop=0.5), None, None, None, "metric")[0]
    assert missing.verdict is Verdict.UNMEASURED and "[evaluation]" in missing.reason
