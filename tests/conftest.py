"""Shared fixtures: a CLI runner (a fresh process per command, real exit codes) and one digits-cnn build per session."""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "samples"

# pytest-xdist's workers share the host's cores: each worker, and every process it starts, gets its share of OpenMP
# threads (torch's and NumPy's BLAS) rather than one a core. Two workers with a thread a core each stall at every
# parallel region's barrier waiting for a thread the other worker's threads have descheduled: on a 2-core host
# tiny-lm's generate build took 157 s beside tests/test_stream.py, and 43 s with one OpenMP thread a worker.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // _WORKERS))
    if "torch" in sys.modules:  # imported before this file (a plugin): its pool is sized already
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# The user's own calibrations (~/.local/share/tapeout/calibration) never reach a test's estimate.
# (each pytest process makes its own, and removes it when it exits)
os.environ["TAPEOUT_CALIBRATION"] = tempfile.mkdtemp(prefix="tapeout-test-calibration-")
atexit.register(shutil.rmtree, os.environ["TAPEOUT_CALIBRATION"], ignore_errors=True)
# nor do the class calibrations tapeout ships: a test's estimate depends on what it made, not on what ships
os.environ["TAPEOUT_SHIPPED_CALIBRATION"] = ""
# every test exports what it builds (a test of the export cache names a folder of its own)
os.environ["TAPEOUT_EXPORT_CACHE"] = "off"

# Short timing runs: the suite checks behaviour, the benchmarks and the note check speed.
FAST_PROFILE = """
extends = "cpu-fp32"
[check]
iterations = 60
repeats = 2
warmup_min_s = 0.1
op_profile_iterations = 5
"""


# The GPU suites' timing settings (tests/gpu/): enough runs for NVML's energy window, no more.
GPU_PROFILE = """
extends = "{base}"
{options}
[check]
iterations = 200
repeats = 2
warmup_min_s = 0.2
op_profile_iterations = 10
energy_window_s = 2.0
[budgets]
{budgets}
"""


def gpu_profile(path: Path, base: str, budgets: str = "", options: str = "") -> Path:
    """A GPU test's profile at `path`: `base` with GPU_PROFILE's timing settings, `options` (TOML lines
    under [options]) and `budgets` (lines under [budgets])."""
    path.write_text(GPU_PROFILE.format(base=base, options=f"[options]\n{options}" if options else "", budgets=budgets))
    return path


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


def static_libstdcxx_compiler(folder: Path, name: str = "g++-static") -> Path:
    """A C++ compiler that links libstdc++ and libgcc statically into every shared library it builds: g++ behind a
    wrapper, as the H200 image's CXX=/opt/gcc/bin/g++ was (a package built by it crashes when torch loads it)."""
    gxx = shutil.which("g++")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(
        f'#!/bin/sh\nexport PATH="{os.environ["PATH"]}"\ncase " $* " in *" -shared "*) exec {gxx} "$@" '
        f'-static-libstdc++ -static-libgcc ;; esac\nexec {gxx} "$@"\n'
    )
    path.chmod(0o755)
    return path


