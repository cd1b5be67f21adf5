"""Shared fixtures: a CLI runner (a real subprocess, real exit codes) and one digits-cnn build per session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "samples"

# The user's own calibrations (~/.local/share/tapeout/calibration) never reach a test's estimate.
os.environ["TAPEOUT_CALIBRATION"] = tempfile.mkdtemp(prefix="tapeout-test-calibration-")

# Short timing runs: the suite checks behaviour, the benchmarks and the note check speed.
FAST_PROFILE = """
extends = "cpu-fp32"
[check]
iterations = 60
repeats = 2
warmup_min_s = 0.1
op_profile_iterations = 5
"""


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


def run_cli(*args: str | Path, cwd: Path | None = None, env: dict | None = None) -> Result:
    proc = subprocess.run([sys.executable, "-m", "tapeout", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "COLUMNS": "200", **(env or {})}, timeout=900)
    return Result(proc.returncode, proc.stdout, proc.stderr)


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


@pytest.fixture(scope="session")
def digits_int8_build(tmp_path_factory) -> Path:
    """digits-cnn at cpu-int8 with short timing runs: the second build compare, diff and calibrate need."""
    profile = tmp_path_factory.mktemp("profiles") / "int8.toml"
    profile.write_text(FAST_PROFILE.replace('extends = "cpu-fp32"', 'extends = "cpu-int8"'))
    out = tmp_path_factory.mktemp("builds") / "digits-int8"
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", profile, "--out", out)
    assert result.code == 0, result.err + result.out
    return out


def one_line_error(result: Result) -> str:
    """Bad input must be one line on stderr, never a traceback."""
    assert "Traceback" not in result.err, result.err
    lines = [ln for ln in result.err.splitlines() if ln.startswith("tapeout: error:")]
    assert len(lines) == 1, result.err
    return lines[0]
