"""The farm's own table (`tapeout farm`): one row per project and profile, where each step ran and how it ended."""

from __future__ import annotations

from typing import Any

HEADER = ["build", "device", "status", "built on", "checked on", "exit", "why"]


def table_rows(data: dict[str, Any]) -> list[list[str]]:
    out = []
    for r in data["rows"]:
        status = r["status"] + (" (unchanged: skipped)" if r.get("skipped") else "")
        tries = {stage: n for stage, n in (r.get("attempts") or {}).items() if n > 1}
        where = {
            stage: r["hosts"].get(stage, "—") + (f" (try {tries[stage]})" if stage in tries else "")
            for stage in ("build", "check")
        }
        out.append(
            [
                f"{r['project']}/{r['profile']}",
                r["device"],
                status,
                where["build"],
                where["check"],
                "—" if r.get("exit_code") is None else str(r["exit_code"]),
                r.get("reason") or "",
            ]
        )
    return out


def render_markdown(data: dict[str, Any]) -> str:
    from tapeout.reports.compare import HEADER as COMPARE_HEADER
    from tapeout.reports.compare import table_rows as compare_rows

    def table(header: list[str], rows: list[list[str]]) -> list[str]:
        return [
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
            *("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows),
        ]

    lines = [
        "# tapeout farm",
        "",
        f"{len(data['rows'])} rows on {len(data['nodes'])} node(s) in {data['seconds']:.0f} s; "
        f"exit {data['exit_code']}.",
        "",
        *table(HEADER, table_rows(data)),
    ]
    if data.get("compare"):
        lines += [
            "",
            "## Builds side by side",
            "",
            f"Recommendation: {data['compare']['why']}.",
            "",
            *table(COMPARE_HEADER, compare_rows(data["compare"])),
        ]
    return "\n".join(lines) + "\n"
