"""The tensorrt target on a machine without TensorRT or a GPU.

What runs for real here: the host side of a build (export, NVIDIA Model Optimizer's INT8 Q/DQ calibrated
on ONNX Runtime's CPU EP, the optimization profile, engine-settings.json, the lint against TensorRT's
operator list), and the exit 4 of `check` without TensorRT. What does not: TensorRT itself. The
device-side tests below check tapeout's side of the contract (which builder calls it makes, the engine
cache and its key, the rebuild reasons, the precision check of the built engine) against
tests/trt_standin.py, a stand-in whose names are TensorRT's own API (from NVIDIA's stubs, TensorRT 11
removals applied) and which fails on a call the real API does not have. tests/gpu/test_tensorrt_engines.py
runs the real thing where a GPU with TensorRT is.
"""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import onnx
import pytest
import trt_standin
from onnx import TensorProto, helper

from conftest import SAMPLES, one_line_error, run_cli
from tapeout import targets
from tapeout.core.artifact import Artifact
from tapeout.core.errors import BadInput, TapeoutError, TargetUnavailable
from tapeout.core.schemas import InputSpec
from tapeout.reports.markdown import render_markdown
from tapeout.targets import cuda_rt

pytestmark = pytest.mark.skipif(
    targets.target_class("tensorrt").probe().available,
    reason="TensorRT is installed here: tests/gpu/test_tensorrt_engines.py covers the real thing",
)
H100 = cuda_rt.Gpu(0, "NVIDIA H100 80GB HBM3", (9, 0), "13.0", "13.0")


@pytest.fixture(scope="module")
def int8_build(tmp_path_factory):
    """digits-cnn on tensorrt-int8, built here: everything but the engine."""
    out = tmp_path_factory.mktemp("trt") / "int8"
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", "tensorrt-int8", "--out", out)
    assert result.code == 0, result.err + result.out
    return out


@pytest.fixture
def standin(monkeypatch):
    """The stand-in as `tensorrt`, and this host pretending to be an H100 to tapeout's CUDA helper."""
    module, state = trt_standin.install("11.4.0.106")
    monkeypatch.setattr(cuda_rt, "gpu", lambda index: H100)
    monkeypatch.setattr(cuda_rt, "set_device", lambda index: None)
    yield module, state
    sys.modules.pop("tensorrt", None)


def _copy(build, tmp_path):
    dst = tmp_path / "build"
    shutil.copytree(build, dst)
    return dst


def _target(build_dir):
    man = json.loads((build_dir / "manifest.json").read_text())
    return targets.create("tensorrt", man["profile"]["options"]), Artifact(
        "tensorrt", build_dir / "artifact", "model.onnx"
    )


def test_host_build_writes_symmetric_qdq_onnx_and_engine_settings(int8_build):
    model = onnx.load(str(int8_build / "artifact" / "model.onnx"))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("QuantizeLinear") >= 2 and "Cast" in ops  # INT8 Q/DQ, remainder cast to FP16
    from tapeout.core.onnx_graphs import nonzero_zero_points

    assert nonzero_zero_points(model) == []  # TensorRT takes symmetric Q/DQ only
    settings = json.loads((int8_build / "artifact" / "engine-settings.json").read_text())
    assert settings["schema"] == "tapeout.engine-settings/1" and settings["strongly_typed"]
    assert settings["profile"]["image"] == {"min": [1, 1, 8, 8], "opt": [1, 1, 8, 8], "max": [1, 1, 8, 8]}
    assert settings["expect"] == ["FP16", "FP32", "INT8"]
    report = json.loads((int8_build / "report.json").read_text())
    assert "compiled on the device" in report["target"]["emulated"] and report["target"]["compile_on"] == "device"
    assert report["engine"] is None
    plan = report["quantization"]["plan"]
    assert plan["method"] == "modelopt" and plan["activation_symmetric"]
    precisions = {g["role"]: g["precision"] for g in plan["groups"]}
    assert precisions["first_conv"] == "fp16" and precisions["conv"] == "int8"  # kept float = FP16 here
    # digits-cnn's 512→64 hidden Linear at batch 1 is a GEMV, which ModelOpt leaves FP16: recorded as such
    linear = next(g for g in plan["groups"] if g["role"] == "linear")
    assert linear["precision"] == "fp16" and "left FP16 by ModelOpt" in linear["reason"]
    assert report["accuracy"]["artifact"] >= report["accuracy"]["reference"] - 0.01
    man = json.loads((int8_build / "manifest.json").read_text())
    assert man["artifact"]["meta"]["prepared_for"] == "tensorrt 11.4"
    assert set(man["artifact"]["files"]) == {"model.onnx", "engine-settings.json"}


