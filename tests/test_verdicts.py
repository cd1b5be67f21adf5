import numpy as np
import pytest

from tapeout.core.errors import EXIT_BUDGET_FAILED, EXIT_INCONCLUSIVE, EXIT_OK
from tapeout.core.parity import compare
from tapeout.core.profile_schema import CheckSettings, ParitySettings
from tapeout.core.schemas import Budgets
from tapeout.core.verdict import BudgetResult, Verdict
from tapeout.measurement import verdicts


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


def test_a_parity_pass_names_the_cosine_that_judged_it_not_only_loose_tolerances():
    ref = [{"a": np.ones(4, np.float32), "b": np.arange(4, dtype=np.float32)}]
    act = [{"a": np.ones(4, np.float32), "b": np.arange(4, dtype=np.float32) * 1.01 + 0.01}]
    result = verdicts.judge_parity(compare(ref, act, 5.0, 1.0), ParitySettings(atol=5.0, rtol=1.0, min_cosine=0.99))
    assert result.verdict is Verdict.PASS and result.measured < 1.0
    assert result.reason.startswith("judged on the cosine: worst b 0.99")


def test_accuracy_direction():
    higher = verdicts.judge_accuracy(Budgets(accuracy_max_drop=0.01), 0.90, 0.885, "higher", "top1")[0]
    lower = verdicts.judge_accuracy(Budgets(accuracy_max_drop=0.5), 10.0, 10.4, "lower", "ppl")[0]
    assert higher.verdict is Verdict.FAIL and abs(higher.measured - 0.015) < 1e-12
    assert lower.verdict is Verdict.PASS
    missing = verdicts.judge_accuracy(Budgets(accuracy_max_drop=0.5), None, None, None, "metric")[0]
    assert missing.verdict is Verdict.UNMEASURED and "[evaluation]" in missing.reason


def _process(rss_peak=80.0, create_ms=9.0, **meters):
    """One inference process's result as the runner writes it."""
    return {
        "samples_ms": np.linspace(1.0, 2.0, 100).tolist(),
        "import_ms": 5.0,
        "create_ms": create_ms,
        "first_ms": 1.0,
        "warmup_iters": 20,
        "meters": {"rss": {"rss_start_mb": 40.0, "rss_after_session_mb": 70.0, "peak_rss_mb": rss_peak}, **meters},
    }


def _measurement(*processes):
    from tapeout.measurement.measure import _summarize

    processes = processes or (_process(80.0, create_ms=9.0), _process(90.0, create_ms=11.0))
    return _summarize(list(processes), CheckSettings(), tuple(processes[0]["meters"]))


def _nvml(energy_j, runs=1000, window_s=5.0, memory_mb=900.0):
    return {
        "energy_j": energy_j,
        "runs": runs,
        "window_s": window_s,
        "power_avg_w": energy_j / window_s,
        "energy_quantum_j": 0.2,
        "energy_scope": "GPU board",
        "energy_method": "NVML counter",
        "device_memory_mb": memory_mb,
        "device_memory_scope": "this process",
        "device": {"name": "NVIDIA L4"},
    }


def test_memory_artifact_and_energy_budgets():
    m = _measurement()
    assert verdicts.judge_memory(Budgets(peak_memory_mb=100), m)[0].verdict is Verdict.PASS
    worst = verdicts.judge_memory(Budgets(peak_memory_mb=85), m)[0]
    assert worst.verdict is Verdict.FAIL and worst.measured == 90.0  # the worst process decides
    assert verdicts.judge_artifact(Budgets(artifact_mb=1), 2 * 2**20)[0].verdict is Verdict.FAIL
    assert verdicts.judge_memory(Budgets(), m) == [] and verdicts.judge_artifact(Budgets(), 1) == []
    energy = verdicts.judge_power(Budgets(energy_mj=5, power_avg_w=3), m)
    assert [e.verdict for e in energy] == [Verdict.UNMEASURED, Verdict.UNMEASURED]
    assert all("reads no energy counter (its meters: rss)" in e.reason for e in energy)
    gpu = verdicts.judge_gpu_memory(Budgets(gpu_memory_mb=100), m)[0]
    assert gpu.verdict is Verdict.UNMEASURED and "no device memory apart from the host's" in gpu.reason


def test_an_unreadable_counter_is_unmeasured_with_its_reason():
    off = {"unavailable": "RAPL: energy_uj is not readable"}
    m = _measurement(_process(rapl=off), _process(rapl=off))
    assert m.energy is None
    result = verdicts.judge_power(Budgets(energy_mj=5), m)[0]
    assert result.verdict is Verdict.UNMEASURED and result.reason == "RAPL: energy_uj is not readable"


