"""Qualcomm Hexagon through the QNN EP: real EPContext compiles for named SoCs, real runs on the x86 HTP
emulator, the op-trace lint and the placement gate. Skipped where onnxruntime-qnn is not installed."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import SAMPLES, one_line_error, run_cli

pytest.importorskip("onnxruntime_qnn", reason="the qnn extra (onnxruntime-qnn) is not installed")

FAST = """
[check]
iterations = 30
repeats = 1
warmup_min_s = 0.05
"""


@pytest.fixture(scope="module")
def digits_qnn(tmp_path_factory):
    out = tmp_path_factory.mktemp("qnn") / "digits"
    profile = out.parent / "phone.toml"
    profile.write_text('extends = "qnn-sm8650"\n' + FAST)
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", profile, "--out", out)
    assert result.code == 0, result.err + result.out
    return out


def test_digits_builds_for_the_phone_with_every_node_on_the_htp(digits_qnn):
    report = json.loads((digits_qnn / "report.json").read_text())
    assert sorted(report["artifact"]["files"]) == ["model_ctx.onnx", "model_ctx_qnn.bin"]
    meta = report["artifact"]["meta"]
    assert (meta["htp_arch"], meta["soc_model"]) == (75, 57)
    placement = report["placement"]
    assert placement["off_share"] == 0 and placement["off"] == [] and placement["total_nodes"] > 20
    verdicts = {b["budget"]: b["verdict"] for b in report["budgets"]}
    assert verdicts == {"placement_max_off_share": "pass", "parity_min_cosine": "pass", "accuracy_max_drop": "pass"}
    assert report["quantization"]["plan"]["method"] == "npu-static"
    ctx = onnx.load(digits_qnn / "artifact" / "model_ctx.onnx")
    assert [n.op_type for n in ctx.graph.node] == ["EPContext"]  # the whole graph is one NPU context


def test_check_passes_through_the_emulator_with_fallback_off_and_clean_json(digits_qnn, tmp_path):
    result = run_cli("check", digits_qnn, "--json")
    assert result.code == 0, result.err
    report = result.json()  # the QNN libraries' banners must not leak into stdout
    assert report["target"]["emulated"].startswith("HTP emulator")
    assert next(b for b in report["budgets"] if b["budget"] == "parity_min_cosine")["verdict"] == "pass"
    # The device side needs no torch: block it and the host-side packages, check again.
    blocked = tmp_path / "blocked"
    for name in ("torch", "transformers", "onnxscript", "sklearn"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is host-side only')\n")
    path = os.pathsep.join([str(blocked), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    assert run_cli("check", digits_qnn, env={"PYTHONPATH": path}).code == 0


def test_a_device_measurement_runs_without_an_op_profile(digits_qnn):
    """On a Snapdragon nothing is emulated and the profile's op_profile stays on; qnn declares no op
    profiler (capabilities.op_profiler is None), so the measurement must skip it, not crash."""
    from tapeout import targets
    from tapeout.core.artifact import Artifact
    from tapeout.core.profile_schema import CheckSettings
    from tapeout.measurement import measure

    manifest = json.loads((digits_qnn / "manifest.json").read_text())
    artifact = Artifact("qnn", digits_qnn / "artifact", manifest["artifact"]["main_file"])
    settings = CheckSettings(iterations=10, repeats=1, warmup_min_s=0.0, op_profile=True)
    target = targets.create("qnn", manifest["options_resolved"])
    m = measure.measure(target, artifact, digits_qnn / "golden.npz", settings)
    assert m.op_profile is None and len(m.outputs) == manifest["golden"]["samples"]


def test_latency_through_the_emulator_is_estimated_and_memory_unmeasured(tmp_path):
    profile = tmp_path / "p.toml"
    profile.write_text('extends = "qnn-sm8650"\n[budgets]\nlatency_p50_ms = 0.0001\npeak_memory_mb = 1\n' + FAST)
    out = tmp_path / "b"
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", profile, "--out", out)
    assert result.code == 0, result.err + result.out  # an impossible latency is not judged on an emulator …
    report = json.loads((out / "report.json").read_text())
    budgets = {b["budget"]: b for b in report["budgets"]}
    memory = budgets["peak_memory_mb"]
    assert memory["verdict"] == "unmeasured" and memory["measured"] is None
    assert "emulated" in memory["reason"] and "on the device" in memory["reason"]
    # … its latency is estimated for the Snapdragon's spec: even the roofline bound is over 0.1 µs
    latency = budgets["latency_p50_ms"]
    assert latency["verdict"] == "estimated-fail" and "emulated" in latency["reason"]
    assert (
        latency["measured"] == report["estimate"]["lower_bound_ms"]
        and report["estimate"]["device"] == "snapdragon-8-gen3"
    )
    assert report["bottlenecks"] is None  # the emulator's op times are not the device's
    assert run_cli("check", out, "--strict").code == 1  # … and --strict counts them as failures


def _det_project(tmp_path):
    """A graph with one op the HTP lacks (Det) between two it has."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu0"),
        helper.make_node("Det", ["r"], ["d"], name="det0"),
        helper.make_node("Mul", ["d", "two"], ["y"], name="mul0"),
    ]
    graph = helper.make_graph(
        nodes,
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [onnx.numpy_helper.from_array(np.array([2.0], np.float32), "two")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    project = tmp_path / "det"
    project.mkdir()
    onnx.save(model, project / "model.onnx")
    (project / "tapeout.toml").write_text(
        '[model]\nsource = "model.onnx"\n[[inputs]]\nname = "x"\nshape = [2, 4, 4]\nrange = [-1.0, 1.0]\n'
    )
    return project


def _profile(tmp_path, name: str, extra: str) -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        'extends = "qnn-sm8650"\nprecision = "fp32"\n[check.parity]\natol = 0.05\nrtol = 0.05\n'
        "min_cosine = 0.999\n" + FAST + extra
    )
    return str(path)


def test_an_unsupported_op_fails_the_lint_and_the_build_naming_the_node(tmp_path):
    project = _det_project(tmp_path)
    strict = _profile(tmp_path, "strict", "")
    lint = run_cli("lint", project, "--profile", strict)
    assert lint.code == 2 and "[det0] Det node does not run on the HTP" in lint.out, lint.out
    build = run_cli("build", project, "--profile", strict, "--out", tmp_path / "b")
    assert build.code == 2 and "det0" in one_line_error(build)
    assert not (tmp_path / "b").exists()  # no half-written build


def test_with_fallback_allowed_the_placement_gate_reports_the_share_off_the_npu(tmp_path):
    project = _det_project(tmp_path)
    loose = _profile(
        tmp_path, "loose", "[options]\nallow_cpu_fallback = true\n[budgets]\nplacement_max_off_share = 0.5\n"
    )
    out = tmp_path / "ok"
    result = run_cli("build", project, "--profile", loose, "--out", out)
    assert result.code == 0, result.err + result.out
    report = json.loads((out / "report.json").read_text())
    gate = next(b for b in report["budgets"] if b["budget"] == "placement_max_off_share")
    assert gate["verdict"] == "pass" and gate["measured"] == pytest.approx(1 / 3)
    assert "2/3 nodes on the HTP" in gate["reason"] and "det0 (Det)" in gate["reason"]
    assert "det0" in (out / "report.md").read_text()
    tight = _profile(
        tmp_path, "tight", "[options]\nallow_cpu_fallback = true\n[budgets]\nplacement_max_off_share = 0.1\n"
    )
    assert run_cli("build", project, "--profile", tight, "--out", tmp_path / "fail").code == 1


def test_context_binaries_are_prepared_per_soc(tmp_path):
    from tapeout import targets
    from tapeout.core.schemas import InputSpec

    relu = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "r",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
    )
    model = helper.make_model(relu, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "relu.onnx")
    digests = {}
    for arch, soc in ((73, 60), (75, 57)):
        qnn = targets.create("qnn", {"htp_arch": arch, "soc_model": soc})
        art = qnn.compile(tmp_path / "relu.onnx", tmp_path / f"a{arch}", [InputSpec(name="x", shape=[1, 8])], {})
        digests[arch] = hashlib.sha256((art.directory / "model_ctx_qnn.bin").read_bytes()).hexdigest()
        out = qnn.session(art).run({"x": np.linspace(-1, 1, 8, dtype=np.float32)[None]})
        assert np.allclose(out["y"], np.maximum(np.linspace(-1, 1, 8), 0), atol=1e-2)
    assert digests[73] != digests[75]


@pytest.mark.parametrize("profile", ["openvino-npu", "openvino-npu-int8", "openvino-npu-int4"])
def test_openvino_npu_profile_without_the_driver_exits_4(tmp_path, profile):
    pytest.importorskip("openvino")
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", profile, "--out", tmp_path / "b")
    assert result.code == 4, result.err
    assert "NPU" in one_line_error(result)
