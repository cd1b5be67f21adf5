import numpy as np

from tapeout import verdicts
from tapeout.errors import EXIT_BUDGET_FAILED, EXIT_INCONCLUSIVE, EXIT_OK
from tapeout.parity import compare
from tapeout.types import BudgetResult, Budgets, CheckSettings, ParitySettings, Verdict


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


def _measurement(peak_rss=(80.0, 90.0), energy=None):
    from tapeout import stats
    from tapeout.measure import Measurement

    samples = [np.linspace(1.0, 2.0, 100)]
    return Measurement(stats.summarize(samples, 0.95), samples, [10.0, 12.0], [5.0, 5.0], [9.0, 11.0], [1.0, 1.0],
                       [20, 20], list(peak_rss), [40.0, 40.0], [70.0, 70.0], [], energy_j_per_inference=energy)


def test_memory_artifact_and_energy_budgets():
    m = _measurement()
    assert verdicts.judge_memory(Budgets(peak_memory_mb=100), m)[0].verdict is Verdict.PASS
    worst = verdicts.judge_memory(Budgets(peak_memory_mb=85), m)[0]
    assert worst.verdict is Verdict.FAIL and worst.measured == 90.0  # the worst process decides
    assert verdicts.judge_artifact(Budgets(artifact_mb=1), 2 * 2**20)[0].verdict is Verdict.FAIL
    assert verdicts.judge_memory(Budgets(), m) == [] and verdicts.judge_artifact(Budgets(), 1) == []
    energy = verdicts.judge_power(Budgets(energy_mj=5, power_avg_w=3), m)
    assert [e.verdict for e in energy] == [Verdict.UNMEASURED, Verdict.UNMEASURED]
    assert "RAPL" in energy[0].reason and "sensor" in energy[1].reason
    measured = verdicts.judge_power(Budgets(energy_mj=5), _measurement(energy=0.004))[0]
    assert measured.verdict is Verdict.PASS and abs(measured.measured - 4.0) < 1e-9


def test_cold_start_judged_on_the_range_over_processes():
    m = _measurement()
    results = {r.budget: r for r in verdicts.judge_latency(Budgets(cold_start_ms=20), m, CheckSettings())}
    assert results["cold_start_ms"].verdict is Verdict.PASS and results["cold_start_ms"].bound == (10.0, 12.0)
    results = {r.budget: r for r in verdicts.judge_latency(Budgets(cold_start_ms=11), m, CheckSettings())}
    assert results["cold_start_ms"].verdict is Verdict.INCONCLUSIVE
