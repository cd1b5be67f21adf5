"""`tapeout diff`: which figures moved beyond their noise between two reports: intervals that do not
overlap for latency, the process-to-process range for cold start and memory, exact values for size and
accuracy (deterministic given the build). A move under 1 % is never reported as one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tapeout.builds.reader import open_report
from tapeout.core import workload
from tapeout.records.report import Report

MIN_CHANGE = 0.01


def _figures(report: Report) -> dict[str, tuple[float | None, float | None, float | None]]:
    """figure -> (point, low, high) where low/high is its noise range (None: exact)."""
    data = report.to_json()
    m = data["measurement"]
    out: dict[str, tuple] = {}
    timed = not data["target"].get("emulated")
    if timed:
        for key, q in ((m.get("latency_ms") or {}).get("quantiles") or {}).items():
            out[f"latency {key} ms"] = (q["point"], q["lower"], q["upper"])
        cold = m.get("cold_start_ms") or {}
        if cold.get("per_repeat"):
            out["cold start ms"] = (cold["median"], min(cold["per_repeat"]), max(cold["per_repeat"]))
        mem = m.get("memory_mb") or {}
        if mem.get("peak_rss_per_repeat"):
            out["peak RSS MB"] = (mem["peak_rss"], min(mem["peak_rss_per_repeat"]), max(mem["peak_rss_per_repeat"]))
        energy = m.get("energy")
        if energy:
            out["energy mJ"] = (energy["mj_per_inference"], *energy["mj_bounds"])
    w = data.get("workload")
    if w:  # the loop's figures, with the same bounds its verdicts use; the timed ones where they are the device's
        out.update(workload.get(w["kind"]).diff_figures(w, timed))
    out["artifact MB"] = (data["artifact"]["bytes"] / 2**20, None, None)
    for p in data["parity"]:
        out[f"parity cosine {p['output']}"] = (p["cosine"], None, None)
    acc = data.get("accuracy")
    if acc and acc.get("artifact") is not None:
        out[f"accuracy {acc['metric']}"] = (acc["artifact"], None, None)
    for name, key in _MACHINE:  # the machine's own speed beside the measurement (its samples' range)
        if key in (state := _host_state(report)):
            out[name] = state[key]
    return out


def diff(a: Report, b: Report) -> list[dict[str, Any]]:
    fa, fb = _figures(a), _figures(b)
    rows = []
    for name in [n for n in fa if n in fb]:
        (pa, la, ha), (pb, lb, hb) = fa[name], fb[name]
        if pa is None or pb is None:
            continue
        change = (pb - pa) / abs(pa) if pa else None
        if la is None or lb is None:
            moved = abs(pb - pa) > 1e-9 * max(abs(pa), 1.0)
            why = "exact figure" + (" changed" if moved else ": unchanged")
        else:
            ha = float("inf") if ha is None else ha
            hb = float("inf") if hb is None else hb
            apart = lb > ha or la > hb
            # apart, and by more than a percent: RSS ranges over identical processes can be a few kB wide
            moved = apart and (change is None or abs(change) >= MIN_CHANGE)
            why = (
                "intervals apart"
                if moved
                else "intervals apart, but under 1 %"
                if apart
                else "intervals overlap: within noise"
            )
        if name in _MACHINE_NAMES:
            why = (
                "the machine's own samples are apart: latency changes may be the machine's, not the build's"
                if moved
                else f"the machine's own samples: {why}"
            )
        rows.append({"figure": name, "a": pa, "b": pb, "change": change, "moved": moved, "why": why})
    return rows


# measurement.host_state: the machine's own speed, a median and the range of its samples
_MACHINE = (("host copy bandwidth GB/s", "bandwidth_gbs"), ("host FP32 matmul GFLOP/s", "fp32_gflops"))


_MACHINE_NAMES = {name for name, _ in _MACHINE}


def _host_state(report: Report) -> dict[str, tuple[float, float, float]]:
    # a report may come from elsewhere: only positive finite numbers are read (older reports have none)
    state = report.to_json()["measurement"].get("host_state")
    if not isinstance(state, dict):
        return {}
    out = {}
    for _, key in _MACHINE:
        point, bounds = state.get(key), state.get(f"{key}_range")
        if not isinstance(bounds, list) or len(bounds) != 2:
            continue
        if all(
            isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < float("inf") for v in (point, *bounds)
        ):
            out[key] = (float(point), float(min(bounds)), float(max(bounds)))
    return out


def load_side(path: Path) -> Report:
    """A report for diff: a build dir (its report.json), or a report.json / check.json inside one, verified
    against the build dir's records."""
    return open_report(path)[0]


def render_diff(rows: list[dict], a: str, b: str) -> str:
    lines = [
        "# tapeout diff",
        "",
        f"A: `{a}`",
        f"B: `{b}`",
        "",
        "| figure | A | B | change | moved? |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        change = "—" if r["change"] is None else f"{r['change']:+.1%}"
        lines.append(
            f"| {r['figure']} | {r['a']:.4g} | {r['b']:.4g} | {change} | "
            f"{'**yes**' if r['moved'] else 'no'} ({r['why']}) |"
        )
    return "\n".join(lines) + "\n"
