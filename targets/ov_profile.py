"""OpenVINO CPU's per-node times from its counters (PERF_COUNT), over runs that keep the timed runs' pace.

The CPU plugin's counter is not the last run's time: it is the running mean, in whole µs, of every run since
compile (PerfCount::avg(), total / count), so a node's time over a window of runs is the difference of its running
totals before and after it (`timed_total_us`). Floored, each reading is known to within its count in µs: the longer
the history before a window, the longer the window must be for the same precision.

A freshly compiled session does not run at its settled pace at once: a lone GRU (the plugin's reference kernel,
35 steps) ran 290-340 µs a run for its first ~18 runs and ~200 µs after, as the timed runs before it had; three
warm-up runs and twenty profiled ones read it at 302 µs, more than the timed run it is a part of. And a busy host
(CI's second worker) can stretch one window. So where the caller has timed the model already (`pace_s`, the p50 of
its unprofiled runs), the warm-up goes on until the runs keep that pace, and a window that did not keep it is taken
again, up to `WINDOWS` times, keeping the quickest (by its median run).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

WARMUP = 3
# a profiled run keeps the timed runs' pace within this factor, plus the counters' own cost a run (a one-Erf model
# ran 17 µs a run timed and ~24 profiled here)
PACE_SLACK, PACE_EXTRA_S = 1.25, 10e-6
SETTLE_MAX_S = 0.05  # the longest warm-up, and the longest a window grows to match its history
WINDOWS = 3


@dataclass(frozen=True)
class Window:
    runs: int
    run_total_us: float
    median_s: float
    nodes: dict[str, tuple[str, str, float]]  # name -> (type, kernel, µs over the window's runs)


def timed_total_us(mean_before: float | None, mean_after: float, warmup: int, iterations: int) -> float:
    """A node's total µs over `iterations` runs, from its running mean (whole µs, floored) after the `warmup`
    runs before them and after them: the difference of the running totals. Floored, each mean stands for the
    middle of its µs. A node the last run before the window did not execute has no total before."""
    before = warmup * (mean_before + 0.5) if mean_before is not None else 0.0
    return max((warmup + iterations) * (mean_after + 0.5) - before, 0.0)


def paced_window(
    call: Callable[[], object],
    executed: Callable[[], dict[str, tuple[str, str, float]]],
    iterations: int,
    pace_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Window:
    """The nodes' times over a window of at least `iterations` runs of `call`, read through `executed()` (node ->
    (type, kernel, running mean µs) for the nodes the last run executed). Without `pace_s`: after `WARMUP` runs,
    one window of `iterations`. With it: warmed up until the last three runs' median keeps the pace (at most
    `SETTLE_MAX_S`), and each window at least as long as the runs before it (within `SETTLE_MAX_S`), taken again
    while it ran slower than the pace; the quickest window is kept. `clock`: seconds, for the runs' wall time."""

    def run() -> float:
        start = clock()
        call()
        return clock() - start

    walls = [run() for _ in range(WARMUP)]
    done = WARMUP
    limit = pace_s * PACE_SLACK + PACE_EXTRA_S if pace_s else None
    if limit is not None:
        settle_start = clock()
        while np.median(walls[-3:]) > limit and clock() - settle_start < SETTLE_MAX_S:
            walls.append(run())
            done += 1
    best: Window | None = None
    for _ in range(WINDOWS if limit is not None else 1):
        size = iterations if limit is None else max(iterations, min(done, int(SETTLE_MAX_S / pace_s)))
        before = executed()
        window = [run() for _ in range(size)]
        after = executed()
        nodes = {
            name: (node_type, kernel, timed_total_us(before[name][2] if name in before else None, mean, done, size))
            for name, (node_type, kernel, mean) in after.items()
        }
        done += size
        got = Window(size, sum(window) * 1e6, float(np.median(window)), nodes)
        if best is None or got.median_s < best.median_s:
            best = got
        if limit is None or got.median_s <= limit:
            break
    return best


def executed_nodes(request) -> dict[str, tuple[str, str, float]]:
    """node -> (type, kernel, running mean µs) for the nodes the request's last run executed."""
    return {
        info.node_name: (info.node_type, info.exec_type, info.real_time.total_seconds() * 1e6)
        for info in request.get_profiling_info()
        if str(info.status) == "Status.EXECUTED"
    }