def test_energy_power_and_gpu_memory_are_judged_on_bounds_across_processes():
    # 4.0 and 4.4 J over 1000 runs: 4.0-4.4 mJ per inference, ±0.2 mJ of counter granularity
    m = _measurement(_process(nvml=_nvml(4.0, memory_mb=900.0)), _process(nvml=_nvml(4.4, memory_mb=950.0)))
    assert m.energy.meter == "nvml" and m.device == {"name": "NVIDIA L4"}
    assert m.energy.bounds[0] * 1e3 == pytest.approx(3.8) and m.energy.bounds[1] * 1e3 == pytest.approx(4.6)
    judge = {r.budget: r for r in verdicts.judge_power(Budgets(energy_mj=5.0, power_avg_w=0.5), m, guard=0.05)}
    assert judge["energy_mj"].verdict is Verdict.PASS and judge["energy_mj"].measured == pytest.approx(4.2)
    assert judge["power_avg_w"].verdict is Verdict.FAIL  # 0.8-0.88 W, well over 0.5 W
    assert verdicts.judge_power(Budgets(energy_mj=4.3), m)[0].verdict is Verdict.INCONCLUSIVE
    assert verdicts.judge_power(Budgets(energy_mj=3.5), m)[0].verdict is Verdict.FAIL
    assert verdicts.judge_gpu_memory(Budgets(gpu_memory_mb=1000), m)[0].verdict is Verdict.PASS
    below = verdicts.judge_gpu_memory(Budgets(gpu_memory_mb=920), m)[0]
    assert below.verdict is Verdict.FAIL and below.measured == 950.0  # the worst process decides


def test_emulated_targets_never_judge_energy_or_gpu_memory():
    m = _measurement(_process(nvml=_nvml(4.0)), _process(nvml=_nvml(4.0)))
    results = verdicts.judge_on_device(Budgets(energy_mj=5, gpu_memory_mb=2000), m, CheckSettings(), "an emulator")
    assert {r.verdict for r in results} == {Verdict.UNMEASURED} and all("emulated" in r.reason for r in results)


def test_cold_start_judged_on_the_range_over_processes():
    m = _measurement()
    results = {r.budget: r for r in verdicts.judge_latency(Budgets(cold_start_ms=20), m, CheckSettings())}
    assert results["cold_start_ms"].verdict is Verdict.PASS and results["cold_start_ms"].bound == (10.0, 12.0)
    results = {r.budget: r for r in verdicts.judge_latency(Budgets(cold_start_ms=11), m, CheckSettings())}
    assert results["cold_start_ms"].verdict is Verdict.INCONCLUSIVE


def test_placement_from_the_op_profile_names_what_ran_off_the_targets_provider(digits_build):
    """A real per-op profile (digits-cnn on the CPU EP), read as if the target were a GPU EP: every node
    left on the CPU EP counts as off the accelerator, by op type, and the placement budget judges it."""
    import json

    from tapeout.measurement.measure import placement_from_profile

    profile = json.loads((digits_build / "report.json").read_text())["measurement"]["op_profile"]
    on_cpu = placement_from_profile(profile, "CPUExecutionProvider")
    assert on_cpu["off_share"] == 0.0 and on_cpu["total_nodes"] >= 4 and not on_cpu["off"]
    on_gpu = placement_from_profile(profile, "CUDAExecutionProvider")
    assert on_gpu["off_share"] == 1.0 and {o["op_type"] for o in on_gpu["off"]} >= {"Conv"}
    assert all(o["reason"] == "ran on CPUExecutionProvider" for o in on_gpu["off"])
    verdict = verdicts.judge_placement(Budgets(placement_max_off_share=0.2), on_gpu)[0]
    assert verdict.verdict is Verdict.FAIL and "Conv" in verdict.reason
    assert placement_from_profile(None, "CUDAExecutionProvider") is None


def test_the_op_profile_runs_in_the_last_timing_process_after_its_timed_runs(digits_build, monkeypatch):
    """One process fewer per measurement: the last timing process runs the profiled pass after its timed runs, in
    a session of its own; its profile is reported, and it is not among the timing figures."""
    from tapeout import targets
    from tapeout.core.artifact import Artifact
    from tapeout.measurement import measure

    requests = []
    real = measure.run_child
    monkeypatch.setattr(
        measure, "run_child", lambda request, *a, **k: requests.append(request) or real(request, *a, **k)
    )
    settings = CheckSettings(iterations=10, repeats=2, warmup_min_s=0.0, op_profile_iterations=3)
    target = targets.create("onnxruntime", {})
    m = measure.measure(
        target, Artifact("onnxruntime", digits_build / "artifact", "model.onnx"), digits_build / "golden.npz", settings
    )
    assert [r.get("then_op_profile") for r in requests] == [None, 3] and not any("mode" in r for r in requests)
    assert m.op_profile["runs"] == 3 and {t["op_type"] for t in m.op_profile["op_types"]} >= {"Conv"}
    assert all("op_profile" not in p for p in m.processes) and m.latency.count == 20
