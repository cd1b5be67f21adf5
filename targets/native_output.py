"""What native runtimes print on the process's own file descriptors (QNN's banner, ORT's failed-library lines,
ExecuTorch's cpuinfo probe, Inductor's compiler lines), kept off the user's terminal and `--json` stdout."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def native_output_captured() -> Iterator[list[str]]:
    """Native libraries print to fd 1 and 2 through C stdio (QNN's banner; ORT's 'failed to load
    libonnxruntime_providers_cuda.so' warning). Keep `--json` stdout clean, and hand back what they
    said (the list is filled when the block ends) so a failure can quote it."""
    import ctypes

    sys.stdout.flush()
    sys.stderr.flush()
    said: list[str] = []
    saved = (os.dup(1), os.dup(2))
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield said
        finally:
            with contextlib.suppress(Exception):
                ctypes.CDLL(None).fflush(None)
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            sink.seek(0)
            said.extend(line for line in sink.read().decode(errors="replace").splitlines() if line.strip())


@contextlib.contextmanager
def quieted() -> Iterator[list[str]]:
    """native_output_captured, and Python's warnings ignored too: the deprecation and version warnings torch's
    compiler stacks (ExecuTorch, torchao, coremltools, Inductor) raise at import and compile are not the user's to
    act on."""
    with warnings.catch_warnings(), native_output_captured() as said:
        warnings.simplefilter("ignore")
        yield said
