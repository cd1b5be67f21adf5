"""One model across several targets, one table (`tapeout compare`).

`compare` reads existing build dirs (never builds): for each, latency p50/p90 with bounds, memory,
energy, size and accuracy, each figure marked measured (on the device), emulated (timed through an
emulator or a stand-in: never judged) or estimated (no device here: the estimator's number). A
build with a check.json takes its figures from the check (measured on the device). Then the Pareto
front of accuracy against p50, and a recommendation: the fastest build whose budgets all hold,
measured before estimated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tapeout.builds.reader import open_build
from tapeout.core import workload
from tapeout.core.errors import BadInput

SCHEMA = "tapeout.compare/1"


_PASSING = {"pass", "estimated-pass"}


def resolve(items: list[Path], profiles: list[str]) -> list[Path]:
    """Build dirs from the arguments: build dirs as given, or one project with --profile names."""
    if profiles:
        if len(items) != 1:
            raise BadInput("--profile needs exactly one project", fix="tapeout compare PROJECT -p cpu-fp32 -p cpu-int8")
        from tapeout.core.config import load_project

        root = load_project(items[0]).root
        dirs = []
        for name in profiles:
            name = Path(name).stem
            found = next(
                (
                    d
                    for d in (root / "build" / name, root / "build" / "fastest" / name)
                    if (d / "report.json").is_file()
                ),
                None,
            )
            if found is None:
                raise BadInput(
                    f"no build of {root.name} for profile {name} (looked in build/{name} and build/fastest/{name})",
                    fix=f"run `tapeout build {items[0]} -p {name}` first",
                )
            dirs.append(found)
        return dirs
    for d in items:
        if not (d / "report.json").is_file():
            raise BadInput(
                f"{d} is not a build dir (no report.json)",
                fix="give build dirs `tapeout build` wrote, or a project with --profile",
            )
    return list(items)


def row(directory: Path) -> dict[str, Any]:
    opened = open_build(directory)  # the build's report and its check, each verified against its record
    build, check = opened.report, opened.check_report
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
        "build_dir": str(directory),
        "from": "check" if check else "build",
        "project": data["project"]["name"],
        "profile": data["profile"]["name"],
        "target": data["target"]["name"],
        "precision": data["profile"]["precision"],
        "device": data["profile"].get("device") or "this host",
        "latency_status": status,
        "emulated": emulated,
        "latency_ms": latency,
        "estimate_method": est.get("method") if status == "estimated" else None,
        "peak_rss_mb": None if emulated else (m.get("memory_mb") or {}).get("peak_rss"),
        "energy_mj": None if emulated or not energy else energy["mj_per_inference"],
        "artifact_mb": data["artifact"]["bytes"] / 2**20,
        "accuracy": None
        if not acc
        else {
            "metric": acc["metric"],
            "direction": acc["direction"],
            "reference": acc["reference"],
            "artifact": acc["artifact"],
        },
        **_loop_headlines(data.get("workload"), emulated),
        "exit_code": data["exit_code"],
        "failed": [b["budget"] for b in budgets if b["verdict"] in ("fail", "estimated-fail", "inconclusive")],
        "unsettled": [
            b["budget"] for b in budgets if b["verdict"] not in _PASSING | {"fail", "estimated-fail", "inconclusive"}
        ],
        "estimated": [b["budget"] for b in budgets if b["verdict"].startswith("estimated")],
    }


def _loop_headlines(w: dict | None, emulated: str | None) -> dict[str, dict | None]:
    """A row's key per built-in workload kind that runs a loop, and the build's own kind: its loop's headline figures
    under its kind, None under the others."""
    ran = w["kind"] if w else None
    kinds = dict.fromkeys([*workload.BUILT_IN, *([ran] if ran else [])])
    return {
        kind: workload.get(kind).headline(w, emulated) if kind == ran else None
        for kind in kinds
        if workload.get(kind).loop_name is not None
    }


def _headlines(r: dict) -> list[tuple[str, dict]]:
    """The (kind, headline) a row holds: its loop's, where the build ran one."""
    kinds = set(workload.kinds())  # names only: nothing is imported to list them
    return [(kind, h) for kind, h in r.items() if kind in kinds and isinstance(h, dict) and h]


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
        beaten = any(
            m == metric and p <= p50 and s >= score and (p < p50 or s > score) for d2, m, p, s in points if d2 != d
        )
        if not beaten:
            front.append(d)
    return front