def test_check_without_tensorrt_exits_4_naming_what_to_install(int8_build, tmp_path):
    result = run_cli("check", _copy(int8_build, tmp_path))
    assert result.code == 4, result.err
    line = one_line_error(result)
    assert "tensorrt" in line and "pip install" in line


def test_engine_is_built_once_with_strong_typing_and_no_precision_flags_then_reused(int8_build, tmp_path, standin):
    _, state = standin
    build_dir = _copy(int8_build, tmp_path)
    target, artifact = _target(build_dir)
    lines = []
    first = target.build_engine(artifact, lines.append)
    assert first.action == "built" and first.reason == "no engine cached in this build dir yet"
    assert (
        (build_dir / first.file).is_file()
        and first.key["gpu"] == H100.name
        and first.key["compute_capability"] == "9.0"
    )
    assert any("building the TensorRT engine for NVIDIA H100" in line for line in lines)
    engine = json.loads((build_dir / first.file).read_bytes())
    assert engine["network_flags"] == 1 << int(sys.modules["tensorrt"].NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    assert engine["flags"] == ["-TF32"]  # TF32 off (tf32 = false); no FP16/INT8 flag exists in TensorRT 11
    assert engine["profiles"] == [{"image": [[1, 1, 8, 8]] * 3}]
    assert engine["values"]["profiling_verbosity"].endswith("DETAILED: 0>")
    plan = json.loads((build_dir / "report.json").read_text())["quantization"]["plan"]
    int8 = sum(len(g["nodes"]) for g in plan["groups"] if g["precision"] == "int8")
    assert int8 >= 1 and first.summary["precisions"] == {"INT8": int8, "FP16": 4 - int8}
    assert state.called("IBuilderConfig.set_timing_cache")
    assert list((build_dir / "engines").glob("timing-*.cache"))

    second = target.build_engine(artifact, lines.append)
    assert second.action == "reused" and second.file == first.file
    assert len(state.called("Builder.build_serialized_network")) == 1

    report = json.loads((build_dir / "report.json").read_text())
    report["engine"] = first.to_json()
    from tapeout.records.report import Report

    text = render_markdown(Report.model_validate(report))
    assert "## Engine" in text and "**Built**" in text
    assert f"INT8 {int8}" in text and f"FP16 {4 - int8}" in text and "Cache key: gpu NVIDIA H100 80GB HBM3" in text


def test_another_tensorrt_version_or_gpu_rebuilds_and_says_why(int8_build, tmp_path, standin, monkeypatch):
    build_dir = _copy(int8_build, tmp_path)
    target, artifact = _target(build_dir)
    target.build_engine(artifact, lambda _: None)
    sys.modules.pop("tensorrt")
    trt_standin.install("10.13.0.35")
    rebuilt = target.build_engine(artifact, lambda _: None)
    assert rebuilt.action == "built"
    assert "toolchain tensorrt 11.4.0.106 → tensorrt 10.13.0.35" in rebuilt.reason
    assert "the ONNX was prepared for tensorrt 11.4, this device has 10.13" in rebuilt.reason
    monkeypatch.setattr(cuda_rt, "gpu", lambda index: cuda_rt.Gpu(0, "NVIDIA A100-SXM4-80GB", (8, 0), "13.0", "13.0"))
    on_a100 = target.build_engine(artifact, lambda _: None)
    assert "GPU NVIDIA H100 80GB HBM3 → NVIDIA A100-SXM4-80GB" in on_a100.reason
    assert "compute capability 9.0 → 8.0" in on_a100.reason
    assert len(list((build_dir / "engines").glob("*.engine"))) == 3


def test_an_engine_in_another_precision_than_the_graph_fails_loudly(int8_build, tmp_path, standin):
    """TensorRT 11 builds FP32 where code still sets the removed FP16 flag (research nvidia.md §1.4): the
    inspector's layer types must hold the precisions the ONNX asks for."""
    _, state = standin
    state.layer_precision = "Float"
    target, artifact = _target(_copy(int8_build, tmp_path))
    with pytest.raises(TapeoutError, match=r"no FP16, INT8 layer although the ONNX asks for it"):
        target.build_engine(artifact, lambda _: None)


def test_parser_refusal_names_the_node_and_a_failed_build_quotes_the_log(int8_build, tmp_path, standin):
    _, state = standin
    target, artifact = _target(_copy(int8_build, tmp_path))
    state.refuse_ops = {"Gemm"}
    with pytest.raises(BadInput, match=r"ONNX parser refused the model: node .* \(Gemm\): stand-in: no importer"):
        target.build_engine(artifact, lambda _: None)
    state.refuse_ops = set()
    state.fail_build = True
    with pytest.raises(
        TapeoutError, match="could not build the engine: stand-in: no implementation found for layer conv1"
    ):
        target.build_engine(artifact, lambda _: None)


def test_a_changed_engine_is_never_loaded(int8_build, tmp_path, standin):
    build_dir = _copy(int8_build, tmp_path)
    target, artifact = _target(build_dir)
    built = target.build_engine(artifact, lambda _: None)
    (build_dir / built.file).write_bytes(b"not the engine tapeout built")
    with pytest.raises(BadInput, match="sha256 mismatch"):
        target._engine(artifact)
    assert target.build_engine(artifact, lambda _: None).action == "built"  # and the cache heals by rebuilding


def test_fp8_needs_an_fp8_gpu(int8_build, tmp_path, standin, monkeypatch):
    build_dir = _copy(int8_build, tmp_path)
    target, artifact = _target(build_dir)
    settings = json.loads((build_dir / "artifact" / "engine-settings.json").read_text())
    settings["expect"] = ["FP16", "FP32", "FP8"]
    (build_dir / "artifact" / "engine-settings.json").write_text(json.dumps(settings))
    monkeypatch.setattr(cuda_rt, "gpu", lambda index: cuda_rt.Gpu(0, "NVIDIA A100-SXM4-80GB", (8, 0), "13.0", "13.0"))
    with pytest.raises(TargetUnavailable, match=r"FP8 Q/DQ, and this GPU \(NVIDIA A100-SXM4-80GB, sm_80\) has no FP8"):
        target.build_engine(artifact, lambda _: None)


def test_the_standin_refuses_what_tensorrt_11_removed(standin):
    """The stand-in is only worth its tests if a removed or misspelt API fails there as on the device."""
    trt, _ = standin
    with pytest.raises(AttributeError):
        trt.BuilderFlag.FP16  # noqa: B018
    assert not hasattr(trt, "IInt8EntropyCalibrator2")
    config = trt.Builder(None).create_builder_config()
    with pytest.raises(AttributeError):
        config.int8_calibrator = object()
    with pytest.raises(TypeError):
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE)  # one argument short
    with pytest.raises(AttributeError):
        trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH  # noqa: B018