def run_cli(*args: str | Path, cwd: Path | None = None, env: dict | None = None) -> Result:
    """`python -m tapeout ARGS` in a fresh process: forked from the warmed interpreter of
    tests/cli_zygote.py, or a plain subprocess where that cannot be faithful (a PYTHON* variable changes
    how Python starts) or where TAPEOUT_TEST_SUBPROCESS=1 asks for it."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    argv = [str(a) for a in args]
    if os.environ.get("TAPEOUT_TEST_SUBPROCESS") == "1" or any(k.startswith("PYTHON") for k in (env or {})):
        proc = subprocess.run(
            [sys.executable, "-m", "tapeout", *argv], capture_output=True, text=True, cwd=cwd, env=full_env, timeout=900
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)
    return _ZYGOTE.run(argv, Path(cwd or os.getcwd()), full_env, timeout=900)


class _Zygote:
    """The one tests/cli_zygote.py process of this session, started on first use."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.pending = b""
        self.folder = Path(tempfile.mkdtemp(prefix="tapeout-test-cli-"))

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            log = open(self.folder / "zygote.log", "w")  # noqa: SIM115 - the zygote's own stderr, for a crash
            self.proc = subprocess.Popen(
                [sys.executable, str(REPO / "tests" / "cli_zygote.py")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
            self.pending = b""
            atexit.register(self.stop)
            self._reply(timeout=300)
        return self.proc

    def _reply(self, timeout: float) -> dict:
        # lines read off the raw pipe: a buffered reader could hold the next reply where select cannot see it
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(deadline - time.monotonic(), 0))
            chunk = os.read(self.proc.stdout.fileno(), 65536) if ready else b""
            if not chunk:
                raise RuntimeError(
                    f"tests/cli_zygote.py did not answer in {timeout:.0f} s: "
                    + (self.folder / "zygote.log").read_text()[-3000:]
                )
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return json.loads(line)

    def run(self, argv: list[str], cwd: Path, env: dict, timeout: float) -> Result:
        proc = self._start()
        out, err = self.folder / "stdout", self.folder / "stderr"
        proc.stdin.write(
            json.dumps({"argv": argv, "cwd": str(cwd), "env": env, "stdout": str(out), "stderr": str(err)}) + "\n"
        )
        proc.stdin.flush()
        pid = self._reply(timeout=60)["pid"]
        try:
            code = self._reply(timeout=timeout)["code"]
        except RuntimeError:
            if self.proc.poll() is not None:
                raise
            os.kill(pid, signal.SIGKILL)
            self._reply(timeout=60)
            raise subprocess.TimeoutExpired(["tapeout", *argv], timeout) from None
        return Result(code, out.read_text(errors="replace"), err.read_text(errors="replace"))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


_ZYGOTE = _Zygote()


@pytest.fixture(scope="session")
def fast_profile(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("profiles") / "fast.toml"
    path.write_text(FAST_PROFILE)
    return path


@pytest.fixture(scope="session")
def digits_build(tmp_path_factory, fast_profile) -> Path:
    out = tmp_path_factory.mktemp("builds") / "digits"
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", fast_profile, "--out", out)
    assert result.code == 0, result.err + result.out
    return out


EXECUTORCH_PROFILE = """
extends = "executorch-xnnpack-int8"
[check]
iterations = 60
repeats = 1
warmup_min_s = 0.1
op_profile = false  # its test runs the ETDump pass in-process on this artifact: one fresh process less per run
"""


@pytest.fixture(scope="session")
def executorch_digits_build(tmp_path_factory):
    """digits-cnn at executorch-xnnpack-int8 (PT2E, static: its first conv and head stay FP32, so the .pte runs both
    XNNPACK's float and integer kernels) with short timing runs: the ExecuTorch tests and the device-side install
    test share it (one build, not one per precision, for the suite's time). The build's Result and its folder."""
    profile = tmp_path_factory.mktemp("profiles") / "et.toml"
    profile.write_text(EXECUTORCH_PROFILE)
    out = tmp_path_factory.mktemp("builds") / "digits-et"
    return run_cli("build", SAMPLES / "digits-cnn", "--profile", profile, "--out", out, "--json"), out


@pytest.fixture(scope="session")
def digits_int8_build(tmp_path_factory) -> Path:
    """digits-cnn at cpu-int8 with short timing runs: the second build compare, diff and calibrate need."""
    profile = tmp_path_factory.mktemp("profiles") / "int8.toml"
    profile.write_text(FAST_PROFILE.replace('extends = "cpu-fp32"', 'extends = "cpu-int8"'))
    out = tmp_path_factory.mktemp("builds") / "digits-int8"
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", profile, "--out", out)
    assert result.code == 0, result.err + result.out
    return out


def reseal(build_dir: Path) -> None:
    """Record report.json's (and check.json's) present hash in the build dir's records, as a build (or check) that
    wrote exactly this report would have. The verified reader refuses an edited report; a test that needs a report
    with particular figures (a machine that drifted, another device) makes one this way, then reads it."""
    from tapeout.core.hashing import sha256_file

    manifest = build_dir / "manifest.json"
    data = json.loads(manifest.read_text())
    data["report"]["sha256"] = sha256_file(build_dir / "report.json")
    manifest.write_text(json.dumps(data))
    check = build_dir / "check-manifest.json"
    if check.is_file():
        record = json.loads(check.read_text())
        record["report"]["sha256"] = sha256_file(build_dir / "check.json")
        record["build_manifest_sha256"] = sha256_file(manifest)
        check.write_text(json.dumps(record))


def rehashed_copy(build_dir: Path, into: Path, part: str, edit) -> Path:
    """A copy of `build_dir` whose manifest-hashed file `part` ("workload", "structure") was changed by `edit` and its
    new hash recorded, as another tool (or a bug) could leave it: the hash verifies, only the values can be wrong.
    `edit` takes the file's arrays (an .npz, edited in place) or its JSON document (returned)."""
    from tapeout.core.hashing import sha256_file

    shutil.copytree(build_dir, into)
    manifest = json.loads((into / "manifest.json").read_text())
    file = into / manifest[part]["file"]
    if file.suffix == ".npz":
        with np.load(file) as arrays:
            edited = {k: arrays[k] for k in arrays.files}
        edit(edited)
        np.savez(file, **edited)
    else:
        file.write_text(json.dumps(edit(json.loads(file.read_text()))))
    manifest[part]["sha256"] = sha256_file(file)
    (into / "manifest.json").write_text(json.dumps(manifest))
    return into


def one_line_error(result: Result) -> str:
    """Bad input must be one line on stderr, never a traceback."""
    assert "Traceback" not in result.err, result.err
    lines = [ln for ln in result.err.splitlines() if ln.startswith("tapeout: error:")]
    assert len(lines) == 1, result.err
    return lines[0]


def refused_build(tmp_path, project, *args) -> str:
    """`tapeout build` of bad input: exit 2, no build dir left, one line (default profile cpu-fp32)."""
    result = run_cli("build", project, "--out", tmp_path / "b", *(args or ("--profile", "cpu-fp32")))
    assert result.code == 2, result.err + result.out
    assert not (tmp_path / "b").exists()
    return one_line_error(result)


_INLINE = {"code", "strong", "em", "b", "i", "span"}


class HtmlText(HTMLParser):
    """The page's visible text outside its figures' SVG, and its h2 headings."""

    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self.headings: list[str] = []
        self._svg = 0
        self._h2: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self._svg += tag == "svg"
        if tag == "h2":
            self._h2 = []
        if tag not in _INLINE:
            self.parts.append(" ")

    def handle_endtag(self, tag):
        self._svg -= tag == "svg"
        if tag == "h2" and self._h2 is not None:
            self.headings.append(" ".join("".join(self._h2).split()))
            self._h2 = None
        if tag not in _INLINE:
            self.parts.append(" ")

    def handle_data(self, data):
        if not self._svg:
            self.parts.append(data)
            if self._h2 is not None:
                self._h2.append(data)


def _plain(markdown: str) -> str:
    """A line of report.md as a reader sees it rendered: no emphasis or code marks, no escapes."""
    text = re.sub(r"^(#+ |- |\| )", "", markdown.strip()).replace("**", "").replace("`", "").replace("\\|", "|")
    return " ".join(text.split())


def html_shows_everything(build_dir: Path, report: str = "report") -> None:
    """report.html shows every heading, table cell and line of text report.md does."""
    md = (build_dir / f"{report}.md").read_text()
    page = HtmlText()
    page.feed((build_dir / f"{report}.html").read_text())
    text = " ".join("".join(page.parts).split())
    headings = [line[3:] for line in md.splitlines() if line.startswith("## ")]
    assert page.headings == headings
    for line in md.splitlines():
        if not line.strip() or line.startswith("|---") or line.startswith("## "):
            continue
        if line.startswith("|"):  # a table row: each cell
            for cell in re.split(r"(?<!\\)\|", line.strip().strip("|")):
                assert _plain(cell) in text, (cell, line)
        else:
            assert _plain(line) in text, line


def assert_within_bounds(build_dir: Path, report: dict | None = None) -> None:
    """A build measured here ran no faster than its estimate's lower bound (the forward call's, and a generate
    loop's TTFT and TPOT): the host's roof is a ceiling, so a bound that a measurement beats is a bug."""
    report = report or json.loads((Path(build_dir) / "report.json").read_text())
    est = report.get("estimate")
    measured = ((report.get("measurement") or {}).get("latency_ms") or {}).get("quantiles", {}).get("p50", {})
    if est is None or (report.get("target") or {}).get("emulated"):
        return
    if measured.get("point"):
        assert measured["point"] >= est["lower_bound_ms"], (build_dir, measured["point"], est["lower_bound_ms"])
    for row in (est.get("generation") or {}).get("measured") or []:
        if row["of"] == "bound" and row["measured_ms"]:
            assert row["measured_ms"] >= row["estimated_ms"], (build_dir, row)
