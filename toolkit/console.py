"""What the user sees while tapeout works: one line per step with its duration, a spinner on a terminal.

Progress goes to stderr so that `--json` output on stdout stays machine-readable.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from rich.console import Console
from rich.table import Table

from tapeout.report import budget_rows

_STYLE = {"PASS": "green", "FAIL": "bold red", "INCONCLUSIVE": "yellow", "UNMEASURED": "magenta",
          "EST. PASS": "cyan", "EST. FAIL": "red"}


class UI:
    def __init__(self, quiet: bool = False):
        self.err = Console(stderr=True, quiet=quiet, highlight=False)
        # Not a terminal (CI logs, pipes): rich would wrap at 80 columns and fold the verdict table.
        self.out = Console(highlight=False, width=None if Console().is_terminal else 140)
        self._status = None

    @contextlib.contextmanager
    def step(self, text: str) -> Iterator[None]:
        start = time.perf_counter()
        with self.err.status(text) as status:
            self._status = status
            try:
                yield
            finally:
                self._status = None
        self.err.print(f"[green]✓[/] {text} [dim]({time.perf_counter() - start:.1f} s)[/]")

    def detail(self, text: str) -> None:
        """Update the running step's spinner (e.g. 'process 2/3')."""
        if self._status is not None:
            self._status.update(text)

    def note(self, text: str) -> None:
        self.err.print(f"[yellow]![/] {text}")


def verdict_table(title: str, budgets: list[dict]) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False)
    for column in ("budget", "limit", "measured", "bound", "verdict", "why"):
        table.add_column(column, overflow="fold")
    for row in budget_rows(budgets):
        table.add_row(*row[:4], f"[{_STYLE.get(row[4], '')}]{row[4]}[/]", row[5])
    return table
