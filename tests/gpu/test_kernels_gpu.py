"""The kernel harness on a real NVIDIA GPU: every kernel verified there (bfloat16 attention included, which the
interpreter cannot check), then timed, with its timings saved for the substitution pass. Skipped without a GPU
or Triton: tests/test_kernels.py checks the same kernels in the interpreter."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")]


def _names() -> list[str]:
    from tapeout.targets import kernels

    return kernels.names()


# one test per kernel, so `pytest -n 8` compiles the kernels' configs in parallel (each is a Triton compile)
@pytest.mark.parametrize("name", _names())
def test_the_kernel_verifies_on_the_gpu_in_every_dtype_and_config(name):
    from tapeout.measurement import kernel_harness as harness
    from tapeout.targets import kernels

    assert harness.backend() == "cuda"
    checks = harness.verify(kernels.get(name), "cuda", all_configs=True)
    failed = [c for c in checks if not c.ok]
    assert checks and not failed, failed[:3]


def test_bench_times_each_kernel_and_saves_what_substitution_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("TAPEOUT_KERNEL_CACHE", str(tmp_path))
    from tapeout.measurement import kernel_harness as harness
    from tapeout.targets import kernels
    from tapeout.targets.kernels import timings

    kernel = kernels.get("add-layernorm")
    rows = harness.bench(kernel, "float16", calls=20)
    assert rows and all(
        r.kernel_ms > 0 and r.kernel_p90_ms >= r.kernel_ms and r.eager_ms and r.launch_us > 0 for r in rows
    )
    saved = timings.load(harness.gpu()["key"])
    assert {timings.entry_key(kernel.name, r.case, "float16") for r in rows} <= set(saved)
