"""What runs on a worker: a build, or a check, each in a fresh `tapeout` process in a scratch folder of its own,
and the files it wrote sent back as data. The head verifies them; nothing here is trusted there.

The `tapeout` process dies with the Ray worker that started it (PR_SET_PDEATHSIG): a task the head cancels, or a
worker killed, leaves no build running on unseen.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tapeout import __version__
from tapeout.core.files import write_text
from tapeout.farm.bundle import pack_build, unpack

CHECK_FILES = ("check.json", "check.md", "check.html", "check-manifest.json")
_PR_SET_PDEATHSIG = 1


class Tracker:
    """A Ray actor on the head's node: each task says where it started, so the head can print it and name the node
    a lost task was on."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def started(self, key: str, stage: str, attempt: int, node: str, host: str) -> None:
        self.events.append(
            {"key": key, "stage": stage, "attempt": attempt, "node": node, "host": host, "at": time.time()}
        )

    def since(self, index: int) -> list[dict[str, Any]]:
        return self.events[index:]


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: it outlives a killed worker until it ends
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _tapeout(args: list[str], cwd: Path) -> tuple[int, str]:
    """`python -m tapeout ARGS`: its exit code and the line that says why it failed (its last `tapeout:` line)."""
    env = {**os.environ, "COLUMNS": "160"}
    proc = subprocess.run(
        [sys.executable, "-m", "tapeout", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        preexec_fn=_die_with_parent,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("tapeout:")]
    return proc.returncode, (said or lines or [""])[-1][:600]


_SCRATCH_PREFIX = "tapeout-farm-"


def _scratch() -> tempfile.TemporaryDirectory:
    """A scratch folder named by this worker's PID; those of workers that died (kill -9: no clean-up ran) are
    removed first."""
    import shutil

    import psutil

    root = Path(tempfile.gettempdir())
    for old in root.glob(f"{_SCRATCH_PREFIX}*-*"):
        pid = old.name[len(_SCRATCH_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-")


def _where(tracker, job: dict[str, Any], stage: str) -> dict[str, Any]:
    """Tell the head where this task started; the result's first fields, with an error where this worker's tapeout
    is not the head's."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    host = socket.gethostname()
    ray.get(tracker.started.remote(job["key"], stage, job["attempt"], node, host))
    result = {"node": node, "host": host, "tapeout": __version__, "machine": machine_state()}
    if job["tapeout"] != __version__:
        result.update(exit_code=4, error=f"this worker runs tapeout {__version__}, the head {job['tapeout']}")
    return result


def machine_state() -> dict[str, Any]:
    """The worker's machine as a task starts on it: what it is (CPU, flags, cores, memory) and how busy it is."""
    import psutil

    from tapeout.core.host import host_fingerprint

    return {
        **host_fingerprint(),
        "load_1m": round(os.getloadavg()[0], 2),
        "memory_available_gb": round(psutil.virtual_memory().available / 2**30, 1),
    }


def build(tracker, job: dict[str, Any]) -> dict[str, Any]:
    """Build the project for the profile: the build dir's files, or the line that says why there is none."""
    result = _where(tracker, job, "build")
    if "error" in result:
        return result
    started = time.perf_counter()
    with _scratch() as scratch:
        root = Path(scratch)
        unpack(job["project"], root / "project", "project bundle")
        profile = root / "profiles" / f"{job['profile']}.toml"
        write_text(profile, job["profile_toml"])
        out = root / "build"
        code, said = _tapeout(
            ["build", str(root / "project" / job["project_file"]), "-p", str(profile), "-o", str(out)], root
        )
        result.update(exit_code=code, seconds=time.perf_counter() - started)
        if (out / "manifest.json").is_file():
            result["files"] = pack_build(out)
        else:
            result["error"] = said or f"tapeout build exited {code} and wrote no build dir"
    return result


def check(tracker, job: dict[str, Any]) -> dict[str, Any]:
    """Check the build on this node's device: the check's files, or the line that says why there are none."""
    result = _where(tracker, job, "check")
    if "error" in result:
        return result
    started = time.perf_counter()
    with _scratch() as scratch:
        build_dir = Path(scratch) / "build"
        unpack(job["build"], build_dir, "build bundle")
        code, said = _tapeout(["check", str(build_dir)], Path(scratch))
        result.update(exit_code=code, seconds=time.perf_counter() - started)
        if (build_dir / "check-manifest.json").is_file():
            result["files"] = {
                name: (build_dir / name).read_bytes() for name in CHECK_FILES if (build_dir / name).is_file()
            }
        else:
            result["error"] = said or f"tapeout check exited {code} and wrote no check"
    return result
