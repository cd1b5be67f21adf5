"""One exception base, each subclass carrying the exit code DESIGN.md §4 gives it.

The CLI turns a TapeoutError into one line (the message) and its exit code, with no traceback.
Anything else that escapes is a tapeout bug and keeps its traceback.
"""

from __future__ import annotations

import re

EXIT_OK = 0
EXIT_BUDGET_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INCONCLUSIVE = 3
EXIT_UNAVAILABLE = 4
EXIT_INTERNAL = 70  # a tapeout bug (BSD EX_SOFTWARE): never confused with a budget verdict


class TapeoutError(Exception):
    """A problem the user can fix; `str()` names the problem and the fix."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, *, fix: str | None = None):
        self.problem = message
        self.fix = fix
        super().__init__(f"{message} — {fix}" if fix else message)


class BadInput(TapeoutError):
    """Missing or malformed file, wrong field, wrong shape, unknown name: exit 2."""

    exit_code = EXIT_BAD_INPUT


class ExportMismatch(BadInput):
    """The exported ONNX model does not reproduce the torch model within tolerance."""


class TargetUnavailable(TapeoutError):
    """The backend or its toolchain is not installed or not usable on this host: exit 4."""

    exit_code = EXIT_UNAVAILABLE


def first_line(exc: BaseException) -> str:
    """The first line of a runtime's error, without its colour codes: what a one-line message quotes."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