def rank_of(r: dict) -> tuple[float | None, str]:
    """What a build is ranked by, and its name: a forward build's p50; a generation's time per token (p50); a
    stream's chunk time (p99, what a real-time budget judges)."""
    p50 = (r["latency_ms"].get("p50") or {}).get("point")
    if p50:
        return p50, "p50"
    for kind, headline in _headlines(r):
        ranked = workload.get(kind).rank(headline)
        if ranked is not None:
            return ranked
    return None, ""


def recommend(rows: list[dict]) -> tuple[dict | None, str]:
    """The fastest build whose budgets all hold, as `build -p A -p B` chooses and the exit code says: a budget that
    fails or stays inconclusive rules a build out; one left unmeasured (an accuracy budget with no metric) is named,
    not held against it."""
    # an emulator's timings are the host's, never the device's: they rank nothing (as in `build -p A -p B`)
    ok = [r for r in rows if not r["failed"] and r["latency_status"] != "emulated" and rank_of(r)[0]]
    if not ok:
        return None, "no build meets all of its budgets with a latency to rank it by"
    measured = [r for r in ok if r["latency_status"] == "measured"]
    pool = measured or ok
    best = min(pool, key=lambda r: rank_of(r)[0])
    value, what = rank_of(best)
    why = (
        f"{best['profile']}: the lowest {what} ({value:.4g} ms, {best['latency_status']}) among the {len(pool)} "
        "builds whose budgets all hold"
    )
    if best["unsettled"]:
        why += f" (unmeasured: {', '.join(best['unsettled'])})"
    if not measured:
        why += "; every candidate is estimated: confirm with `tapeout check` on the device"
    elif len(ok) > len(measured):
        faster = [r for r in ok if r["latency_status"] != "measured" and rank_of(r)[0] < value]
        if faster:
            why += (
                f"; estimated faster but not measured: {', '.join(r['profile'] for r in faster)} "
                "(check them on their devices)"
            )
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


HEADER = [
    "build",
    "target",
    "prec",
    "device",
    "p50 ms",
    "p90 ms",
    "latency is",
    "RSS MB",
    "mJ",
    "MB",
    "accuracy",
    "exit",
    "note",
    "workload",
]


def table_rows(result: dict) -> list[list[str]]:
    out = []
    for r in result["rows"]:
        acc = r["accuracy"]
        note = (
            "recommended"
            if r["build_dir"] in result["recommended"]
            else f"missed: {', '.join(r['failed'])}"
            if r["failed"]
            else f"unsettled: {', '.join(r['unsettled'])}"
            if r["unsettled"]
            else ""
        )
        if r["build_dir"] in result["pareto"]:
            note = (note + "; " if note else "") + "Pareto"
        out.append(
            [
                f"{r['project']}/{r['profile']}",
                r["target"],
                r["precision"],
                r["device"],
                _interval(r["latency_ms"].get("p50")),
                _interval(r["latency_ms"].get("p90")),
                r["latency_status"],
                "—" if r["peak_rss_mb"] is None else f"{r['peak_rss_mb']:.0f}",
                "—" if r["energy_mj"] is None else f"{r['energy_mj']:.3g}",
                f"{r['artifact_mb']:.2f}",
                f"{acc['metric']} {acc['artifact']:.4g}" if acc and acc["artifact"] is not None else "—",
                str(r["exit_code"]),
                note,
                next((workload.get(kind).headline_cell(h) for kind, h in _headlines(r)), "—"),
            ]
        )
    return out


def render_markdown(result: dict) -> str:
    lines = [
        "# tapeout compare",
        "",
        f"Recommendation: {result['why']}.",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in table_rows(result)]
    lines += [
        "",
        "Latency: *measured* on the device; *emulated* through an emulator or stand-in (never judged); "
        "*estimated* by the roofline estimator (band from its calibration; ≥ a lower bound without one). "
        "Pareto: not beaten on both accuracy and p50 by a build with the same metric.",
    ]
    return "\n".join(lines) + "\n"


def to_json(result: Any) -> str:
    return json.dumps(result, indent=2, default=str)