def _model(tmp_path, nodes, initializers=(), opset=17, domain_ops=()):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=list(initializers),
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), *[helper.make_opsetid(d, 1) for d in domain_ops]]
    )
    model.ir_version = 8
    return model


def test_lint_names_nodes_tensorrt_cannot_parse(tmp_path):
    from tapeout.targets.tensorrt import lint_ops

    model = _model(
        tmp_path,
        [
            helper.make_node("Unique", ["x"], ["u"], name="uniq"),
            helper.make_node("FusedMatMul", ["u", "u"], ["y"], name="fused", domain="com.microsoft"),
        ],
        domain_ops=["com.microsoft"],
    )
    issues = {i.node: i for i in lint_ops(model, "11.4")}
    assert issues["uniq"].severity == "error" and "Unique is not supported by TensorRT 11.4" in issues["uniq"].problem
    assert issues["fused"].severity == "error" and "custom operator" in issues["fused"].problem
    old = _model(tmp_path, [helper.make_node("Relu", ["x"], ["y"], name="r")], opset=23)
    assert any("opset 23 is outside TensorRT 10.3's parser range 9..20" in i.problem for i in lint_ops(old, "10.3"))
    assert not lint_ops(old, "11.4")
    rms = _model(tmp_path, [helper.make_node("RMSNormalization", ["x", "x"], ["y"], name="rms")], opset=23)
    assert not lint_ops(rms, "11.4") and lint_ops(rms, "10.3")  # added in 10.15
    ints = [helper.make_tensor(n, TensorProto.INT64, [1], [v]) for n, v in (("starts", 0), ("ends", 2))]
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"], name="slice")],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["time", 4]),
            helper.make_tensor_value_info("axes", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[*ints, helper.make_tensor("w", TensorProto.DOUBLE, [1], [1.0])],
    )
    computed = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    found = {(i.node, i.severity): i.problem for i in lint_ops(computed, "11.4")}
    assert "Slice input `axes` is computed" in found[("slice", "warning")]
    assert "TensorRT casts DOUBLE down to FLOAT" in found[("w", "warning")]
    zp = helper.make_tensor("zp", TensorProto.INT8, [], [3])
    scale = helper.make_tensor("s", TensorProto.FLOAT, [], [0.1])
    asym = _model(tmp_path, [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"], name="q")], [scale, zp])
    assert any(i.node == "q" and "symmetric" in i.problem for i in lint_ops(asym, "11.4"))


def test_optimization_profile_from_dims_and_options():
    from tapeout.targets.tensorrt import Options, optimization_profile

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph)
    inputs = [InputSpec(name="x", shape=["batch", "seq"])]
    shapes = optimization_profile(
        model, inputs, {"batch": 1, "seq": 128}, Options(dims_min={"seq": 16}, dims_max={"batch": 8, "seq": 512})
    )
    assert shapes == {"x": {"min": [1, 16], "opt": [1, 128], "max": [8, 512]}}
    with pytest.raises(BadInput, match="min 256 ≤ opt 128"):
        optimization_profile(model, inputs, {"batch": 1, "seq": 128}, Options(dims_min={"seq": 256}))
    with pytest.raises(BadInput, match="dims_min/dims_max name dim"):
        optimization_profile(model, inputs, {"batch": 1, "seq": 128}, Options(dims_max={"tokens": 9}))


def test_fp8_profile_for_a_device_without_fp8_is_a_clear_error(tmp_path):
    profile = tmp_path / "orin-fp8.toml"
    profile.write_text('extends = "tensorrt-fp8"\ndevice = "jetson-orin-nano-super"\n')
    for command in ("lint", "build"):
        result = run_cli(
            command,
            SAMPLES / "digits-cnn",
            "--profile",
            profile,
            *(["--out", tmp_path / "b"] if command == "build" else []),
        )
        assert result.code == 2, result.err
        line = one_line_error(result)
        assert "jetson-orin-nano-super lists no fp8 peak" in line and 'precision = "int8"' in line
    assert not (tmp_path / "b").exists()


def test_engine_inspector_json_of_both_schemas():
    from tapeout.targets.tensorrt_engine import parse_layers

    v10 = {
        "Layers": [
            {
                "Name": "conv1",
                "LayerType": "CaskConvolution",
                "Inputs": [{"Format/Datatype": "Channel major INT8 format where channel % 32 == 0"}],
                "Outputs": [{"Format/Datatype": "Row major linear FP16 format"}],
                "TacticName": "sm80_xmma_fprop_sparse_conv_interleaved_i8i8",
            },
            "names_only_layer",
        ]
    }
    v11 = {
        "Layers": [
            {
                "Name": "gemm",
                "LayerType": "CaskGemm",
                "Inputs": [{"DataType": "Half"}],
                "Outputs": [{"DataType": "Half"}],
                "TacticName": "sm90_xmma_gemm_f16",
            }
        ]
    }
    assert parse_layers(v10) == [
        {
            "name": "conv1",
            "type": "CaskConvolution",
            "precision": "INT8",
            "tactic": "sm80_xmma_fprop_sparse_conv_interleaved_i8i8",
            "sparse": True,
        },
        {"name": "names_only_layer", "type": "", "precision": "unknown", "tactic": ""},
    ]
    assert parse_layers(v11)[0]["precision"] == "FP16" and not parse_layers(v11)[0]["sparse"]


def test_the_real_cuda_runtime_loads_and_says_why_no_gpu_is_usable():
    """libcudart from the nvidia-cuda-runtime wheel (test extra), found in site-packages by tapeout's loader and
    called for real: here, without an NVIDIA driver, one clear exit-4 line; with a GPU, the GPU's name."""
    cuda_rt.library.cache_clear()
    try:
        cuda_rt.library()
    except TargetUnavailable:
        pytest.skip("no libcudart here (the test extra installs nvidia-cuda-runtime on x86-64)")
    try:
        gpu = cuda_rt.gpu(0)
    except TargetUnavailable as exc:
        assert "cudaGetDeviceCount failed" in str(exc) and "error" in str(exc)
    else:
        assert gpu.name and gpu.compute_capability >= (5, 0)


def test_cuda_runtime_missing_is_a_clear_unavailable(monkeypatch):
    """Without libcudart (this machine) the CUDA helper says what is missing, exit 4; never an OSError."""
    cuda_rt.library.cache_clear()
    monkeypatch.setattr(cuda_rt, "_NAMES", ("libcudart-does-not-exist.so",))
    monkeypatch.setattr(sys, "path", [])
    try:
        with pytest.raises(TargetUnavailable, match="libcudart"):
            cuda_rt.device_count()
    finally:
        cuda_rt.library.cache_clear()


def test_golden_parity_inputs_run_on_the_qdq_onnx_here(int8_build):
    """The Q/DQ + FP16 graph the engine is built from runs on ORT here and agrees with the golden outputs."""
    from tapeout.records.golden import load_golden

    inputs, outputs = load_golden(int8_build / "golden.npz")
    sess = targets.reference_session(int8_build / "artifact" / "model.onnx")
    got = sess.run(inputs[0])
    ref = outputs[0]
    for name, value in ref.items():
        cos = float(np.dot(got[name].ravel(), value.ravel()) / (np.linalg.norm(got[name]) * np.linalg.norm(value)))
        assert cos > 0.99


def test_sparse_weights_reach_the_builder_and_the_report_names_sparse_layers(int8_build, tmp_path, standin):
    build_dir = _copy(int8_build, tmp_path)
    target, artifact = _target(build_dir)
    settings = json.loads((build_dir / "artifact" / "engine-settings.json").read_text())
    settings["builder"]["sparse_weights"] = True
    (build_dir / "artifact" / "engine-settings.json").write_text(json.dumps(settings))
    built = target.build_engine(artifact, lambda _: None)
    assert "SPARSE_WEIGHTS" in json.loads((build_dir / built.file).read_bytes())["flags"]
    assert built.summary["sparse_weights"] and len(built.summary["sparse_layers"]) == 4  # the stand-in's tactics
