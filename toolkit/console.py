"""What the user sees while tapeout works: one line per step with its duration, a spinner on a terminal.

Progress goes to stderr so that `--json` output on stdout stays machine-readable.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tapeout.report import budget_rows

_interrupt_pending = False


def on_sigint(_signum, _frame) -> None:
    """Ctrl-C: raise KeyboardInterrupt, and remember it. Python drops an exception raised while a finalizer or a
    weakref callback runs ("Exception ignored in ..."): a Ctrl-C that landed in importlib's module-lock callback
    let a build run on to exit 0. The next step boundary raises it again."""
    global _interrupt_pending
    _interrupt_pending = True
    raise KeyboardInterrupt


def interrupt_pending() -> bool:
    return _interrupt_pending


def honour_interrupt() -> None:
    """Raise the Ctrl-C that arrived, if Python let it go."""
    if _interrupt_pending:
        raise KeyboardInterrupt


_STYLE = {"PASS": "green", "FAIL": "bold red", "INCONCLUSIVE": "yellow", "UNMEASURED": "magenta",
          "EST. PASS": "cyan", "EST. FAIL": "red"}


class UI:
    def __init__(self):
        self.err = Console(stderr=True, highlight=False)  # never muted: --json keeps progress here
        # Not a terminal (CI logs, pipes): rich would wrap at 80 columns and fold the verdict table.
        self.out = Console(highlight=False, width=None if Console().is_terminal else 140)
        self._status = None

    @contextlib.contextmanager
    def step(self, text: str) -> Iterator[None]:
        honour_interrupt()
        start = time.perf_counter()
        text = escape(text)  # model, node and file names may contain [brackets]
        with self.err.status(text) as status:
            self._status = status
            try:
                yield
            finally:
                self._status = None
        honour_interrupt()
        self.err.print(f"[green]✓[/] {text} [dim]({time.perf_counter() - start:.1f} s)[/]")

    def detail(self, text: str) -> None:
        """Update the running step's spinner (e.g. 'process 2/3')."""
        if self._status is not None:
            self._status.update(text)

    def note(self, text: str) -> None:
        self.err.print(f"[yellow]![/] {escape(text)}")


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
    out.print(f"[bold]{escape(title)}[/]: [bold cyan]{best.family}[/] (confidence {best.confidence:.2f}) — "
              f"{escape('; '.join(best.evidence))}")
    for other in a.families[1:]:
        out.print(f"  also: {other.family} ({other.confidence:.2f}) — {escape('; '.join(other.evidence))}")
    facts = {k: v for k, v in a.facts.items() if v not in (None, 0, False, {}, 0.0)}
    out.print(escape("facts: " + ", ".join(f"{k} {v}" for k, v in facts.items())))
    out.print(f"parameters {_si(a.params, '')} · weights {_si(a.weight_bytes, 'B')} · {_si(a.flops, 'FLOP')} per inference · "
              f"{_si(a.bytes_moved, 'B')} moved (sum over nodes) · peak live activations {_si(a.peak_activation_bytes, 'B')} "
              f"(at {a.peak_activation_at})")
    out.print("ops: " + ", ".join(f"{op} {n}" for op, n in a.op_census.items()))
    roles = a.to_json()["role_counts"]
    out.print("roles: " + ", ".join(f"{r} {n}" for r, n in roles.items()))
    table = Table(title=f"{len(a.groups)} fusion groups (one precision decision each)", title_justify="left")
    for column in ("group", "role", "weighted nodes", "MACs", "params"):
        table.add_column(column, overflow="fold")
    for g in a.groups if show_groups else a.groups[:12]:
        table.add_row(escape(g.name), g.role, escape(", ".join(g.weighted)) if show_groups else str(len(g.weighted)),
                      _si(g.macs, ""), _si(g.params, ""))
    out.print(table)
    if not show_groups and len(a.groups) > 12:
        out.print(f"… {len(a.groups) - 12} more (--groups lists them all, with their nodes)")
    for reason in a.unmatched:
        out.print(f"[dim]not found: {escape(reason)}[/]")
