"""The fastest build that meets its budgets, among several profiles for one project.

`tapeout build PROJECT -p cpu-int8 -p openvino-cpu-int8` builds the project once per profile, one
after another on this host, each into OUT/<profile>/ as a complete build dir (its own report,
manifest and artifact, checkable on its own). The chosen build is the one whose budgets all pass
(exit 0) with the lowest p50 latency; choice.json and choice.md beside the build dirs hold every
candidate's row, the choice and why. Emulated targets never win: their timings are not the
device's. Each candidate is judged by its own profile's budgets, so the choice says when those
differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tapeout.core.errors import TapeoutError, one_line

SCHEMA = "tapeout.choice/1"


CHOICE_FILE = "choice.json"


def candidate_row(name: str, build_dir: Path, report=None, error: TapeoutError | None = None) -> dict[str, Any]:
    if report is None:
        return {
            "profile": name,
            "build_dir": str(build_dir),
            "exit_code": error.exit_code,
            "error": one_line(str(error)),
            "target": None,
            "precision": None,
            "p50_ms": None,
            "emulated": False,
            "accuracy": None,
            "artifact_bytes": None,
            "budgets": {},
            "failed": [],
        }
    data = report.to_json()
    latency = data["measurement"].get("latency_ms") or {}
    p50 = (latency.get("quantiles") or {}).get("p50")
    accuracy = data.get("accuracy")
    return {
        "profile": name,
        "build_dir": str(build_dir),
        "exit_code": report.exit_code,
        "error": None,
        "target": data["target"]["name"],
        "precision": data["profile"]["precision"],
        "p50_ms": {k: p50[k] for k in ("point", "lower", "upper")} if p50 else None,
        "emulated": bool(data["target"].get("emulated")),
        "accuracy": {k: accuracy[k] for k in ("metric", "reference", "artifact")} if accuracy else None,
        "artifact_bytes": data["artifact"]["bytes"],
        "budgets": {b["budget"]: b["limit"] for b in data["budgets"]},
        "failed": [b["budget"] for b in data["budgets"] if b["verdict"] in ("fail", "estimated-fail", "inconclusive")],
    }


def pick(rows: list[dict]) -> tuple[dict | None, list[str]]:
    """The passing, timed, not emulated row with the lowest p50; and what a reader should know about it."""
    notes = []
    eligible = [r for r in rows if r["exit_code"] == 0 and r["p50_ms"] and not r["emulated"]]
    if not eligible:
        return None, ["no candidate met all of its budgets with a measured latency"]
    eligible.sort(key=lambda r: r["p50_ms"]["point"])
    best = eligible[0]
    if len(eligible) > 1:
        second = eligible[1]
        upper = best["p50_ms"]["upper"]
        if upper is not None and second["p50_ms"]["lower"] is not None and second["p50_ms"]["lower"] <= upper:
            notes.append(
                f"the p50 intervals of {best['profile']} and {second['profile']} overlap: the two are not "
                "told apart at this confidence; the lower point estimate was kept"
            )
        else:
            notes.append(
                f"{best['profile']} is {second['p50_ms']['point'] / best['p50_ms']['point']:.2f}× faster at "
                f"p50 than {second['profile']}, the intervals apart"
            )
    budget_sets = {tuple(sorted(r["budgets"].items())) for r in rows if r["error"] is None}
    if len(budget_sets) > 1:
        notes.append(
            "the candidates were judged by different budgets (each by its own profile's): for a "
            "like-for-like choice give them the same [budgets]"
        )
    return best, notes


def _ms(p50: dict | None) -> str:
    if not p50:
        return "—"
    upper = "∞" if p50["upper"] is None else f"{p50['upper']:.3f}"
    return f"{p50['point']:.3f} [{p50['lower']:.3f}, {upper}]"


def table_rows(choice: dict) -> list[list[str]]:
    rows = []
    for r in choice["candidates"]:
        acc = r["accuracy"]
        verdict = (
            "chosen"
            if r["profile"] == choice["chosen"]
            else f"error: {r['error']}"
            if r["error"]
            else f"missed: {', '.join(r['failed'])}"
            if r["failed"]
            else "emulated: not timed"
            if r["emulated"]
            else "slower"
        )
        rows.append(
            [
                r["profile"],
                r["target"] or "—",
                r["precision"] or "—",
                _ms(r["p50_ms"]),
                f"{acc['artifact']:.6g} (FP32 {acc['reference']:.6g})" if acc else "—",
                f"{r['artifact_bytes'] / 2**20:.2f}" if r["artifact_bytes"] else "—",
                str(r["exit_code"]),
                verdict,
            ]
        )
    return rows


HEADER = ["profile", "target", "precision", "p50 ms [95% CI]", "accuracy", "artifact MB", "exit", "verdict"]


def render(choice: dict) -> str:
    lines = [f"# Fastest build of {Path(choice['project']).name} that meets its budgets", ""]
    if choice["chosen"]:
        lines.append(
            f"Chosen: **{choice['chosen']}** (`{choice['chosen_build_dir']}`; check it on the device with "
            f"`tapeout check {choice['chosen_build_dir']}`)."
        )
    else:
        lines.append(f"**No candidate qualifies** (exit {choice['exit_code']}).")
    lines += ["", f"Rule: {choice['rule']}. The candidates were built and measured one after another on this host.", ""]
    lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table_rows(choice)]
    lines += [""] + [f"Note: {n}" for n in choice["notes"]]
    return "\n".join(lines) + "\n"
