"""What every backend module offers (DESIGN.md §5), and the small types they return.

A backend is one module under `targets/` exposing:
    Options                          pydantic model of the profile's [options] for this backend
    probe() -> Probe                 available here, or the reason and the install hint
    limits() -> RuntimeLimits        newest IR version and opset the runtime accepts
    lint(model_path, inputs, dims, options) -> list[LintIssue]
    compile(model_path, options, out_dir, inputs, dims) -> Artifact
    session(artifact, options) -> Session
    op_profile(artifact, options, feeds, iterations) -> OpProfile   (optional)
    preflight(options) -> None       (optional) raise TargetUnavailable before any work is done
Heavy runtimes are imported inside those functions, never at module import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from tapeout.errors import TargetUnavailable


@dataclass(frozen=True)
class Probe:
    available: bool
    version: str | None = None
    reason: str = ""
    install_hint: str = ""
    details: dict = field(default_factory=dict)

    def require(self, target: str) -> None:
        if not self.available:
            raise TargetUnavailable(f"target '{target}' is not available here: {self.reason}", fix=self.install_hint or None)


@dataclass(frozen=True)
class RuntimeLimits:
    max_ir_version: int
    max_opset: int


@dataclass(frozen=True)
class LintIssue:
    severity: Literal["error", "warning"]
    problem: str
    fix: str
    node: str | None = None

    def line(self) -> str:
        where = f"[{self.node}] " if self.node else ""
        return f"{self.severity}: {where}{self.problem} — {self.fix}"


class Session(Protocol):
    input_names: list[str]
    output_names: list[str]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def run_raw(self, feeds: dict[str, np.ndarray]) -> object:
        """The cheapest call that runs the model once; what the latency loop times."""
        ...


@dataclass(frozen=True)
class OpTime:
    node: str
    op_type: str
    provider: str
    calls: int
    total_us: float


@dataclass(frozen=True)
class OpProfile:
    """Per-node kernel times from an instrumented pass (never the pass budgets are judged on)."""

    runs: int
    run_total_us: float
    ops: list[OpTime]

    def by_op_type(self) -> list[dict]:
        totals: dict[tuple[str, str], list[float]] = {}
        for op in self.ops:
            entry = totals.setdefault((op.op_type, op.provider), [0, 0.0])
            entry[0] += op.calls
            entry[1] += op.total_us
        kernel_total = sum(v[1] for v in totals.values()) or 1.0
        rows = [
            {"op_type": k[0], "provider": k[1], "calls": v[0], "total_us": v[1], "share": v[1] / kernel_total}
            for k, v in totals.items()
        ]
        return sorted(rows, key=lambda r: -r["total_us"])

    def to_json(self, top: int = 30) -> dict:
        kernel_total = sum(op.total_us for op in self.ops)
        ops = sorted(self.ops, key=lambda o: -o.total_us)
        return {
            "runs": self.runs,
            "mean_run_us": self.run_total_us / self.runs if self.runs else None,
            "mean_kernel_us": kernel_total / self.runs if self.runs else None,
            "overhead_share": 1 - kernel_total / self.run_total_us if self.run_total_us else None,
            "op_types": self.by_op_type(),
            "top_ops": [
                {"node": o.node, "op_type": o.op_type, "provider": o.provider, "calls": o.calls,
                 "mean_us": o.total_us / max(o.calls, 1), "share": o.total_us / kernel_total if kernel_total else 0}
                for o in ops[:top]
            ],
            "node_count": len(self.ops),
        }


__all__ = ["LintIssue", "OpProfile", "OpTime", "Probe", "RuntimeLimits", "Session", "TargetUnavailable"]
