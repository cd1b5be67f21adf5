"""One model across several targets, one table; and what moved between two builds.

`compare` reads existing build dirs (never builds): for each, latency p50/p90 with bounds, memory,
energy, size and accuracy, each figure marked measured (on the device), emulated (timed through an
emulator or a stand-in: never judged) or estimated (no device here: the estimator's number). A
build with a check.json takes its figures from the check (measured on the device). Then the Pareto
front of accuracy against p50, and a recommendation: the fastest build whose budgets all hold,
measured before estimated.

`diff` says which figures moved beyond their noise between two reports: intervals that do not
overlap for latency, the process-to-process range for cold start and memory, exact values for
size and accuracy (deterministic given the build). A move under 1 % is never reported as one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tapeout.errors import BadInput
from tapeout.report_model import Report, load

SCHEMA = "tapeout.compare/1"
MIN_CHANGE = 0.01
_PASSING = {"pass", "estimated-pass"}


def resolve(items: list[Path], profiles: list[str]) -> list[Path]:
    """Build dirs from the arguments: build dirs as given, or one project with --profile names."""
    if profiles:
        if len(items) != 1:
            raise BadInput("--profile needs exactly one project", fix="tapeout compare PROJECT -p cpu-fp32 -p cpu-int8")
        from tapeout.config import load_project

        root = load_project(items[0]).root
        dirs = []
        for name in profiles:
            name = Path(name).stem
            found = next((d for d in (root / "build" / name, root / "build" / "fastest" / name)
                          if (d / "report.json").is_file()), None)
            if found is None:
                raise BadInput(f"no build of {root.name} for profile {name} (looked in build/{name} and "
                               f"build/fastest/{name})", fix=f"run `tapeout build {items[0]} -p {name}` first")
            dirs.append(found)
        return dirs
    for d in items:
        if not (d / "report.json").is_file():
            raise BadInput(f"{d} is not a build dir (no report.json)", fix="give build dirs `tapeout build` wrote, "
                           "or a project with --profile")
    return list(items)


def _reports(directory: Path) -> tuple[Report, Report | None]:
    check = directory / "check.json"
    return load(directory / "report.json"), load(check, "check report") if check.is_file() else None


def row(directory: Path) -> dict[str, Any]:
    build, check = _reports(directory)
    source = check or build
    data, built = source.to_json(), build.to_json()
    m = data["measurement"]
    emulated = data["target"].get("emulated")
    q = (m.get("latency_ms") or {}).get("quantiles") or {}
    latency: dict[str, Any] = {}
    status = "measured" if not emulated else "emulated"
    est = built.get("estimate") or {}
    predicted = est.get("predicted_ms") or {}
    for key in ("p50", "p90"):
        if emulated and predicted.get(key):
            p = predicted[key]
            latency[key] = {"point": p["point"], "lower": p["low"], "upper": p["high"]}
        elif emulated and est.get("lower_bound_ms") is not None:
            latency[key] = {"point": None, "lower": est["lower_bound_ms"], "upper": None}
        elif q.get(key):
            latency[key] = {k: q[key][k] for k in ("point", "lower", "upper")}
    if emulated and est:
        status = "estimated"
    energy = m.get("energy")
    acc = built.get("accuracy")
    budgets = data["budgets"]
    return {
        "build_dir": str(directory), "from": "check" if check else "build", "project": data["project"]["name"],
        "profile": data["profile"]["name"], "target": data["target"]["name"], "precision": data["profile"]["precision"],
        "device": data["profile"].get("device") or "this host", "latency_status": status,
        "emulated": emulated, "latency_ms": latency,
        "estimate_method": est.get("method") if status == "estimated" else None,
        "peak_rss_mb": None if emulated else (m.get("memory_mb") or {}).get("peak_rss"),
        "energy_mj": None if emulated or not energy else energy["mj_per_inference"],
        "artifact_mb": data["artifact"]["bytes"] / 2**20,
        "accuracy": None if not acc else {"metric": acc["metric"], "direction": acc["direction"],
                                          "reference": acc["reference"], "artifact": acc["artifact"]},
        "exit_code": data["exit_code"],
        "failed": [b["budget"] for b in budgets if b["verdict"] in ("fail", "estimated-fail", "inconclusive")],
        "unsettled": [b["budget"] for b in budgets if b["verdict"] not in _PASSING | {"fail", "estimated-fail",
                                                                                        "inconclusive"}],
        "estimated": [b["budget"] for b in budgets if b["verdict"].startswith("estimated")],
    }


def pareto(rows: list[dict]) -> list[str]:
    """Build dirs not beaten on both accuracy and p50 by another of the same metric."""
    points = []
    for r in rows:
        p50 = (r["latency_ms"].get("p50") or {}).get("point")
        acc = r["accuracy"]
        if p50 is None or not acc or acc["artifact"] is None:
            continue
        score = acc["artifact"] if acc["direction"] == "higher" else -acc["artifact"]
        points.append((r["build_dir"], acc["metric"], p50, score))
    front = []
    for d, metric, p50, score in points:
        beaten = any(m == metric and p <= p50 and s >= score and (p < p50 or s > score)
                     for d2, m, p, s in points if d2 != d)
        if not beaten:
            front.append(d)
    return front


def recommend(rows: list[dict]) -> tuple[dict | None, str]:
    # an emulator's timings are the host's, never the device's: they rank nothing (as in `build -p A -p B`)
    ok = [r for r in rows if not r["failed"] and not r["unsettled"] and r["latency_status"] != "emulated"
          and (r["latency_ms"].get("p50") or {}).get("point")]
    if not ok:
        return None, "no build meets all of its budgets with a latency to rank it by"
    measured = [r for r in ok if r["latency_status"] == "measured"]
    pool = measured or ok
    best = min(pool, key=lambda r: r["latency_ms"]["p50"]["point"])
    why = (f"{best['profile']}: the lowest p50 ({best['latency_ms']['p50']['point']:.4g} ms, "
           f"{best['latency_status']}) among the {len(pool)} builds whose budgets all hold")
    if not measured:
        why += "; every candidate is estimated: confirm with `tapeout check` on the device"
    elif len(ok) > len(measured):
        faster = [r for r in ok if r["latency_status"] != "measured"
                  and r["latency_ms"]["p50"]["point"] < best["latency_ms"]["p50"]["point"]]
        if faster:
            why += (f"; estimated faster but not measured: {', '.join(r['profile'] for r in faster)} "
                    "(check them on their devices)")
    return best, why


def compare(dirs: list[Path]) -> dict[str, Any]:
    """The table, and per project (a recommendation only compares builds of one model) its Pareto front
    and recommended build."""
    rows = [row(d) for d in dirs]
    projects: dict[str, list[dict]] = {}
    for r in rows:
        projects.setdefault(r["project"], []).append(r)
    front, recommended, why = [], [], []
    for name, group in projects.items():
        front += pareto(group)
        best, reason = recommend(group)
        recommended += [best["build_dir"]] if best else []
        why.append(f"{name}: {reason}" if len(projects) > 1 else reason)
    return {"schema": SCHEMA, "rows": rows, "pareto": front, "recommended": recommended, "why": "; ".join(why)}


def _interval(v: dict | None) -> str:
    if not v:
        return "—"
    if v.get("point") is None:
        return f"≥ {v['lower']:.4g}"
    upper = "∞" if v.get("upper") is None else f"{v['upper']:.4g}"
    return f"{v['point']:.4g} [{v['lower']:.4g}, {upper}]"


HEADER = ["build", "target", "prec", "device", "p50 ms", "p90 ms", "latency is", "RSS MB", "mJ", "MB", "accuracy",
          "exit", "note"]


def table_rows(result: dict) -> list[list[str]]:
    out = []
    for r in result["rows"]:
        acc = r["accuracy"]
        note = ("recommended" if r["build_dir"] in result["recommended"] else
                f"missed: {', '.join(r['failed'])}" if r["failed"] else
                f"unsettled: {', '.join(r['unsettled'])}" if r["unsettled"] else "")
        if r["build_dir"] in result["pareto"]:
            note = (note + "; " if note else "") + "Pareto"
        out.append([f"{r['project']}/{r['profile']}", r["target"], r["precision"], r["device"],
                    _interval(r["latency_ms"].get("p50")), _interval(r["latency_ms"].get("p90")), r["latency_status"],
                    "—" if r["peak_rss_mb"] is None else f"{r['peak_rss_mb']:.0f}",
                    "—" if r["energy_mj"] is None else f"{r['energy_mj']:.3g}", f"{r['artifact_mb']:.2f}",
                    f"{acc['metric']} {acc['artifact']:.4g}" if acc and acc["artifact"] is not None else "—",
                    str(r["exit_code"]), note])
    return out


def render_markdown(result: dict) -> str:
    lines = ["# tapeout compare", "", f"Recommendation: {result['why']}.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in table_rows(result)]
    lines += ["", "Latency: *measured* on the device; *emulated* through an emulator or stand-in (never judged); "
              "*estimated* by the roofline estimator (band from its calibration; ≥ a lower bound without one). "
              "Pareto: not beaten on both accuracy and p50 by a build with the same metric."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- diff


def _figures(report: Report) -> dict[str, tuple[float | None, float | None, float | None]]:
    """figure -> (point, low, high) where low/high is its noise range (None: exact)."""
    data = report.to_json()
    m = data["measurement"]
    out: dict[str, tuple] = {}
    if not data["target"].get("emulated"):
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
            why = ("intervals apart" if moved else "intervals apart, but under 1 %" if apart
                   else "intervals overlap: within noise")
        if name in _MACHINE_NAMES:
            why = ("the machine's own samples are apart: latency changes may be the machine's, not the build's"
                   if moved else f"the machine's own samples: {why}")
        rows.append({"figure": name, "a": pa, "b": pb, "change": change, "moved": moved, "why": why})
    return rows


# measurement.host_state: the machine's own speed, a median and the range of its samples
_MACHINE = (("host copy bandwidth GB/s", "bandwidth_gbs"), ("host FP32 matmul GFLOP/s", "fp32_gflops"))
_MACHINE_NAMES = {name for name, _ in _MACHINE}


def _host_state(report: Report) -> dict[str, tuple[float, float, float]]:
    # a report may come from elsewhere: only positive finite numbers are read (older reports have none)
    state = report.measurement.get("host_state")
    if not isinstance(state, dict):
        return {}
    out = {}
    for _, key in _MACHINE:
        point, bounds = state.get(key), state.get(f"{key}_range")
        if not isinstance(bounds, list) or len(bounds) != 2:
            continue
        if all(isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < float("inf")
               for v in (point, *bounds)):
            out[key] = (float(point), float(min(bounds)), float(max(bounds)))
    return out


def load_side(path: Path) -> Report:
    """A report for diff: a build dir (its report.json), or a report.json / check.json file."""
    if path.is_dir():
        path = path / "report.json"
    if not path.is_file():
        raise BadInput(f"{path} not found", fix="give build dirs, or report.json / check.json files")
    return load(path, "check report" if path.name == "check.json" else "report")


def render_diff(rows: list[dict], a: str, b: str) -> str:
    lines = ["# tapeout diff", "", f"A: `{a}`", f"B: `{b}`", "", "| figure | A | B | change | moved? |", "|---|---|---|---|---|"]
    for r in rows:
        change = "—" if r["change"] is None else f"{r['change']:+.1%}"
        lines.append(f"| {r['figure']} | {r['a']:.4g} | {r['b']:.4g} | {change} | "
                     f"{'**yes**' if r['moved'] else 'no'} ({r['why']}) |")
    return "\n".join(lines) + "\n"


def to_json(result: Any) -> str:
    return json.dumps(result, indent=2, default=str)
