"""An estimate at the speed the host ran a measurement at: a shared VM's speed drifts by tens of percent over hours,
and a predictor learned in one hour prices a model measured in another at the first hour's speed.

The sweep records the host's own probe (`core.host_speed.host_state`: a 1024² FP32 matrix multiply and a copy) before
each chunk, and every measurement records it beside its timings. Here, on the 2-core Xeon of the sixteenth session,
the 74 builds measured at 06:32 (probe median 356 GFLOP/s) against predictors swept at 09:12-09:44 (283): 10 of 38
ONNX Runtime builds within ±15 % as priced, 27 with each estimate scaled by the sweep's FP32 rate over its check's
(13 by the copy bandwidth's ratio), and 25-26 of the same builds measured again at 09:45-09:58, in the sweep's own
period, either way. So the scaled figure is offered beside the plain one, never instead of it: it says how far an
estimate is off once the machine's own drift is taken out, which is what a predictor can be judged on.
"""

from __future__ import annotations

import statistics
from typing import Any


def summary(states: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The host's speed over a sweep's probes: the median FP32 rate and copy bandwidth, the FP32 rate's 10th-90th
    percentile range, and how many probes; None without any."""
    rates = sorted(s["fp32_gflops"] for s in states if s.get("fp32_gflops"))
    if not rates:
        return None
    low, high = rates[len(rates) // 10], rates[(len(rates) * 9) // 10]
    bandwidth = [s["bandwidth_gbs"] for s in states if s.get("bandwidth_gbs")]
    return {"fp32_gflops": statistics.median(rates), "fp32_gflops_range": [low, high],
            "bandwidth_gbs": statistics.median(bandwidth) if bandwidth else None, "probes": len(rates)}


def scale(learned_gflops: float | None, measured: dict[str, Any] | None) -> float | None:
    """What an estimate learned at `learned_gflops` (FP32 GFLOP/s, the sweep's median probe) is multiplied by to stand
    at the speed of a measurement whose host state is `measured`: the learned rate over the measured one. None where
    either is unknown."""
    rate = (measured or {}).get("fp32_gflops")
    if not learned_gflops or not rate or rate <= 0:
        return None
    return learned_gflops / rate


def at_measured_speed(predicted_ms: float, learned_gflops: float | None, measured: dict[str, Any] | None,
                      measured_p50_ms: float | None) -> dict[str, Any] | None:
    """The estimate's p50 at the measurement's host speed, with the rates it was scaled by and its error against the
    measured p50; None where a rate is unknown."""
    factor = scale(learned_gflops, measured)
    if factor is None:
        return None
    p50 = predicted_ms * factor
    return {"p50_ms": p50, "learned_fp32_gflops": learned_gflops, "measured_fp32_gflops": measured["fp32_gflops"],
            "error": p50 / measured_p50_ms - 1 if measured_p50_ms else None}
