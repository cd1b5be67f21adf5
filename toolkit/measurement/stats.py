"""Distribution-free statistics for latency samples.

A percentile's confidence bounds come from order statistics: the number of samples that fall
below the true q-quantile is Binomial(n, q) whatever the latency distribution, so the k-th
smallest sample bounds the quantile with a probability read off the binomial CDF
(see research/profiling-modeling.md §2.7). No normality assumption, no bootstrap.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


def _binomial_cdf(n: int, p: float) -> np.ndarray:
    """cdf[k] = P(Binomial(n, p) <= k) for k = 0..n, computed in log space so large n does not underflow."""
    k = np.arange(n + 1, dtype=np.float64)
    log_choose = np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(n + 1)])
    with np.errstate(divide="ignore"):
        log_pmf = log_choose + k * math.log(p) + (n - k) * math.log1p(-p)
    pmf = np.exp(log_pmf - log_pmf.max())
    cdf = np.cumsum(pmf / pmf.sum())
    cdf[-1] = 1.0
    return cdf


def order_stat_bounds(n: int, quantile: float, confidence: float) -> tuple[int | None, int | None]:
    """1-based ranks (lower, upper) of the sorted samples that bound the quantile.

    P(x_(upper) >= true quantile) >= confidence and P(x_(lower) <= true quantile) >= confidence,
    each one-sided. A rank is None when n is too small for that bound to exist.
    """
    if not 0 < quantile < 1 or not 0 < confidence < 1 or n < 1:
        raise ValueError(f"need n >= 1 and quantile, confidence in (0, 1); got {n}, {quantile}, {confidence}")
    cdf = _binomial_cdf(n, quantile)
    # x_(u) >= xi_q  <=>  fewer than u samples fall below xi_q:  P(X <= u-1) = cdf[u-1]
    upper_ok = np.nonzero(cdf >= confidence)[0]
    upper = int(upper_ok[0]) + 1 if upper_ok.size and upper_ok[0] + 1 <= n else None
    # x_(l) <= xi_q  <=>  at least l samples fall below xi_q:  P(X >= l) = 1 - cdf[l-1]
    survival = 1.0 - np.concatenate(([0.0], cdf[:-1]))  # survival[l] = P(X >= l)
    lower_ok = np.nonzero(survival[1:] >= confidence)[0]
    lower = int(lower_ok[-1]) + 1 if lower_ok.size else None
    return lower, upper


@dataclass(frozen=True)
class QuantileEstimate:
    quantile: float
    point: float
    lower: float  # -inf when the sample count cannot bound it from below
    upper: float  # +inf when the sample count cannot bound it from above
    per_repeat: list[float]


def estimate_quantile(repeats: list[np.ndarray], quantile: float, confidence: float) -> QuantileEstimate:
    """Pooled percentile with order-statistic bounds, widened by the spread between repeats.

    Run-to-run variation (a fresh process, another memory layout) often exceeds the spread within
    one run, so a bound is never tighter than the most extreme per-repeat percentile.
    """
    pooled = np.sort(np.concatenate(repeats))
    lo_rank, hi_rank = order_stat_bounds(pooled.size, quantile, confidence)
    lower = float(pooled[lo_rank - 1]) if lo_rank else -math.inf
    upper = float(pooled[hi_rank - 1]) if hi_rank else math.inf
    per_repeat = [float(np.quantile(r, quantile)) for r in repeats]
    if len(repeats) > 1:
        lower, upper = min(lower, min(per_repeat)), max(upper, max(per_repeat))
    return QuantileEstimate(quantile, float(np.quantile(pooled, quantile)), lower, upper, per_repeat)


@dataclass(frozen=True)
class LatencySummary:
    count: int
    repeats: int
    min: float
    max: float
    mean: float
    stdev: float
    cv: float  # within-run: stdev / mean of all samples
    cv_between_repeats: float  # spread of per-repeat medians
    quantiles: dict[str, QuantileEstimate]
    confidence: float

    def to_json(self) -> dict:
        data = asdict(self)
        data["quantiles"] = {k: asdict(v) for k, v in self.quantiles.items()}
        return _finite(data)


def summarize(repeats: list[np.ndarray], confidence: float, quantiles=(0.5, 0.9, 0.99)) -> LatencySummary:
    if not repeats or any(r.size == 0 for r in repeats):
        raise ValueError("every repeat needs at least one sample")
    pooled = np.concatenate(repeats)
    medians = np.array([np.median(r) for r in repeats])
    mean = float(pooled.mean())
    stdev = float(pooled.std(ddof=1)) if pooled.size > 1 else 0.0
    between = float(medians.std(ddof=1) / medians.mean()) if medians.size > 1 else 0.0
    return LatencySummary(
        count=int(pooled.size),
        repeats=len(repeats),
        min=float(pooled.min()),
        max=float(pooled.max()),
        mean=mean,
        stdev=stdev,
        cv=stdev / mean if mean > 0 else 0.0,
        cv_between_repeats=between,
        quantiles={f"p{q * 100:g}": estimate_quantile(repeats, q, confidence) for q in quantiles},
        confidence=confidence,
    )


def _finite(value):
    """JSON has no infinity: an absent bound is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


_SPLIT_SCOPE = (
    "process_baseline is the interpreter and numpy before the runtime loads (a C++ application does not pay "
    "it); weights are the artifact's files"
)


def resident_split(
    peak_rss_mb: list[float], rss_start_mb: list[float], weights_mb: float, held: str, held_mb: float, scope: str
) -> dict:
    """A workload's peak resident memory split into the process baseline (median over processes), the weights, what
    the workload holds (`held`: the KV cache, the carried state) and the rest (runtime, arenas, activations)."""
    peak = max(peak_rss_mb)
    baseline = float(np.median(rss_start_mb))
    return {
        "peak_rss": peak,
        "process_baseline": baseline,
        "weights": weights_mb,
        held: held_mb,
        "rest": peak - baseline - weights_mb - held_mb,
        "scope": f"peak resident set of the measuring process {scope}; {_SPLIT_SCOPE}",
    }


def device_split(results: list[dict], weights_mb: float, held: str, held_mb: float) -> dict | None:
    """On a GPU target, where the weights and what the workload holds live in device memory: the measuring process's
    peak device memory (NVML, over all processes) split into the weights, `held` and the rest (the CUDA context, the
    runtime's arena, workspaces, activations); None where no process read it."""
    read = [r["meters"]["nvml"] for r in results if r["meters"].get("nvml", {}).get("device_memory_mb") is not None]
    if not read:
        return None
    peaks = [m["device_memory_mb"] for m in read]
    return {
        "peak": max(peaks),
        "per_repeat": peaks,
        "weights": weights_mb,
        held: held_mb,
        "rest": max(peaks) - weights_mb - held_mb,
        "scope": read[0].get("device_memory_scope", ""),
    }
