"""A target, a quantization method and a graph pass added from outside the package — each one module of
tests/plugins/tapeout_toys and one line of its entry_points.txt — work end to end through build and check, and
the report says what each did. Nothing of tapeout is edited to add them."""

from __future__ import annotations

import json
import os
import textwrap

import numpy as np
import onnx
import pytest

from conftest import REPO, SAMPLES, run_cli

ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests" / "plugins"), os.environ.get("PYTHONPATH")]))}
FAST = "[check]\niterations = 30\nrepeats = 1\nwarmup_min_s = 0.05\nop_profile_iterations = 5\n"


@pytest.fixture(scope="module")
def toy_build(tmp_path_factory):
    """digits-cnn built for the plug-in target `toy-ort` (the plug-in pass runs on its export too)."""
    root = tmp_path_factory.mktemp("toys")
    (root / "toy.toml").write_text(f'name = "toy"\ntarget = "toy-ort"\nprecision = "fp32"\n{FAST}')
    result = run_cli("build", SAMPLES / "digits-cnn", "-p", root / "toy.toml", "-o", root / "b", env=ENV)
    assert result.code == 0, result.err + result.out
    return root / "b"


def test_a_target_from_another_package_builds_and_checks(toy_build):
    report = json.loads((toy_build / "report.json").read_text())
    assert report["target"]["name"] == "toy-ort" and report["profile"]["target"] == "toy-ort"
    assert report["measurement"]["latency_ms"]["count"] == 30 and report["parity"][0]["within_tolerance"]
    checked = run_cli("check", toy_build, env=ENV)
    assert checked.code == 0, checked.err
    listed = {r["target"]: r for r in run_cli("targets", "--json", env=ENV).json()}
    assert listed["toy-ort"]["available"] and listed["toy-ort"]["summary"].endswith("(a plug-in target)")
    without = run_cli("check", toy_build)  # where the plug-in is not installed: one line, what to do
    assert without.code == 2 and "target 'toy-ort', which this tapeout does not know" in without.err


def test_a_graph_pass_from_another_package_runs_where_its_precondition_holds(toy_build, tmp_path):
    passes = {p["name"]: p for p in json.loads((toy_build / "report.json").read_text())["passes"]}
    assert passes["toy-relu-as-max"]["outcome"] == "applied" and passes["toy-relu-as-max"]["rewrites"] > 0
    assert passes["fold-recurrent-weights"]["outcome"] == "skipped"  # digits has no LSTM: says why
    ops = {n.op_type for n in onnx.load(str(toy_build / "export" / "model.onnx")).graph.node}
    assert "Max" in ops and "Relu" not in ops  # rewritten before the export was verified against torch
    project = tmp_path / "mlp"
    project.mkdir()
    (project / "model.py").write_text(textwrap.dedent("""
        import torch

        def build():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    """))
    (project / "tapeout.toml").write_text('[model]\nsource = "model.py:build"\n[[inputs]]\nname = "x"\nshape = [1, 16]\n')
    (tmp_path / "fast.toml").write_text(f'extends = "cpu-fp32"\n{FAST}')
    built = run_cli("build", project, "-p", tmp_path / "fast.toml", "-o", tmp_path / "b", env=ENV)
    assert built.code == 0, built.err
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    toy = next(p for p in report["passes"] if p["name"] == "toy-relu-as-max")
    assert toy["outcome"] == "skipped" and "precondition not met: no Conv in the model" in toy["reason"]
    assert "toy-relu-as-max" in (tmp_path / "b" / "report.md").read_text()


def test_a_quantization_method_from_another_package_quantizes_and_is_checked(tmp_path):
    (tmp_path / "toy.toml").write_text(f'extends = "cpu-int8"\n[quantization]\nmethod = "toy-int8-weights"\n{FAST}')
    result = run_cli("build", SAMPLES / "digits-cnn", "-p", tmp_path / "toy.toml", "-o", tmp_path / "b", env=ENV)
    assert result.code == 0, result.err + result.out
    q = json.loads((tmp_path / "b" / "report.json").read_text())["quantization"]
    assert q["plan"]["method"] == "toy-int8-weights" and q["plan"]["quantized_groups"] > 0
    planned = {n for g in q["plan"]["groups"] if g["precision"] == "int8" for n in g["nodes"]}
    model = onnx.load(str(tmp_path / "b" / "quantized" / "model.onnx"))
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    weights = [inits[n.input[1]] for n in model.graph.node if n.name in planned]
    assert weights and all(len(np.unique(w)) <= 255 for w in weights)
    (tmp_path / "bad.toml").write_text('extends = "qnn-sm8650"\n[quantization]\nmethod = "toy-int8-weights"\n')
    refused = run_cli("build", SAMPLES / "digits-cnn", "-p", tmp_path / "bad.toml", "-o", tmp_path / "c", env=ENV)
    assert refused.code == 2 and "full-integer static QDQ" in refused.err and not (tmp_path / "c").exists()
