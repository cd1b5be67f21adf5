import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tapeout.core.profile_schema import min_samples_for_bound
from tapeout.measurement import stats


@pytest.mark.parametrize(
    ("n", "q", "upper"),
    # research/profiling-modeling.md §2.7, computed independently from the binomial CDF
    [
        (100, 0.9, 96),
        (300, 0.9, 279),
        (1000, 0.9, 916),
        (300, 0.99, 300),
        (1000, 0.99, 996),
        (100, 0.5, 59),
        (1000, 0.5, 527),
    ],
)
def test_upper_rank_matches_published_values(n, q, upper):
    assert stats.order_stat_bounds(n, q, 0.95)[1] == upper


def test_bound_absent_when_too_few_samples():
    assert stats.order_stat_bounds(28, 0.9, 0.95)[1] is None
    assert stats.order_stat_bounds(29, 0.9, 0.95)[1] == 29
    assert min_samples_for_bound(0.9, 0.95) == 29
    assert min_samples_for_bound(0.99, 0.95) == 299


@given(n=st.integers(1, 400), q=st.sampled_from([0.5, 0.9, 0.99]), conf=st.sampled_from([0.9, 0.95, 0.99]))
@settings(max_examples=60, deadline=None)
def test_ranks_satisfy_their_binomial_guarantee(n, q, conf):
    lower, upper = stats.order_stat_bounds(n, q, conf)
    pmf = [math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(n + 1)]
    if upper is not None:
        assert sum(pmf[:upper]) >= conf - 1e-9  # P(X <= upper-1)
        if upper > 1:
            assert sum(pmf[: upper - 1]) < conf  # and it is the smallest such rank
    if lower is not None:
        assert sum(pmf[lower:]) >= conf - 1e-9  # P(X >= lower)


@pytest.mark.parametrize("dist", ["exponential", "lognormal", "uniform"])
def test_coverage_on_known_distributions(dist):
    """Each one-sided 95% bound must hold in at least ~95% of trials, whatever the distribution."""
    rng = np.random.default_rng(1)
    draw = {
        "exponential": lambda n: rng.exponential(1.0, n),
        "lognormal": lambda n: rng.lognormal(0.0, 0.8, n),
        "uniform": lambda n: rng.uniform(0.0, 1.0, n),
    }[dist]
    truth = {"exponential": -math.log(0.1), "lognormal": math.exp(0.8 * 1.2815515655446004), "uniform": 0.9}[dist]
    trials, upper_ok, lower_ok = 2000, 0, 0
    for _ in range(trials):
        est = stats.estimate_quantile([draw(100)], 0.9, 0.95)
        upper_ok += est.upper >= truth
        lower_ok += est.lower <= truth
    assert upper_ok / trials >= 0.94
    assert lower_ok / trials >= 0.94
    # and not absurdly conservative: order statistics are exact up to discreteness
    assert upper_ok / trials <= 0.99


def test_bounds_widen_to_cover_run_to_run_spread():
    fast, slow = np.full(200, 1.0), np.full(200, 2.0)
    est = stats.estimate_quantile([fast, slow], 0.5, 0.95)
    assert est.lower <= 1.0 and est.upper >= 2.0
    assert est.per_repeat == [1.0, 2.0]


def test_summary_json_has_no_infinities():
    summary = stats.summarize([np.linspace(1, 2, 50)], 0.95)
    data = summary.to_json()
    assert data["quantiles"]["p99"]["upper"] is None  # 50 samples cannot bound p99 from above
    assert data["count"] == 50 and data["repeats"] == 1
    assert 1.0 <= data["quantiles"]["p50"]["point"] <= 2.0


def test_a_gpu_workloads_memory_is_split_from_the_device_memory_nvml_read():
    """The weights and the KV cache of an ort-cuda loop live in GPU memory: the split is of NVML's per-process
    figure, its peak over the processes; a host target's results carry no NVML reading and get none."""
    nvml = {"device_memory_mb": 680.0, "device_memory_scope": "this process's GPU memory (NVML, per process)"}
    results = [
        {"meters": {"rss": {}, "nvml": nvml}},
        {"meters": {"rss": {}, "nvml": {**nvml, "device_memory_mb": 690.0}}},
    ]
    split = stats.device_split(results, 7.5, "kv_cache", 0.75)
    assert split == {
        "peak": 690.0,
        "per_repeat": [680.0, 690.0],
        "weights": 7.5,
        "kv_cache": 0.75,
        "rest": 690.0 - 7.5 - 0.75,
        "scope": nvml["device_memory_scope"],
    }
    assert stats.device_split([{"meters": {"rss": {}}}], 7.5, "kv_cache", 0.75) is None
    assert stats.device_split([{"meters": {"rss": {}, "nvml": {"unavailable": "no driver"}}}], 1, "state", 0) is None
