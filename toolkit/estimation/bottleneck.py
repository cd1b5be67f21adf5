"""Where the time goes and how far each op is from what the hardware could do.

From the on-target per-op profile (each runtime op is a kernel as the runtime fused it) and the
device's roofs: per op, achieved FLOP/s and bytes/s, the share of the roof reached, and a class:

- compute-bound: the compute roof is the higher one and the op reaches ≥ 10 % of it;
- memory-bound: the bandwidth roof is the higher one and the op reaches ≥ 10 % of it;
- overhead-bound: the op takes over 10× its roofline time (launch, dispatch, copies, a tiny tensor
  a kernel cannot fill the machine with): faster arithmetic or memory would not help it.

Also: the share of the run spent outside any op (framework, synchronisation), and chains of
consecutive bandwidth- or overhead-bound ops, each reading what the previous one wrote, with the
time a fused kernel would save: their measured time less one pass over the chain's input and
output at the bandwidth limit. That is the list of kernels worth writing next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tapeout.estimation.cost_units import op_class
from tapeout.estimation.roofline import Roof

OVERHEAD_RATIO = 10.0  # measured / roofline time beyond which an op is overhead-bound


@dataclass(frozen=True)
class OpBound:
    node: str
    op_type: str
    cls: str
    precision: str
    mean_us: float
    share: float
    flops: int | None
    bytes: int | None
    achieved_gflops: float | None
    achieved_gbs: float | None
    roof_share: float | None  # roofline time / measured time (1.0 = at the roof)
    bound: str  # compute | memory | overhead | unknown

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "op_type": self.op_type,
            "class": self.cls,
            "precision": self.precision,
            "mean_us": self.mean_us,
            "share": self.share,
            "flops": self.flops,
            "bytes": self.bytes,
            "intensity": self.flops / self.bytes if self.flops is not None and self.bytes else None,
            "achieved_gflops": self.achieved_gflops,
            "achieved_gbs": self.achieved_gbs,
            "roof_share": self.roof_share,
            "bound": self.bound,
        }


def classify(op: dict[str, Any], runs: int, kernel_total_us: float, roof: Roof) -> OpBound:
    mean = op["total_us"] / max(runs, 1)
    seconds = mean * 1e-6
    flops = op.get("flops")
    nbytes = None if op.get("in_bytes") is None or op.get("out_bytes") is None else op["in_bytes"] + op["out_bytes"]
    peak, _ = roof.peak(op.get("precision") or "fp32")
    compute = flops / peak if flops is not None and peak else None
    # at the rate of the cache level its own bytes fit in (a host's measured caches; a spec's DRAM bandwidth)
    rate = roof.bandwidth_at(nbytes) if nbytes is not None else None
    memory = nbytes / rate if nbytes is not None and rate else None
    known = [t for t in (compute, memory) if t is not None]
    if not known or seconds <= 0:
        bound, share = "unknown", None
    else:
        share = max(known) / seconds
        if share * OVERHEAD_RATIO < 1:
            bound = "overhead"
        elif compute is not None and (memory is None or compute >= memory):
            bound = "compute"
        else:
            bound = "memory"
    return OpBound(
        op["node"],
        op["op_type"],
        op_class(op["op_type"]),
        op.get("precision") or "",
        mean,
        op["total_us"] / kernel_total_us if kernel_total_us else 0.0,
        flops,
        nbytes,
        flops / seconds / 1e9 if flops is not None and seconds > 0 else None,
        nbytes / seconds / 1e9 if nbytes is not None and seconds > 0 else None,
        share,
        bound,
    )


def profiler_scale(op_profile: dict[str, Any], p50_ms: float | None) -> float:
    """What the profiled op times are multiplied by to stand for the timed run: 1, unless they add up to
    more than the timed p50, then down to it. A profiler's own cost is per op, not a share of the run, and
    falls mostly between the ops' recorded intervals (ORT #20238: the run is slower with profiling on): on
    the 2-core host here, a chain of 64 tiny Adds ran 22.9 µs a run unprofiled and 361 µs profiled, yet
    each Add's recorded interval was 2 µs. Scaling every op by p50 / profiled run (as before) shrank a toy
    model's ops to an eighth and priced the profiler's gaps as time outside the ops; where the recorded
    intervals themselves outgrow the run (many sub-µs ops, each read as ~2 µs), the p50 caps them."""
    runs = op_profile.get("runs") or 1
    in_ops_us = sum(o["total_us"] for o in op_profile.get("ops") or op_profile.get("op_types") or []) / runs
    if not p50_ms or in_ops_us <= 0:
        return 1.0
    return min(1.0, p50_ms * 1e3 / in_ops_us)


def view(op_profile: dict[str, Any] | None, roof: Roof, p50_ms: float | None = None) -> dict[str, Any] | None:
    """The bottleneck view of a report's op profile, or None where the profile lists no ops."""
    if not op_profile or not op_profile.get("ops"):
        return None
    runs = op_profile.get("runs") or 1
    scale = profiler_scale(op_profile, p50_ms)
    ops = [{**o, "total_us": o["total_us"] * scale} for o in op_profile["ops"]]
    kernel_total = sum(o["total_us"] for o in ops)
    bounds = [classify(o, runs, kernel_total, roof) for o in ops]
    by_bound: dict[str, dict[str, float]] = {}
    for b in bounds:
        entry = by_bound.setdefault(b.bound, {"ops": 0, "share": 0.0})
        entry["ops"] += 1
        entry["share"] += b.share
    chains = fusible_chains(ops, bounds, roof, runs)
    return {
        "roof": roof.to_json(),
        "method": f"per op: roofline time max(FLOPs / peak, bytes / the bandwidth of the cache level they fit in) "
        "against the measured mean; "
        f"overhead-bound past {OVERHEAD_RATIO:g}× the roofline time; FLOPs and bytes from the profiler's "
        "recorded shapes and sizes (ops whose weights were prepacked have no FLOP count)",
        # against the timed run where there is one: the profiled run's gaps are mostly the profiler's own
        "outside_ops_share": (
            max(0.0, 1 - kernel_total / runs / (p50_ms * 1e3)) if p50_ms else op_profile.get("overhead_share")
        ),
        "by_bound": by_bound,
        "ops": [b.to_json() for b in sorted(bounds, key=lambda b: -b.share)],
        "fusible_chains": chains,
        "fusible_saving_us": sum(c["saving_us"] for c in chains),
        "p50_ms": p50_ms,
        "profiler_scale": scale,
    }


