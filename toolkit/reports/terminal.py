"""The tables a command prints on the terminal: the verdicts, and the analysis summary."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tapeout.reports.cells import budget_rows

_STYLE = {
    "PASS": "green",
    "FAIL": "bold red",
    "INCONCLUSIVE": "yellow",
    "UNMEASURED": "magenta",
    "EST. PASS": "cyan",
    "EST. FAIL": "red",
}


def verdict_table(title: str, budgets: list[dict]) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False)
    for column in ("budget", "limit", "measured", "bound", "verdict", "why"):
        table.add_column(column, overflow="fold")
    for row in budget_rows(budgets):
        table.add_row(*map(escape, row[:4]), f"[{_STYLE.get(row[4], '')}]{row[4]}[/]", escape(row[5]))
    return table


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def analysis_summary(out: Console, title: str, a, show_groups: bool = False) -> None:
    """`tapeout analyze` as text: the family and its evidence, facts, costs, roles, fusion groups."""
    best = a.families[0]
    out.print(
        f"[bold]{escape(title)}[/]: [bold cyan]{best.family}[/] (confidence {best.confidence:.2f}) — "
        f"{escape('; '.join(best.evidence))}"
    )
    for other in a.families[1:]:
        out.print(f"  also: {other.family} ({other.confidence:.2f}) — {escape('; '.join(other.evidence))}")
    facts = {k: v for k, v in a.facts.items() if v not in (None, 0, False, {}, 0.0)}
    out.print(escape("facts: " + ", ".join(f"{k} {v}" for k, v in facts.items())))
    out.print(
        f"parameters {_si(a.params, '')} · weights {_si(a.weight_bytes, 'B')} · {_si(a.flops, 'FLOP')} per inference · "
        f"{_si(a.bytes_moved, 'B')} moved (sum over nodes) · peak live activations {_si(a.peak_activation_bytes, 'B')} "
        f"(at {a.peak_activation_at})"
    )
    out.print("ops: " + ", ".join(f"{op} {n}" for op, n in a.op_census.items()))
    roles = a.to_json()["role_counts"]
    out.print("roles: " + ", ".join(f"{r} {n}" for r, n in roles.items()))
    table = Table(title=f"{len(a.groups)} fusion groups (one precision decision each)", title_justify="left")
    for column in ("group", "role", "weighted nodes", "MACs", "params"):
        table.add_column(column, overflow="fold")
    for g in a.groups if show_groups else a.groups[:12]:
        table.add_row(
            escape(g.name),
            g.role,
            escape(", ".join(g.weighted)) if show_groups else str(len(g.weighted)),
            _si(g.macs, ""),
            _si(g.params, ""),
        )
    out.print(table)
    if not show_groups and len(a.groups) > 12:
        out.print(f"… {len(a.groups) - 12} more (--groups lists them all, with their nodes)")
    for reason in a.unmatched:
        out.print(f"[dim]not found: {escape(reason)}[/]")
