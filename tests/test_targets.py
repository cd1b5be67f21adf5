"""The target contract (targets/base.py): every registered target passes the same checks, and every
target available here runs the whole hook sequence on a tiny model.

A target that cannot run here (ort-cuda without the GPU wheel) is checked for what can be: its entry,
its options, its capabilities, its profile, and that using it gives exit 4 with what to install.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from pydantic import BaseModel, ValidationError

from conftest import SAMPLES, one_line_error, run_cli
from tapeout import targets
from tapeout.core.artifact import Artifact
from tapeout.core.config import list_profiles
from tapeout.core.errors import BadInput
from tapeout.core.schemas import InputSpec
from tapeout.core.vocabulary import METERS, PRECISIONS, RULE_SETS, RUNGS
from tapeout.steps.setup import load_profile
from tapeout.targets.base import OpProfile, Probe, Session, Target

NAMES = sorted(targets.TARGETS)


def _profile_for(name: str):
    shipped = [load_profile(p) for p in list_profiles()]
    return next((p for p in shipped if p.target == name), None)


@pytest.mark.parametrize("name", NAMES)
def test_entry_class_and_options(name):
    cls = targets.target_class(name)
    assert issubclass(cls, Target) and not getattr(cls, "__abstractmethods__", None), f"{cls} is abstract"
    assert issubclass(cls.Options, BaseModel)
    config = cls.Options.model_config
    assert config.get("extra") == "forbid" and config.get("frozen"), "options must be frozen and reject unknown fields"
    profile = _profile_for(name)
    assert profile is not None, f"no shipped profile uses target '{name}'"
    with pytest.raises(ValidationError):
        cls.Options.model_validate({**profile.options, "no_such_option": 1})
    target = targets.create(name, profile.options)
    assert target.name == name and target.capabilities is targets.TARGETS[name].capabilities


@pytest.mark.parametrize("name", NAMES)
def test_capabilities_are_well_formed(name):
    caps = targets.TARGETS[name].capabilities
    assert caps.precisions and set(caps.precisions) <= set(PRECISIONS)
    for precision, ladder in caps.precisions.items():
        assert ladder and set(ladder) <= set(RUNGS), ladder
        assert ladder[-1] in ("fp32", "fp16"), f"{precision}: the last rung must be float"
        assert ladder[0] == precision, f"{precision}: the ladder starts at the precision itself"
    if set(caps.precisions) != {"fp32"}:
        assert caps.rules in RULE_SETS, f"{name} takes {list(caps.precisions)} but names no rule set"
    assert "rss" in caps.meters and set(caps.meters) <= set(METERS)
    if caps.op_profiler:
        assert targets.target_class(name).op_profile is not Target.op_profile, "a declared op profiler needs the hook"
    assert caps.compile_on in ("host", "device")
    assert all(key == key.lower() for key in caps.emulated_on)
    if caps.device_memory:
        assert caps.timing_sync == "device", "device-resident timing needs a device sync"


def test_listing_targets_and_validating_profiles_imports_no_runtime():
    code = (
        "import sys\nfrom tapeout import targets\nfrom tapeout.core.config import list_profiles\nfrom tapeout.steps.setup import load_profile\n"
        "[load_profile(p) for p in list_profiles()]\n[targets.target_class(n) for n in targets.TARGETS]\n"
        "print([m for m in ('onnxruntime', 'openvino', 'onnxruntime_qnn', 'pynvml', 'torch') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name", NAMES)
def test_probe_never_raises_and_explains_itself(name):
    probe = targets.target_class(name).probe()
    assert isinstance(probe, Probe)
    if not probe.available:
        assert probe.reason and probe.install_hint


def test_a_misspelt_or_missing_hook_fails_at_once():
    with pytest.raises(TypeError, match=r"lnit is not a hook.*did you mean 'lint'"):

        class Misspelt(Target):
            def lnit(self, model_path, inputs, dims):
                return []

    class Incomplete(Target):
        @classmethod
        def probe(cls):
            return Probe(True)

    with pytest.raises(TypeError, match="abstract"):
        Incomplete("x", targets.TARGETS["onnxruntime"].capabilities, None)


def _tiny(path):
    """y = relu(x @ W + b), static shapes: every target here can compile it (the HTP too)."""
    rng = np.random.default_rng(0)
    weight, bias = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], weight.ravel())
    b = helper.make_tensor("b", TensorProto.FLOAT, [4], bias)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["xw"], name="mm"),
            helper.make_node("Add", ["xw", "b"], ["z"], name="add"),
            helper.make_node("Relu", ["z"], ["y"], name="relu"),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return lambda x: np.maximum(x @ weight + bias, 0)


def _tiny_program(path):
    """_tiny's model as a torch.export program, its weights read from the ONNX file."""
    import torch
    from onnx import numpy_helper

    weights = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in onnx.load(path).graph.initializer}

    class Tiny(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x @ weights["w"] + weights["b"])

    return torch.export.export(Tiny(), (torch.zeros(1, 8),))