def fusible_chains(ops: list[dict], bounds: list[OpBound], roof: Roof, runs: int, min_len: int = 2) -> list[dict]:
    """Runs of consecutive memory- or overhead-bound non-GEMM ops in execution order, each consuming a
    tensor shaped like one the previous op produced (the profile records shapes, not tensor names)."""
    chains: list[list[int]] = []
    current: list[int] = []
    for i, b in enumerate(bounds):
        fusible = b.bound in ("memory", "overhead") and b.cls not in ("conv", "matmul")
        linked = bool(current) and _links(ops[current[-1]], ops[i])
        if fusible and (not current or linked):
            current.append(i)
            continue
        if len(current) >= min_len:
            chains.append(current)
        current = [i] if fusible else []
    if len(current) >= min_len:
        chains.append(current)
    out = []
    for chain in chains:
        measured = sum(bounds[i].mean_us for i in chain)
        first, last = ops[chain[0]], ops[chain[-1]]
        io = (first.get("in_bytes") or 0) + (last.get("out_bytes") or 0)
        fused = io / roof.bandwidth * 1e6 if roof.bandwidth else 0.0
        out.append(
            {
                "ops": [ops[i]["node"] for i in chain],
                "op_types": [ops[i]["op_type"] for i in chain],
                "measured_us": measured,
                "fused_us": fused,
                "saving_us": max(measured - fused, 0.0),
            }
        )
    return sorted(out, key=lambda c: -c["saving_us"])


def _links(previous: dict, current: dict) -> bool:
    produced = {tuple(s) for s in previous.get("out_shapes") or []}
    return any(tuple(s) in produced for s in current.get("in_shapes") or [] if s)
