"""How a crashed inference process is reported (toolkit/measurement/measure.py `death`, the runner's faulthandler):
the signal by name and the Python frame native code crashed under, even when the crash happens while a session has
fd 2 redirected to swallow a runtime's native output."""

from __future__ import annotations

import subprocess
import sys

from tapeout.measurement.measure import death

_CRASH = """
import faulthandler, os
log = os.fdopen(os.dup(2), "w")   # what the runner does before any session opens
faulthandler.enable(file=log)
def load_package():
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)   # a session quieting a runtime's native output
    import ctypes
    ctypes.string_at(0)                              # native code dereferencing NULL
load_package()
"""


def test_a_native_crash_under_a_redirected_stderr_is_named_with_its_python_frame():
    proc = subprocess.run([sys.executable, "-c", _CRASH], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -11
    line = death(proc.returncode, proc.stderr)
    # the innermost frame: the Python call the native code crashed under, though fd 2 pointed at /dev/null then
    assert line.startswith("killed by SIGSEGV, in File") and line.endswith("in string_at")


def test_exit_codes_and_silent_deaths_are_one_line():
    assert death(1, "Traceback …\nValueError: bad\n") == "exit 1: ValueError: bad"
    assert death(-9, "") == "killed by SIGKILL: no output"
    assert death(-200, "last words") == "killed by signal 200: last words"
