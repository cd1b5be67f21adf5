"""Time to first token and time per output token on a device, each phase of the generation loop priced like one call
(`estimate.estimate`: roofline per kernel, calibrated where measured) at its own shapes.

A generate build's cache graph is one graph at every length (core/decoding.py); what a call costs depends on them:

- prefill of P tokens (seq = P, past = 0): every weight read once for P tokens of FLOPs, so it turns
  compute-bound once P passes the device's ridge (FLOP per byte at which compute takes longer than bandwidth);
- a decode step at position t (seq = 1, past = t): every weight, and t positions of keys and values, read for one
  token's FLOPs: memory-bound on every device here, its time the bytes per token over the bandwidth.

The build keeps the kernel structure of each prompt length's prefill and of the decode step at the first position
the loop times and at max_context (structure.json `phases`). A decode step's kernels are affine in t (the cache
read, its copy and the attention's FLOPs grow with it, nothing else does), so the step at any position is the
line between the two. TPOT's quantiles are those of the positions the loop times (each prompt length's
new_tokens - 1 steps after its prompt), times the calibration's tails (p90/p50, p99/p50) where there is one;
TTFT is one prefill (the loop's choice of the token is an argmax over one row: not priced).

Each phase is priced as one call is (`estimate.estimate`), with the calibration where there is one. The band is its
held-out error on single calls of other models on this device and target. No generate loop went into it, so it is
the band of the per-call model the phases are priced with, and the report says so; where this run measured the
loop, the estimate's error against it is shown beside it (bench/estimator.py scores it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tapeout.estimation import cost_units as kern
from tapeout.estimation import roofline
from tapeout.records.structure import PhaseRecord, StructureRecord

PREFILL, DECODE = "prefill", "decode"


@dataclass(frozen=True)
class Phase:
    """One call of the loop at its shapes, as the kernels it runs (FP32 bytes, as structure.json keeps them)."""

    kind: str  # prefill | decode
    seq: int  # tokens in the call
    past: int  # positions already in the cache
    kernels: list[kern.Kernel]


def shapes(prompt_lengths: list[int], new_tokens: int, max_context: int) -> list[tuple[str, int, int]]:
    """(kind, seq, past) of every phase a build keeps: each prompt's prefill, the decode step at the first position
    timed and at max_context (one, where they coincide)."""
    out = [(PREFILL, n, 0) for n in sorted(prompt_lengths)]
    for past in sorted({min(prompt_lengths), max_context - 1}):
        out.append((DECODE, 1, past))
    return out


def structures(
    model: Path, inputs: list, dims: dict[str, int], workload, at_max: list[kern.Kernel], ui=None
) -> list[Phase]:
    """The phases of a generate workload's cache graph: the graph read again at each phase's shapes and its kernels
    found as the build's own (`at_max`: the decode step at max_context, which the build analysed already)."""
    from tapeout.graph.analyze import analyze_view
    from tapeout.graph.view import GraphView

    phases = []
    for kind, seq, past in shapes(workload.prompt_lengths, workload.new_tokens, workload.max_context):
        if (kind, seq, past) == (DECODE, dims.get("seq"), dims.get("past")):
            phases.append(Phase(kind, seq, past, at_max))
            continue
        if ui is not None:
            ui.detail(f"kernel structure of the {kind} call at seq {seq}, past {past}")
        context = {"context": past + seq} if "context" in dims else {}  # a masked graph's mask spans the cache
        view = GraphView.load(model, inputs, {**dims, "seq": seq, "past": past, **context})
        phases.append(Phase(kind, seq, past, kern.structure(view, analyze_view(view))))
        del view
    return phases


def to_records(phases: list[Phase]) -> list[PhaseRecord]:
    return [PhaseRecord(kind=p.kind, seq=p.seq, past=p.past, kernels=kern.unit_records(p.kernels)) for p in phases]


def from_record(structure: StructureRecord | None) -> list[Phase] | None:
    """The phases a verified structure.json holds; None where the build kept none (a forward workload)."""
    if structure is None or not structure.phases:
        return None
    return [Phase(p.kind, p.seq, p.past, kern.from_units(p.kernels)) for p in structure.phases]


# ---------------------------------------------------------------- pricing


@dataclass(frozen=True)
class PhaseCost:
    kind: str
    seq: int
    past: int
    lower_bound_s: float
    predicted_s: float | None
    flops: int
    bytes: float
    memory_bound_share: float  # of the roofline time, the share in kernels whose bytes take longer than their FLOPs

    def seconds(self, predicted: bool) -> float:
        return (self.predicted_s if predicted else None) or self.lower_bound_s

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "seq": self.seq,
            "past": self.past,
            "lower_bound_ms": self.lower_bound_s * 1e3,
            "predicted_ms": None if self.predicted_s is None else self.predicted_s * 1e3,
            "gflop": self.flops / 1e9,
            "mb": self.bytes / 2**20,
            "memory_bound_share": self.memory_bound_share,
        }


