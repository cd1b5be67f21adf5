"""An estimate at the speed the host ran a measurement at (estimation/host_drift.py)."""

from __future__ import annotations

import pytest

from tapeout.estimation import host_drift


def _probe(gflops: float, gbs: float = 20.0) -> dict:
    return {"fp32_gflops": gflops, "fp32_gflops_range": [gflops, gflops], "bandwidth_gbs": gbs,
            "bandwidth_gbs_range": [gbs, gbs]}


def test_a_sweeps_probes_sum_up_to_their_median_and_range():
    rates = [300.0 - i for i in range(20)] + [60.0]   # one probe taken while something else ran
    got = host_drift.summary([_probe(r, 10 + i) for i, r in enumerate(rates)])
    assert got["probes"] == 21 and got["fp32_gflops"] == 290.0 and got["bandwidth_gbs"] == 20.0
    assert got["fp32_gflops_range"] == [282.0, 298.0]  # the 10th and 90th percentile: the outlier left out
    assert host_drift.summary([]) is None and host_drift.summary([{"bandwidth_gbs": 20.0}]) is None


def test_an_estimate_at_a_faster_measurement_is_faster_by_the_probes_ratio():
    """Swept at 283 GFLOP/s, a build measured when the probe read 356: the estimate times 283/356."""
    at = host_drift.at_measured_speed(0.050, 283.0, _probe(356.0), measured_p50_ms=0.040)
    assert at["p50_ms"] == pytest.approx(0.050 * 283 / 356)
    assert at["error"] == pytest.approx(0.050 * 283 / 356 / 0.040 - 1)
    assert (at["learned_fp32_gflops"], at["measured_fp32_gflops"]) == (283.0, 356.0)
    assert host_drift.at_measured_speed(0.05, 283.0, _probe(356.0), None)["error"] is None


def test_without_either_probe_there_is_no_figure_at_the_measurements_speed():
    # a predictor file trained before the sweep's speed was kept, a measurement with no probe, or a broken one
    assert host_drift.at_measured_speed(0.05, None, _probe(356.0), 0.04) is None
    assert host_drift.at_measured_speed(0.05, 283.0, None, 0.04) is None
    assert host_drift.at_measured_speed(0.05, 283.0, {"fp32_gflops": 0.0}, 0.04) is None
    assert host_drift.scale(283.0, {}) is None
