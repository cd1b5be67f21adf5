"""A warmed interpreter that forks one `python -m tapeout ...` per request: the suite's CLI runner.

Every `tapeout build` in a fresh process spends ~5 s importing torch, its ONNX exporter and onnxscript
before it does anything; the suite runs ~150 commands. This process imports those once, then forks a
child per command. The child is a real process running the real entry point as `python -m tapeout`
does (`runpy`, its own argv, cwd, environment, stdout and stderr, the default signal dispositions, and
an uncaught exception printed as a traceback with exit 1), so exit codes, output and isolation are the
command's own. What it cannot give: a different PYTHONPATH (sys.path is already set) and the warnings
an import prints once (already imported here); `conftest.run_cli` sends those cases to a plain
subprocess, and `TAPEOUT_TEST_SUBPROCESS=1` sends every command there.

Protocol, one JSON line each way on stdin/stdout: {"argv", "cwd", "env", "stdout", "stderr"} in;
{"pid"} when the child starts, then {"code"} when it ends. EOF on stdin ends this process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys


def _warm() -> None:
    # What a build imports on the way (not onnxruntime: it starts a thread at import, and a thread's
    # locks do not survive a fork; its import is cheap).
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot
    import numpy  # noqa: F401
    import onnx  # noqa: F401
    import onnxscript  # noqa: F401
    import torch
    import torch.onnx._internal.exporter._core  # noqa: F401

    import tapeout.cli
    import tapeout.steps.flows  # noqa: F401

    with contextlib.suppress(ImportError):
        import transformers  # noqa: F401


def _child(request: dict) -> None:
    """In the forked child: become `python -m tapeout ARGV` and exit with its code."""
    import runpy
    import traceback

    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as a fresh interpreter has them
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.argv = ["tapeout", *request["argv"]]
        try:
            runpy.run_module("tapeout", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:  # sys.exit("message"): printed to stderr, exit 1, as the interpreter does
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:  # what the interpreter does with an uncaught exception
            traceback.print_exc()
            code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code if 0 <= code < 256 else 1)


def main() -> None:
    _warm()
    reply = sys.stdout
    print(json.dumps({"ready": True}), file=reply, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), file=reply, flush=True)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)  # killed by a signal: -signal, as subprocess reports it
        print(json.dumps({"code": code}), file=reply, flush=True)


if __name__ == "__main__":
    main()