@dataclass
class GenerationEstimate:
    device: str
    prefill: list[PhaseCost]
    decode: list[PhaseCost]
    prompt_lengths: list[int]
    new_tokens: int
    batch: int
    band: tuple[float, float] | None = None
    tails: dict[str, float] = field(default_factory=dict)
    calibration: str | None = None

    @property
    def calibrated(self) -> bool:
        return self.calibration is not None

    @property
    def how(self) -> str:
        """What priced the phases: the device's calibration, or the roofline alone."""
        return "roofline lower bound" if self.calibration is None else "calibrated roofline"

    def _range(self, point: float) -> tuple[float, float, float]:
        lo, hi = self.band or (0.0, 0.0)
        return point, point / (1 + hi), point / max(1 + lo, 0.01)  # as Estimate.quantile_ms

    def step_s(self, past: float, predicted: bool) -> float:
        """A decode step at position `past`: the line through the two decode phases (one: its own time)."""
        if len(self.decode) == 1:
            return self.decode[0].seconds(predicted)
        a, b = self.decode[0], self.decode[-1]
        share = (past - a.past) / (b.past - a.past)
        return a.seconds(predicted) + share * (b.seconds(predicted) - a.seconds(predicted))

    def timed_positions(self) -> np.ndarray:
        """The position of every step the loop times: after each prompt, new_tokens - 1 of them."""
        return np.concatenate([np.arange(n, n + self.new_tokens - 1) for n in self.prompt_lengths] or [np.empty(0)])

    def ttft_ms(self, length: int, q: str = "p50") -> tuple[float, float, float] | None:
        """(point, low, high) predicted for the prefill of `length` tokens, or None without a calibration."""
        cost = next(p for p in self.prefill if p.seq == length)
        if cost.predicted_s is None:
            return None
        return self._range(cost.predicted_s * 1e3 * (1.0 if q == "p50" else self.tails.get(q, 1.0)))

    def ttft_bound_ms(self, length: int) -> float:
        return next(p for p in self.prefill if p.seq == length).lower_bound_s * 1e3

    def tpot_ms(self, q: str) -> tuple[float, float, float] | None:
        """(point, low, high) of the time per output token's quantile `q` over the timed positions, predicted; None
        without a calibration, or with no decode step timed (new_tokens = 1)."""
        positions = self.timed_positions()
        if not self.calibrated or positions.size == 0:
            return None
        at = float(np.quantile(positions, {"p50": 0.5, "p90": 0.9, "p99": 0.99}[q]))
        return self._range(self.step_s(at, True) * 1e3 * (1.0 if q == "p50" else self.tails.get(q, 1.0)))

    def tpot_bound_ms(self, q: str = "p50") -> float | None:
        positions = self.timed_positions()
        if positions.size == 0:
            return None
        return self.step_s(float(np.quantile(positions, {"p50": 0.5, "p90": 0.9, "p99": 0.99}[q])), False) * 1e3

    def to_json(self) -> dict:
        bound = self.tpot_bound_ms()
        predicted = self.tpot_ms("p50")
        return {
            "device": self.device,
            "method": (
                f"each phase's kernels priced as one call at its shapes ({self.how}); a decode step's time "
                "is the line between "
                "the steps at the first timed position and at max_context; TPOT over the positions timed"
            ),
            "calibration": self.calibration,
            "band": list(self.band) if self.band else None,
            "band_from": "the calibration's held-out error on single calls (no generate loop went into it)"
            if self.band
            else None,
            "ttft_ms": {
                str(p.seq): {
                    "lower_bound": p.lower_bound_s * 1e3,
                    "predicted": _triple(self.ttft_ms(p.seq)),
                    "phase": p.to_json(),
                }
                for p in self.prefill
            },
            "tpot_ms": {
                "lower_bound": {q: self.tpot_bound_ms(q) for q in ("p50", "p90", "p99")},
                "predicted": {q: _triple(self.tpot_ms(q)) for q in ("p50", "p90", "p99")} if predicted else None,
            },
            "decode_steps": [p.to_json() for p in self.decode],
            "decode_tokens_per_s": {
                "upper_bound": self.batch * 1e3 / bound if bound else None,
                "predicted": _triple(tuple(self.batch * 1e3 / v for v in (predicted[0], predicted[2], predicted[1])))
                if predicted
                else None,
            },
        }

    def line(self) -> str:
        longest = max(self.prompt_lengths)
        ttft, tpot = self.ttft_ms(longest), self.tpot_ms("p50")
        bound = self.tpot_bound_ms()
        if ttft is None:
            return (
                f"generation estimate for {self.device}: TTFT@{longest} ≥ {self.ttft_bound_ms(longest):.4g} ms"
                + (f" · TPOT ≥ {bound:.4g} ms ({self.batch * 1e3 / bound:.0f} tok/s at most)" if bound else "")
                + " (roofline lower bounds; no calibration)"
            )
        return (
            f"generation estimate for {self.device}: TTFT@{longest} p50 {ttft[0]:.4g} ms"
            + (f" · TPOT p50 {tpot[0]:.4g} ms" if tpot else "")
            + (f" [{tpot[1]:.4g}, {tpot[2]:.4g}]" if tpot and self.band else "")
            + f" ({self.how})"
        )