# aoti runs this same sequence in tests/test_aoti.py on its digits-cnn package: Inductor's C++ compile takes
# ~20 s on 2 cores, and a second one here for the tiny function would double the suite's cost of it
HOOKS_TESTED_ELSEWHERE = {"aoti": "tests/test_aoti.py::test_digits_cnn_compiles_with_aotinductor_runs_and_checks"}


@pytest.mark.parametrize("name", [n for n in NAMES if n not in HOOKS_TESTED_ELSEWHERE])
def test_every_available_target_runs_the_hook_sequence(name, tmp_path):
    cls = targets.target_class(name)
    probe = cls.probe()
    if not probe.available:
        pytest.skip(f"{name} is not available here: {probe.reason}")
    target = targets.create(name, _profile_for(name).options)
    try:
        target.preflight()
    except Exception as exc:  # e.g. an OpenVINO profile for a device this host lacks
        pytest.skip(f"{name}: {exc}")
    expected = _tiny(tmp_path / "tiny.onnx")
    inputs = [InputSpec(name="x", shape=[1, 8])]
    lim = target.limits()
    assert lim.max_opset >= 17 and lim.max_ir_version >= 8
    assert not [i for i in target.lint(tmp_path / "tiny.onnx", inputs, {}) if i.severity == "error"]
    if target.capabilities.compiles_from == "torch.export":  # the same function, as the program it compiles from
        artifact = target.compile_program(
            _tiny_program(tmp_path / "tiny.onnx"), tmp_path / "artifact", inputs, {}, ["y"]
        )
    else:
        prepared = target.prepare(tmp_path / "tiny.onnx", inputs, {})
        artifact = target.compile(prepared, tmp_path / "artifact", inputs, {})
    assert isinstance(artifact, Artifact) and artifact.path.is_file()
    session = target.session(artifact)
    assert isinstance(session, Session) and session.input_names == ["x"] and session.output_names == ["y"]
    x = np.linspace(-1, 1, 8, dtype=np.float32)[None]
    tolerance = 2e-2 if target.emulated() else 1e-5  # the HTP computes float in FP16
    assert np.allclose(session.run({"x": x})["y"], expected(x), atol=tolerance)
    call = session.bind({"x": x})
    call()
    session.synchronize()
    copies = session.bind_with_copies({"x": x})
    assert (copies is None) == (not target.capabilities.device_memory)
    if target.capabilities.op_profiler:
        profile = target.op_profile(artifact, {"x": x}, iterations=5)
        assert isinstance(profile, OpProfile) and profile.runs == 5 and profile.ops
    with pytest.raises(Exception) as bad:
        session.run({"x": np.zeros((1, 3), dtype=np.float32)})
    assert "rejected its inputs" in str(bad.value)  # the runtime's complaint becomes the user's one line


def test_ort_binding_keeps_device_buffers_and_copies_in_place(tmp_path):
    """The IOBinding path ORT's CUDA target times, exercised on the CPU EP (same ORT API, device "cpu"):
    fixed output buffers learned from one run, inputs updated in place, results equal to a plain run."""
    import onnxruntime as ort

    from tapeout.targets.ort_ep import OrtSession

    _tiny(tmp_path / "tiny.onnx")
    plain = ort.InferenceSession(str(tmp_path / "tiny.onnx"), providers=["CPUExecutionProvider"])
    bound = OrtSession(
        ort.InferenceSession(str(tmp_path / "tiny.onnx"), providers=["CPUExecutionProvider"]), device=("cpu", 0)
    )
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.standard_normal((1, 8)).astype(np.float32)
        assert np.array_equal(bound.run({"x": x})["y"], plain.run(None, {"x": x})[0])
    address = bound._binding.get_outputs()[0].data_ptr()
    x = rng.standard_normal((1, 8)).astype(np.float32)
    copies = bound.bind_with_copies({"x": x})
    assert np.array_equal(copies()["y"], plain.run(None, {"x": x})[0])
    other = rng.standard_normal((1, 8)).astype(np.float32)
    bound.run({"x": other})  # the golden loop runs other samples between binding and timing
    bound.bind({"x": x})()
    bound.synchronize()
    assert bound._binding.get_outputs()[0].data_ptr() == address  # same buffer: what a CUDA graph replays into
    assert np.array_equal(bound._binding.copy_outputs_to_cpu()[0], plain.run(None, {"x": x})[0])  # bind(x) runs x
    replaying = OrtSession(
        ort.InferenceSession(str(tmp_path / "tiny.onnx"), providers=["CPUExecutionProvider"]),
        device=("cpu", 0),
        fixed_shapes=True,
    )
    replaying.run({"x": x})
    with pytest.raises(BadInput, match="a captured CUDA graph replays one shape only"):
        replaying.run({"x": np.zeros((2, 8), np.float32)})


