"""Workload `sweep`: the model called on its golden inputs one after another, `calls` calls a sequence, timed as a
whole sequence in fresh processes: what a batch job over frames costs end to end. Registered from outside
tapeout: one module, one entry point. It runs wherever a single call runs (the target's session), records the
golden inputs it replays, and judges its one budget, `max_sequence_ms`, a setting of its own [workload] table."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from tapeout.core.schemas import WorkloadSettings
from tapeout.core.verdict import BudgetResult, Verdict
from tapeout.core.workload import WORKLOAD_FILE, Workload


class SweepSettings(WorkloadSettings):
    kind: Literal["sweep"]
    calls: int = Field(8, ge=2, le=10_000, description="calls in one timed sequence")
    trials: int = Field(5, ge=1, le=1000, description="timed sequences in each measuring process")
    max_sequence_ms: float | None = Field(None, gt=0, description="budget: the slowest timed sequence")


@dataclass
class SweepMeasurement:
    calls: int
    sequence_ms: list[float]
    budget_ms: float | None

    def to_json(self) -> dict:
        ms = np.asarray(self.sequence_ms)
        return {
            "kind": "sweep",
            "calls": self.calls,
            "sequences": len(ms),
            "sequence_ms": {"median": float(np.median(ms)), "min": float(ms.min()), "max": float(ms.max())},
            "calls_per_s": float(self.calls / np.median(ms) * 1e3),
        }


class Sweep(Workload):
    kind = "sweep"
    settings = SweepSettings
    loop_name = "sweep"
    heading = "Sweep"

    def runs_on(self, capabilities) -> bool:
        return "forward" in capabilities.workloads  # a sequence of single calls: every target's Session.run

    def record(self, state) -> Path:
        path = state.out / WORKLOAD_FILE
        np.savez(path, **{name: value for name, value in state.golden.inputs[0].items()})
        return path

    def measure(self, state) -> SweepMeasurement:
        from tapeout.measurement.measure import artifact_request, run_child

        settings, _, path = self.loop_data(state)
        request = {
            "mode": self.kind,
            **artifact_request(state.setup.target, state.artifact),
            "workload": settings.model_dump(mode="json"),
            "workload_data": str(path),
        }
        with state.ui.step(f"sweep: {settings.trials} sequences × {settings.calls} calls, in fresh processes"):
            results = [run_child(request, timeout_s=600) for _ in range(state.settings.repeats)]
        return SweepMeasurement(settings.calls, [t for r in results for t in r["sweep"]], settings.max_sequence_ms)

    def child(self, request: dict) -> dict:
        import time

        from tapeout.measurement.runner import workload_frame

        with np.load(request["workload_data"]) as data:
            feeds = {k: data[k] for k in data.files}
        calls, trials = request["workload"]["calls"], request["workload"]["trials"]

        def first(session) -> float:
            started = time.perf_counter()
            session.run(feeds)
            return (time.perf_counter() - started) * 1e3

        def sequences(session) -> dict:
            timed = []
            for _ in range(trials):
                started = time.perf_counter()
                for _ in range(calls):
                    session.run(feeds)
                timed.append((time.perf_counter() - started) * 1e3)
            return {"sweep": timed}

        return workload_frame(request, lambda session: session, first, sequences)

    def judge(self, budgets, result, settings, emulated) -> list[BudgetResult]:
        if result is None or result.budget_ms is None:
            return []
        slowest = max(result.sequence_ms)
        verdict = Verdict.PASS if slowest <= result.budget_ms else Verdict.FAIL
        return [
            BudgetResult(
                "max_sequence_ms",
                result.budget_ms,
                "ms",
                verdict,
                measured=slowest,
                reason=f"the slowest of {len(result.sequence_ms)} sequences of {result.calls} calls",
            )
        ]

    def markdown(self, section: dict, emulated: str | None) -> list[str]:
        ms = section["sequence_ms"]
        return [
            "",
            "## Sweep (the golden input, call after call, fresh processes)",
            "",
            f"{section['sequences']} sequences of {section['calls']} calls: median {ms['median']:.3f} ms "
            f"(min {ms['min']:.3f}, max {ms['max']:.3f}), {section['calls_per_s']:.0f} calls/s.",
        ]

    def one_line(self, section: dict, estimate: dict | None) -> str:
        return f"sweep: {section['calls']} calls in {section['sequence_ms']['median']:.3f} ms (median)"


WORKLOAD = Sweep()
