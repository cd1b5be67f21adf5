"""tensorrt on a real NVIDIA GPU with TensorRT: the three samples at FP16 and INT8, the engine built by
the first check and reused by the second, the per-layer profile and the engine's layers in the report.
Skipped, with the reason, where TensorRT or a GPU is missing: the main suite needs neither
(tests/test_tensorrt.py checks tapeout's side of the contract there).

Needs the device-side install from the README ("TensorRT"): tensorrt, nvidia-ml-py, and for INT8 builds
nvidia-modelopt (tapeout[tensorrt]).
"""

from __future__ import annotations

import json

import pytest

from conftest import SAMPLES, gpu_profile, run_cli
from tapeout import targets

WHY_NOT = targets.why_not_here("tensorrt")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(WHY_NOT is not None, reason=f"no TensorRT GPU here: {WHY_NOT}")]


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("sample", ["digits-cnn", "minilm", "tiny-lm"])
def test_samples_build_then_check_builds_and_reuses_the_engine(tmp_path, sample, precision):
    budgets = "accuracy_max_drop = 0.05" if sample == "tiny-lm" else ""
    profile = gpu_profile(tmp_path / f"trt-{precision}.toml", f"tensorrt-{precision}", budgets)
    out = tmp_path / "b"
    built = run_cli(
        "build",
        SAMPLES / sample / ("forward.toml" if sample == "tiny-lm" else ""),
        "--profile",
        profile,
        "--out",
        out,
        "--json",
    )
    assert built.code == 0, built.err
    report = built.json()
    assert report["engine"]["action"] == "built" and report["target"]["emulated"] is None  # the GPU is here
    precisions = report["engine"]["summary"]["precisions"]
    assert precisions.get("FP16") and (precision == "fp16" or precisions.get("INT8"))
    m = report["measurement"]
    assert m["op_profile"]["method"].startswith("TensorRT IProfiler") and m["op_profile"]["top_ops"]
    assert m["energy"] is not None and m["memory_mb"]["device_peak"] is not None
    verdicts = {b["budget"]: b["verdict"] for b in report["budgets"]}
    assert verdicts["parity_min_cosine"] == "pass"

    first = run_cli("check", out, "--json")
    assert first.code == 0, first.err
    assert first.json()["engine"]["action"] == "reused"  # built by `build` on this GPU: cached
    (out / "engines").rename(out / "engines-moved")
    rebuilt = run_cli("check", out, "--json")
    assert rebuilt.code == 0 and rebuilt.json()["engine"]["action"] == "built"
    assert "no engine cached" in rebuilt.json()["engine"]["reason"]
    again = run_cli("check", out, "--json")
    assert again.json()["engine"]["action"] == "reused"
    assert json.loads((out / "check.json").read_text())["engine"]["file"].startswith("engines/")