def test_cuda_target_without_the_gpu_wheel_exits_4_naming_what_to_install(tmp_path):
    probe = targets.target_class("ort-cuda").probe()
    if probe.available:
        pytest.skip("this host has a usable CUDA EP: tests/gpu/ covers it")
    for command in (
        ["build", SAMPLES / "digits-cnn", "--profile", "cuda-fp16", "--out", tmp_path / "b"],
        ["lint", SAMPLES / "digits-cnn", "--profile", "cuda-fp32"],
    ):
        result = run_cli(*command)
        assert result.code == 4, result.err
        line = one_line_error(result)
        assert "ort-cuda" in line and "onnxruntime-gpu" in line and "pip uninstall -y onnxruntime" in line
    assert not (tmp_path / "b").exists()


def test_ort_native_complaints_become_one_readable_reason():
    """What onnxruntime-gpu 1.31.1 printed here, on a host without CUDA 13 (recorded): the reason keeps the
    missing library and the required versions, and drops colour codes, timestamps and source paths."""
    from tapeout.targets.ort_ep import ort_complaint

    said = [
        "\x1b[1;31m2026-11-23 05:38:51.162955390 [E:onnxruntime:Default, provider_bridge_ort.cc:2458 operator()] "
        "/onnxruntime_src/onnxruntime/core/session/provider_bridge_ort.cc:2043 onnxruntime::Provider& "
        "onnxruntime::ProviderLibrary::Get() [ONNXRuntimeError] : 1 : FAIL : Failed to load library "
        "/tmp/v/lib/python3.11/site-packages/onnxruntime/capi/libonnxruntime_providers_cuda.so with error: "
        "libcublasLt.so.13: cannot open shared object file: No such file or directory",
        "\x1b[m",
        "\x1b[0;93m2026-11-23 05:38:51.162989538 [W:onnxruntime:Default, onnxruntime_pybind_state.cc:1295 "
        "CreateExecutionProviderFactoryInstance] Failed to create CUDAExecutionProvider. Require cuDNN 9.* and CUDA "
        "13.*. Please install all dependencies\x1b[m",
        "LIBNATIVE: a banner that is not ORT's",
    ]
    assert ort_complaint(said) == (
        "Failed to load library libonnxruntime_providers_cuda.so with error: libcublasLt.so.13: cannot open shared "
        "object file: No such file or directory | Failed to create CUDAExecutionProvider. Require cuDNN 9.* and CUDA "
        "13.*. Please install all dependencies"
    )


def test_the_cuda_artifact_takes_its_external_data_and_nothing_outside_the_model_folder(tmp_path):
    """ort-cuda's artifact is the model file: models over 2 GB keep their weights in external-data files,
    which must come along, and a location that leaves the model's folder must not be followed."""
    from onnx.external_data_helper import convert_model_to_external_data

    from tapeout.core.paths import copy_onnx as copy_model

    _tiny(tmp_path / "tiny.onnx")
    model = onnx.load(tmp_path / "tiny.onnx")
    for tensor in model.graph.initializer:  # only raw data goes external
        tensor.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor), tensor.name))
    src = tmp_path / "src"
    src.mkdir()
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    onnx.save(model, src / "model.onnx")
    (tmp_path / "out").mkdir()
    copy_model(src / "model.onnx", tmp_path / "out" / "model.onnx")
    assert (tmp_path / "out" / "weights.bin").read_bytes() == (src / "weights.bin").read_bytes()
    onnx.load(tmp_path / "out" / "model.onnx")  # loads with its weights, from its new folder

    secret = tmp_path / "secret.bin"
    secret.write_bytes((src / "weights.bin").read_bytes())
    (src / "weights.bin").unlink()
    (src / "weights.bin").symlink_to(secret)
    with pytest.raises(BadInput, match="passes through the symlink"):
        copy_model(src / "model.onnx", tmp_path / "out" / "again.onnx")
