"""What the user sees while tapeout works: one line per step with its duration; on a terminal a spinner with the
step's progress, elsewhere (a pipe, a CI log) a line every HEARTBEAT_S seconds while a step runs, so a long step
is never silent.

Progress goes to stderr so that `--json` output on stdout stays machine-readable.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.markup import escape

_interrupt_pending = False
HEARTBEAT_S = 15.0  # seconds between a running step's lines where there is no spinner
_BAR = 20


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


def _pipe_width() -> int:
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and 40 <= int(columns) <= 1000 else 140


class UI:
    def __init__(self, heartbeat_s: float = HEARTBEAT_S):
        self.err = Console(stderr=True, highlight=False)  # never muted: --json keeps progress here
        # Not a terminal (CI logs, pipes): rich would wrap at 80 columns and fold the verdict table; COLUMNS, where
        # set, is the width asked for
        self.out = Console(highlight=False, width=None if Console().is_terminal else _pipe_width())
        self.heartbeat_s = heartbeat_s
        self._status = None
        self._text = ""
        self._detail = ""

    @contextlib.contextmanager
    def step(self, text: str) -> Iterator[None]:
        honour_interrupt()
        start = time.perf_counter()
        text = escape(text)  # model, node and file names may contain [brackets]
        self._text, self._detail = text, ""
        beating = None if self.err.is_terminal else self._heartbeat(text, start)
        try:
            with self.err.status(text) as status:
                self._status = status
                try:
                    yield
                finally:
                    self._status = None
        finally:
            if beating is not None:
                beating()
            self._detail = ""
        honour_interrupt()
        self.err.print(f"[green]✓[/] {text} [dim]({time.perf_counter() - start:.1f} s)[/]")

    def _heartbeat(self, text: str, start: float) -> Callable[[], None]:
        """A line every `heartbeat_s` while the step runs, with its latest detail: what a pipe shows of a spinner.
        Returns what stops it (before the step's own last line)."""
        done = threading.Event()
        # bound to the stream of now: an exporter's noise, redirected while it runs, must not swallow these lines
        console = Console(file=self.err.file, highlight=False)

        def beat() -> None:
            while not done.wait(self.heartbeat_s):
                detail = f": {self._detail}" if self._detail else ""
                line = f"[dim]…[/] {text}{escape(detail)} [dim]({time.perf_counter() - start:.0f} s)[/]"
                console.print(line, soft_wrap=True)  # a log line whole, at any width

        thread = threading.Thread(target=beat, name="tapeout-heartbeat", daemon=True)
        thread.start()

        def stop() -> None:
            done.set()
            thread.join()

        return stop

    def detail(self, text: str) -> None:
        """The running step's progress in words (e.g. 'process 2/3'): its spinner's text on a terminal, its next
        heartbeat line elsewhere."""
        self._detail = text
        if self._status is not None:
            self._status.update(f"{self._text} [dim]· {escape(text)}[/]")

    def progress(self, done: int, total: int, what: str) -> None:
        """`done` of `total` `what` (prompts, layers, groups), as a bar with the count."""
        filled = _BAR * min(done, total) // max(total, 1)
        self.detail(f"{what} {done}/{total} {'█' * filled}{'░' * (_BAR - filled)}")

    def note(self, text: str) -> None:
        # in a pipe or CI log a note stays one line, whole (a grep finds it; a long path is not cut in two)
        self.err.print(f"[yellow]![/] {escape(text)}", soft_wrap=not self.err.is_terminal)
