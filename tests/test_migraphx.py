"""The migraphx target on a machine without ROCm.

The host side of a build runs for real (FP16 ONNX by the family rules, pinned input shapes in
engine-settings.json). MIGraphX itself cannot be installed here (ROCm; PyPI's `migraphx` is a name
placeholder), so the device side is checked on tapeout's side of the contract only, against a stand-in
module with the calls MIGraphX's Python API documents (parse_onnx with map_input_dims, compile on
get_target("gpu") with offload_copy, save_buffer/load_buffer, argument, run; research rocm-npu.md §1.1).
The stand-in refuses any other name and keyword. Its "program" runs the ONNX on ONNX Runtime's CPU EP,
which proves nothing about MIGraphX and everything about tapeout's plumbing around it: the cache and its
key, output names and shapes, and the parity of what comes back.
"""

from __future__ import annotations

import json
import shutil
import sys
import types

import numpy as np
import pytest

from conftest import SAMPLES, one_line_error, run_cli
from tapeout import targets
from tapeout.core.artifact import Artifact
from tapeout.core.errors import BadInput
from tapeout.records.golden import load_golden

pytestmark = pytest.mark.skipif(
    targets.target_class("migraphx").probe().available, reason="MIGraphX is installed here: a GPU test should cover it"
)

# The documented signatures the stand-in accepts (name -> keyword arguments allowed)
API = {
    "parse_onnx": {
        "default_dim_value",
        "map_input_dims",
        "default_dyn_dim_value",
        "map_dyn_input_dims",
        "skip_unknown_operators",
        "print_program_on_error",
        "max_loop_iterations",
        "limit_max_iterations",
    },
    "get_target": set(),
    "save_buffer": {"format"},
    "load_buffer": {"format"},
    "argument": set(),
    "compile": {"offload_copy", "fast_math", "exhaustive_tune"},
    "run": set(),
    "get_output_shapes": set(),
}


def _standin(calls: list):
    import onnxruntime as ort

    def checked(name, kwargs):
        bad = set(kwargs) - API[name]
        if bad:
            raise TypeError(f"migraphx.{name}() got unexpected keyword(s) {sorted(bad)} (stand-in)")
        calls.append((name, kwargs))

    class Program:
        def __init__(self, model_bytes: bytes, dims: dict):
            self.model_bytes, self.dims, self.compiled = model_bytes, dims, None

        def compile(self, target, **kwargs):
            checked("compile", kwargs)
            assert target == "gpu-target"
            self.compiled = kwargs

        def get_output_shapes(self):
            checked("get_output_shapes", {})
            return [None] * len(ort.InferenceSession(self.model_bytes).get_outputs())

        def run(self, params):
            checked("run", {})
            sess = ort.InferenceSession(self.model_bytes, providers=["CPUExecutionProvider"])
            return sess.run(None, {k: v.array for k, v in params.items()})

    class Argument:
        def __init__(self, array):
            self.array = array

    module = types.ModuleType("migraphx")
    module.__version__ = "2.14.0-standin"

    def parse_onnx(path, **kwargs):
        checked("parse_onnx", kwargs)
        with open(path, "rb") as fh:
            return Program(fh.read(), kwargs.get("map_input_dims"))

    def get_target(name):
        checked("get_target", {})
        return "gpu-target"

    def save_buffer(program, **kwargs):
        checked("save_buffer", kwargs)
        return json.dumps({"dims": program.dims, "compiled": program.compiled}).encode() + b"\0" + program.model_bytes

    def load_buffer(buffer, **kwargs):
        checked("load_buffer", kwargs)
        header, _, model = bytes(buffer).partition(b"\0")
        return Program(model, json.loads(header)["dims"])

    def argument(array):
        checked("argument", {})
        return Argument(array)

    module.parse_onnx, module.get_target, module.save_buffer = parse_onnx, get_target, save_buffer
    module.load_buffer, module.argument = load_buffer, argument
    return module


@pytest.fixture(scope="module")
def fp16_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("mx") / "fp16"
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", "migraphx-fp16", "--out", out)
    assert result.code == 0, result.err + result.out
    return out


def test_host_build_pins_shapes_and_defers_the_program(fp16_build, tmp_path):
    settings = json.loads((fp16_build / "artifact" / "engine-settings.json").read_text())
    assert settings["input_dims"] == {"image": [1, 1, 8, 8]} and settings["output_names"] == ["logits"]
    report = json.loads((fp16_build / "report.json").read_text())
    assert report["quantization"]["plan"]["method"] == "float16"
    assert "compiled on the device" in report["target"]["emulated"]
    copy = tmp_path / "b"
    shutil.copytree(fp16_build, copy)
    result = run_cli("check", copy)
    assert result.code == 4 and "migraphx" in one_line_error(result)


def test_program_compiled_once_cached_and_run(fp16_build, tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "migraphx", _standin(calls))
    build_dir = tmp_path / "b"
    shutil.copytree(fp16_build, build_dir)
    man = json.loads((build_dir / "manifest.json").read_text())
    target = targets.create("migraphx", man["profile"]["options"])
    artifact = Artifact("migraphx", build_dir / "artifact", "model.onnx")
    target.preflight()
    built = target.build_engine(artifact, lambda _: None)
    assert built.action == "built" and (build_dir / built.file).is_file() and built.file.endswith(".mxr")
    assert ("parse_onnx", {"map_input_dims": {"image": [1, 1, 8, 8]}}) in calls
    assert ("compile", {"offload_copy": True, "fast_math": True, "exhaustive_tune": False}) in calls
    assert built.key["toolchain"] == "migraphx 2.14.0-standin" and built.key["compute_capability"].startswith("unknown")
    assert target.build_engine(artifact, lambda _: None).action == "reused"

    session = target.session(artifact)
    inputs, outputs = load_golden(build_dir / "golden.npz")
    got = session.run(inputs[0])
    assert list(got) == ["logits"] and np.allclose(got["logits"], outputs[0]["logits"], atol=0.05)
    with pytest.raises(BadInput, match=r"shape \[2, 1, 8, 8\] is not the compiled \[1, 1, 8, 8\]"):
        session.run({"image": np.zeros((2, 1, 8, 8), np.float32)})
