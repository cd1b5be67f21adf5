"""ort-cuda on a real NVIDIA GPU: the three samples build and check at FP16, NVML energy, IOBinding and
CUDA-graph timings, a GPU memory budget. Skipped, with the reason, where no CUDA EP can run (the CPU
onnxruntime wheel, no GPU, or missing CUDA/cuDNN libraries): the main suite needs no GPU.

Needs the device-side install from the README (onnxruntime-gpu in place of onnxruntime, nvidia-ml-py).
"""

from __future__ import annotations

import json

import pytest

from conftest import SAMPLES, gpu_profile, run_cli
from tapeout import targets
from tapeout.core.config import load_device

PROBE = targets.target_class("ort-cuda").probe()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not PROBE.available, reason=f"no usable CUDA EP: {PROBE.reason}")]


def _profile(tmp_path, name, base="cuda-fp16", graph="false", budgets=""):
    return gpu_profile(tmp_path / f"{name}.toml", base, budgets, options=f"cuda_graph = {graph}")


def _build(tmp_path, sample, profile, name):
    out = tmp_path / name
    result = run_cli(
        "build",
        SAMPLES / sample / ("forward.toml" if sample == "tiny-lm" else ""),
        "--profile",
        profile,
        "--out",
        out,
        "--json",
    )
    return result, out


@pytest.mark.parametrize("sample", ["digits-cnn", "minilm", "tiny-lm"])
def test_samples_build_and_check_on_cuda_fp16(tmp_path, sample):
    # tiny-lm's metric is perplexity (~4.15): half a point of it is far too loose, 0.05 is about 1 %
    budgets = "accuracy_max_drop = 0.05" if sample == "tiny-lm" else ""
    result, out = _build(tmp_path, sample, _profile(tmp_path, "fp16", budgets=budgets), "b")
    assert result.code == 0, result.err
    report = result.json()
    verdicts = {b["budget"]: b["verdict"] for b in report["budgets"]}
    assert verdicts["parity_min_cosine"] == "pass" and verdicts["accuracy_max_drop"] == "pass"
    assert report["target"]["name"] == "ort-cuda" and report["quantization"]["plan"]["method"] == "float16"
    assert "FP16" in report["artifact"]["meta"]["weights"]
    m = report["measurement"]
    assert m["latency_e2e_ms"] is not None  # IOBinding timed apart from the host copies
    assert m["latency_e2e_ms"]["quantiles"]["p50"]["point"] >= m["latency_ms"]["quantiles"]["p50"]["lower"]
    assert report["device"]["reported"] and m["memory_mb"]["device_peak"] > 0
    assert {t["provider"] for t in m["op_profile"]["op_types"]} >= {"CUDAExecutionProvider"}
    check = run_cli("check", out, "--json")
    assert check.code == 0, check.err
    assert json.loads((out / "check.json").read_text())["parity"][0]["within_tolerance"]


def test_nvml_energy_is_nonzero_and_consistent_with_power_times_time(tmp_path):
    result, _ = _build(
        tmp_path, "minilm", _profile(tmp_path, "fp16", budgets="energy_mj = 1000\npower_avg_w = 2000"), "b"
    )
    assert result.code == 0, result.err
    m = result.json()["measurement"]
    energy = m["energy"]
    assert energy["meter"] == "nvml" and energy["mj_per_inference"] > 0
    lo, hi = energy["mj_bounds"]
    assert lo <= energy["mj_per_inference"] <= hi
    for reading, window in zip(m["meters"]["nvml"], energy["window_s"], strict=True):
        # the counter's energy over the window against NVML's own power reading (a ~1 s average) × the window
        assert reading["energy_j"] == pytest.approx(reading["power_sampled_w"] * window, rel=0.5)
        assert 10 < reading["power_avg_w"] <= (m["device"]["power_limit_w"] or 2000) * 1.1
    verdicts = {b["budget"]: b for b in result.json()["budgets"]}
    assert verdicts["energy_mj"]["verdict"] == "pass" and "NVML" in verdicts["energy_mj"]["reason"]


