"""What the user sees while tapeout works: one line per step with its duration, a spinner on a terminal.

Progress goes to stderr so that `--json` output on stdout stays machine-readable.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator

from rich.console import Console
from rich.markup import escape

_interrupt_pending = False


def on_sigint(_signum, _frame) -> None:
    """Ctrl-C: raise KeyboardInterrupt, and remember it. Python drops an exception raised while a finalizer or a
    weakref callback runs ("Exception ignored in ..."): a Ctrl-C that landed in importlib's module-lock callback
    let a build run on to exit 0. The next step boundary raises it again."""
    global _interrupt_pending
    _interrupt_pending = True
    raise KeyboardInterrupt


def quiet_dropped_interrupt(unraisable) -> None:
    """sys.unraisablehook while on_sigint is installed: the Ctrl-C Python dropped is not printed as "Exception
    ignored in … Traceback …" (the next step boundary raises it, and the user sees one line); anything else
    unraisable goes to Python's own hook."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _interrupt_pending:
        return
    sys.__unraisablehook__(unraisable)


def interrupt_pending() -> bool:
    return _interrupt_pending


def honour_interrupt() -> None:
    """Raise the Ctrl-C that arrived, if Python let it go."""
    if _interrupt_pending:
        raise KeyboardInterrupt


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