def _triple(value: tuple[float, float, float] | None) -> dict | None:
    return None if value is None else dict(zip(("point", "low", "high"), value, strict=True))


def price(
    phases: list[Phase],
    roof: roofline.Roof,
    target: str,
    precision: str,
    plan: dict | None,
    cal,
    workload,
    float_precision: str | None = None,
) -> GenerationEstimate:
    """The loop's phases on `roof` at the plan's precisions (float kernels at `float_precision`, by default the
    plan's), priced as `estimate.estimate` prices one call, calibrated with `cal` ((Calibration, path) or None)."""
    from tapeout.estimation.estimate import estimate

    costs, first = [], None
    for phase in phases:
        kernels = kern.at_precision(phase.kernels, plan, float_precision or kern.float_precision(precision, plan))
        est = estimate(kernels, roof, target, precision, cal)
        first = first or est
        times = kern.model_times(kernels, roof)
        total = sum(max(t) for t in times) or 1.0
        costs.append(
            PhaseCost(
                phase.kind,
                phase.seq,
                phase.past,
                est.lower_bound_s,
                est.predicted_s,
                sum(k.flops for k in kernels),
                sum(k.bytes for k in kernels),
                sum(max(t) for t in times if t[1] >= t[0]) / total,
            )
        )
    return GenerationEstimate(
        roof.name,
        [c for c in costs if c.kind == PREFILL],
        [c for c in costs if c.kind == DECODE],
        sorted(workload.prompt_lengths),
        workload.new_tokens,
        workload.batch,
        band=first.band if first else None,
        tails=first.tails if first else {},
        calibration=first.calibration if first else None,
    )


def with_measured(est: GenerationEstimate, measured: dict | None) -> dict[str, Any]:
    """The estimate's JSON with this run's measured TTFT p50 per length and TPOT p50 beside it, and the estimate's
    error against each (predicted where calibrated, else the lower bound's, which a measurement should not beat
    unless the weights stay in a cache between calls)."""
    data = est.to_json()
    if not measured:
        return data
    rows = []
    for length, entry in data["ttft_ms"].items():
        got = ((measured.get("ttft_ms") or {}).get(length) or {}).get("quantiles", {}).get("p50", {}).get("point")
        value = (entry["predicted"] or {}).get("point") or entry["lower_bound"]
        rows.append(
            {
                "what": f"TTFT@{length} p50",
                "estimated_ms": value,
                "measured_ms": got,
                "error": value / got - 1 if got else None,
                "of": "predicted" if entry["predicted"] else "bound",
                **_of_floor(got, entry["lower_bound"]),
            }
        )
    got = ((measured.get("tpot_ms") or {}).get("quantiles") or {}).get("p50", {}).get("point")
    predicted = (data["tpot_ms"]["predicted"] or {}).get("p50")
    value = predicted["point"] if predicted else data["tpot_ms"]["lower_bound"]["p50"]
    if value is not None:
        rows.append(
            {
                "what": "TPOT p50",
                "estimated_ms": value,
                "measured_ms": got,
                "error": value / got - 1 if got else None,
                "of": "predicted" if predicted else "bound",
                **_of_floor(got, data["tpot_ms"]["lower_bound"]["p50"]),
            }
        )
    data["measured"] = rows
    return data


def _of_floor(measured_ms: float | None, bound_ms: float | None) -> dict[str, float | None]:
    """The roofline's floor and the measurement as a multiple of it (a decode step's floor: every byte it reads,
    weights and cache, over the bandwidth)."""
    if not bound_ms or bound_ms <= 0:
        return {"bound_ms": None, "of_bound": None}
    return {"bound_ms": bound_ms, "of_bound": measured_ms / bound_ms if measured_ms else None}
