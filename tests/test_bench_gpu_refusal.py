"""The GPU benchmarks on a host without a CUDA GPU: exit 4 (not available here) with one line saying
why and where to run them, never a traceback or an empty table."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import REPO


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here: the benchmarks would run")
@pytest.mark.parametrize(
    ("script", "hint"),
    [("gpu.py", "device-side install"), ("sparsity.py", "Ampere or newer"), ("kernels.py", "tapeout kernels verify")],
)
def test_gpu_benchmarks_exit_4_with_one_line_without_a_gpu(script, hint):
    run = subprocess.run([sys.executable, str(REPO / "bench" / script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 4, run.stderr
    assert run.stdout == "" and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [run.stderr.strip()]
    assert run.stderr.startswith(f"bench/{script}: no CUDA GPU here") and hint in run.stderr
