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
import torch

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


# full suite only: the fast subset still sees the plug-in pass applied in the plug-in target's build
@pytest.mark.slow
def test_a_graph_pass_from_another_package_runs_where_its_precondition_holds(toy_build, tmp_path):
    passes = {p["name"]: p for p in json.loads((toy_build / "report.json").read_text())["passes"]}
    assert passes["toy-relu-as-max"]["outcome"] == "applied" and passes["toy-relu-as-max"]["rewrites"] > 0
    assert passes["fold-recurrent-weights"]["outcome"] == "skipped"  # digits has no LSTM: says why
    ops = {n.op_type for n in onnx.load(str(toy_build / "export" / "model.onnx")).graph.node}
    assert "Max" in ops and "Relu" not in ops  # rewritten before the export was verified against torch
    project = tmp_path / "mlp"
    project.mkdir()
    (project / "model.py").write_text(
        textwrap.dedent("""
        import torch

        def build():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    """)
    )
    (project / "tapeout.toml").write_text(
        '[model]\nsource = "model.py:build"\n[[inputs]]\nname = "x"\nshape = [1, 16]\n'
    )
    (tmp_path / "fast.toml").write_text(f'extends = "cpu-fp32"\n{FAST}')
    built = run_cli("build", project, "-p", tmp_path / "fast.toml", "-o", tmp_path / "b", env=ENV)
    assert built.code == 0, built.err
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    toy = next(p for p in report["passes"] if p["name"] == "toy-relu-as-max")
    assert toy["outcome"] == "skipped" and "precondition not met: no Conv in the model" in toy["reason"]
    assert "toy-relu-as-max" in (tmp_path / "b" / "report.md").read_text()


@pytest.mark.slow  # a calibrated static-QDQ build and its check; the fast subset keeps the toy target's build
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


@pytest.mark.slow  # an extra torch.export build; the fast subset keeps the toy target's build
def test_a_target_that_compiles_from_the_torch_export_program_is_handed_it(tmp_path):
    """Capabilities say what a target compiles from: toy-torch-export asks for the ExportedProgram, gets it at
    compile, and its artifact (the program saved) reproduces the golden outputs; for an ONNX source there is
    no program, and the build says so in one line."""
    (tmp_path / "p.toml").write_text(
        'name = "program"\ntarget = "toy-torch-export"\nprecision = "fp32"\n'
        + FAST.replace("repeats = 1", "repeats = 1\nop_profile = false")
    )
    result = run_cli("build", SAMPLES / "digits-cnn", "-p", tmp_path / "p.toml", "-o", tmp_path / "b", env=ENV)
    assert result.code == 0, result.err + result.out
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert report["artifact"]["main_file"] == "model.pt2" and report["artifact"]["meta"]["program_nodes"] > 0
    assert all(p["within_tolerance"] for p in report["parity"]) and report["parity"][0]["cosine"] > 0.99999
    assert "export the torch.export program" in result.err
    # the symbolic `batch` stays dynamic in the program the target was handed
    from tapeout.core import pt2

    program = pt2.load(tmp_path / "b" / "artifact" / "model.pt2").module()
    assert tuple(program(torch.rand(3, 1, 8, 8)).shape) == (3, 10)
    project = tmp_path / "onnx-source"
    project.mkdir()
    onnx.save(onnx.load(str(tmp_path / "b" / "export" / "model.onnx")), project / "m.onnx")
    (project / "tapeout.toml").write_text(
        '[model]\nsource = "m.onnx"\n[[inputs]]\nname = "image"\nshape = [1, 1, 8, 8]\n'
    )
    refused = run_cli("build", project, "-p", tmp_path / "p.toml", "-o", tmp_path / "c", env=ENV)
    assert refused.code == 2 and "compiles from a torch.export program" in refused.err and not (tmp_path / "c").exists()
