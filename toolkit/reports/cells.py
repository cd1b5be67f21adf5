"""The cells of a report's tables, shared by report.md, the terminal, JUnit and the HTML page: numbers formatted,
verdicts marked, budget rows, Markdown tables."""

from __future__ import annotations

from typing import Any

VERDICT_MARK = {
    "pass": "PASS",
    "fail": "FAIL",
    "inconclusive": "INCONCLUSIVE",
    "unmeasured": "UNMEASURED",
    "estimated-pass": "EST. PASS",
    "estimated-fail": "EST. FAIL",
}


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def us(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def budget_rows(budgets: list[dict]) -> list[list[str]]:
    rows = []
    for b in budgets:
        bound = b.get("bound")
        rows.append(
            [
                b["budget"],
                f"{fmt(b['limit'])} {b['unit']}",
                fmt(b.get("measured")),
                f"[{fmt(bound[0])}, {fmt(bound[1])}]" if bound else "—",
                VERDICT_MARK[b["verdict"]],
                ("carried from the build: " if b.get("carried") else "") + b.get("reason", ""),
            ]
        )
    return rows


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines
