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

    def __init__(self, message: str, *, fix: str | None = None, detail: str | None = None):
        # one line whatever it quotes (a path or a name from a user's file may hold a newline)
        message, fix = one_line(message), one_line(fix) if fix is not None else None
        self.problem = message
        self.fix = fix
        self.detail = detail  # a runtime's whole message, when the line quotes only its gist (--debug prints it)
        super().__init__(f"{message} — {fix}" if fix else message)


class BadInput(TapeoutError):
    """Missing or malformed file, wrong field, wrong shape, unknown name: exit 2."""

    exit_code = EXIT_BAD_INPUT


class ExportMismatch(BadInput):
    """The exported ONNX model does not reproduce the torch model within tolerance."""


class TargetUnavailable(TapeoutError):
    """The backend or its toolchain is not installed or not usable on this host: exit 4."""

    exit_code = EXIT_UNAVAILABLE


def one_line(text: str) -> str:
    """`text` with every unprintable character escaped (a newline in a field name from a user's file,
    say): an error is one line, whatever it quotes."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


# Lines of a runtime's message that say where in the runtime's source it failed, not what failed
# (OpenVINO leads with two of them and puts the op and the cause on the lines after).
_SOURCE_LOCATION = re.compile(r"^(Exception from \S+:\d+:?|Check '.*' failed at \S+:\d+:?|\S+\.(cc|cpp|h|hpp):\d+:?)$")


def full_text(exc: BaseException) -> str:
    """A runtime's whole error message, without colour codes: kept for --debug and the report."""
    return re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip() or type(exc).__name__


def first_line(exc: BaseException, limit: int = 400) -> str:
    """The gist of a runtime's error on one line: every line that says what failed (not where in the
    runtime's source), joined, and cut at `limit` characters."""
    lines = [line.strip() for line in full_text(exc).splitlines() if line.strip()]
    told = [line for line in lines if not _SOURCE_LOCATION.match(line)] or lines
    text = " ".join(told)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def runtime_detail(exc: BaseException) -> str | None:
    """The whole message when `first_line` had to leave something out of it, else None."""
    text = full_text(exc)
    return text if first_line(exc) != text else None


class UserCodeError(BadInput):
    """The project's own code (model file, callable, forward, metric, calibration data) raised: exit 2."""


def _user_frame(exc: BaseException, root: str | None) -> str:
    """Where in the user's code it happened: `file.py:line` of the innermost frame under the project root,
    else the innermost one that is neither an installed package's nor tapeout's nor Python's own."""
    import os
    import traceback

    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    ours = os.path.dirname(os.path.abspath(__file__))
    theirs = [f for f in frames if root and f.filename.startswith(root)] or [
        f
        for f in frames
        if not any(mark in f.filename for mark in ("site-packages", "dist-packages", "<frozen"))
        and not f.filename.startswith((ours, os.path.dirname(os.__file__)))
    ]
    frame = (theirs or frames or [None])[-1]
    return f"{frame.filename}:{frame.lineno}" if frame else "?"


class user_code:
    """`with user_code("[evaluation] metric metric.py:top1", root):` — anything the user's code raises,
    SystemExit included (a sys.exit in a model file must not end tapeout with its code), becomes one
    UserCodeError line naming the reference, the exception and the user's file and line. The original
    exception stays its cause: `--debug` shows the traceback. Ctrl-C and tapeout's own errors pass."""

    def __init__(self, what: str, root: object = None):
        self.what, self.root = what, str(root) if root is not None else None

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None or isinstance(exc, (KeyboardInterrupt, TapeoutError)):
            return False
        if isinstance(exc, SystemExit):
            problem = f"{self.what} called sys.exit({exc.code!r})"
        else:
            problem = f"{self.what} raised {type(exc).__name__}: {first_line(exc)}"
        raise UserCodeError(
            f"{problem} (at {_user_frame(exc, self.root)})",
            fix="fix it in the project's code; `tapeout --debug …` shows the traceback",
        ) from exc