def test_iobinding_and_cuda_graph_timings(tmp_path):
    plain, _ = _build(tmp_path, "digits-cnn", _profile(tmp_path, "plain", base="cuda-fp32"), "plain")
    graph, _ = _build(tmp_path, "digits-cnn", _profile(tmp_path, "graph", base="cuda-fp32", graph="true"), "graph")
    assert plain.code == 0 and graph.code == 0, plain.err + graph.err
    p50 = {
        name: r.json()["measurement"]["latency_ms"]["quantiles"]["p50"]["point"]
        for name, r in (("plain", plain), ("graph", graph))
    }
    e2e = graph.json()["measurement"]["latency_e2e_ms"]["quantiles"]["p50"]["point"]
    print(
        f"digits-cnn fp32 p50: IOBinding {p50['plain']:.4f} ms, CUDA graph {p50['graph']:.4f} ms, "
        f"graph with host copies {e2e:.4f} ms"
    )
    assert p50["graph"] <= p50["plain"] * 1.2  # one graph launch instead of one per node: never much slower
    assert e2e >= p50["graph"]
    assert graph.json()["artifact"]["meta"]["cuda_graph"] is True


def test_a_gpu_memory_budget_below_the_measured_peak_fails(tmp_path):
    first, _ = _build(tmp_path, "digits-cnn", _profile(tmp_path, "fp32", base="cuda-fp32"), "first")
    assert first.code == 0, first.err
    peak = first.json()["measurement"]["memory_mb"]["device_peak"]
    tight, _ = _build(
        tmp_path,
        "digits-cnn",
        _profile(tmp_path, "tight", base="cuda-fp32", budgets=f"gpu_memory_mb = {peak / 2:.1f}"),
        "tight",
    )
    assert tight.code == 1
    verdict = next(b for b in tight.json()["budgets"] if b["budget"] == "gpu_memory_mb")
    assert verdict["verdict"] == "fail" and verdict["measured"] > peak / 2


def test_the_device_that_ran_is_compared_with_the_profile_device(tmp_path):
    profile = tmp_path / "h100.toml"
    profile.write_text(
        'extends = "cuda-fp32"\ndevice = "h100-sxm"\n[check]\niterations = 50\nrepeats = 1\n'
        "energy_window_s = 0.5\nop_profile = false\n"
    )
    result, _ = _build(tmp_path, "digits-cnn", profile, "b")
    assert result.code == 0, result.err
    device = result.json()["device"]
    assert device["spec"] == "h100-sxm" and device["matches"] == load_device("h100-sxm").matches(device["reported"])
    if not device["matches"]:
        assert device["reported"] in " ".join(result.json()["measurement"]["notes"])


@pytest.mark.parametrize("base", ["cuda-fp32", "cuda-fp16"])
def test_tiny_lm_generates_with_its_kv_cache_in_gpu_memory(tmp_path, base):
    """The generate workload on the GPU: prefill and decode with the KV cache bound in device memory between steps
    (the logits alone come back), greedy agreement with torch over the golden prompts, the device memory split."""
    budgets = "accuracy_max_drop = 0.05" if base == "cuda-fp16" else ""
    result = run_cli(
        "build",
        SAMPLES / "tiny-lm",
        "--profile",
        _profile(tmp_path, base, base=base, budgets=budgets),
        "--out",
        tmp_path / "b",
        "--json",
    )
    assert result.code == 0, result.err
    w = result.json()["workload"]
    print(
        f"tiny-lm {base}: TTFT@64 p50 {w['ttft_ms']['64']['quantiles']['p50']['point']:.3f} ms, TPOT p50 "
        f"{w['tpot_ms']['quantiles']['p50']['point']:.3f} ms, agreement {w['agreement']['share']:.0%}, device "
        f"memory {w['memory_mb']['device']}"
    )
    assert any("resident in CUDA memory" in n for n in w["notes"])
    assert w["agreement"]["share"] >= (0.9 if base == "cuda-fp32" else 0.5)
    device = w["memory_mb"]["device"]
    assert device["peak"] > device["weights"] > 0 and device["kv_cache"] > 0
    check = run_cli("check", tmp_path / "b", "--json")
    assert check.code == 0, check.err


def test_speech_vad_streams_with_its_state_in_gpu_memory(tmp_path):
    """The stream workload on the GPU: the GRU state and audio context stay in device memory between chunks, and
    the streamed outputs follow the torch reference over the golden stream (state drift would show)."""
    result = run_cli(
        "build",
        SAMPLES / "speech-vad",
        "--profile",
        _profile(tmp_path, "fp32", base="cuda-fp32"),
        "--out",
        tmp_path / "b",
        "--json",
    )
    assert result.code == 0, result.err
    w = result.json()["workload"]
    print(
        f"speech-vad cuda-fp32: chunk p50 {w['chunk_ms']['quantiles']['p50']['point']:.4f} ms, drift "
        f"{w['drift']['max_abs_error']:.2e}"
    )
    assert any("resident in CUDA memory" in n for n in w["notes"])
    assert w["drift"]["max_abs_error"] < 1e-3
    assert w["deadline"]["misses"] == 0 and w["memory_mb"]["device"]["peak"] > 0
