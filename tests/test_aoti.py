"""The `aoti` target for real: digits-cnn quantized (PT2E, Inductor's x86 quantizer) and compiled by AOTInductor into
a .pt2 package of integer and float kernels (the system g++ builds Inductor's C++), loaded by torch in fresh
processes, golden parity, `check` replaying it; an INT8 program Inductor would run in float refused; a package for a
vector ISA this CPU lacks refused before it is loaded (exit 4), and no C++ compiler one line at build."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from conftest import SAMPLES, run_cli, static_libstdcxx_compiler
from tapeout import targets
from tapeout.core.artifact import Artifact
from tapeout.core.errors import BadInput, TargetUnavailable
from tapeout.targets import cxx_compiler

PROBE = targets.target_class("aoti").probe()
pytestmark = pytest.mark.skipif(not PROBE.available, reason=f"aoti is not usable here: {PROBE.reason}")

PROFILE = """
extends = "aoti-cpu-int8"
[check]
iterations = 60
repeats = 1
warmup_min_s = 0.1
"""


@pytest.mark.slow
def test_digits_cnn_int8_compiles_to_integer_kernels_runs_and_checks(tmp_path):
    """The suite's one AOTInductor build is INT8 (its first conv and head stay float, so the float path compiles in
    the same package): PT2E with Inductor's x86 quantizer at the CNN rule's groups, compiled with freezing into
    oneDNN's integer convolution and Linear kernels, loaded by torch in fresh processes, parity, `check`. $CXX is a
    compiler that links libstdc++ statically (its packages fail to load: std::bad_cast here, SIGSEGV on the H200):
    g++ builds the package instead and the record says why."""
    profile = tmp_path / "aoti.toml"
    profile.write_text(PROFILE)
    out = tmp_path / "b"
    cxx = static_libstdcxx_compiler(tmp_path / "bin")
    result = run_cli(
        "build", SAMPLES / "digits-cnn", "--profile", profile, "--out", out, "--json", env={"CXX": str(cxx)}
    )
    assert result.code == 0, result.err
    report = result.json()
    meta = report["artifact"]["meta"]
    assert report["artifact"]["main_file"] == "model.pt2" and meta["dynamic_dims"] == ["batch"]
    assert meta["vec_isa"] == json.loads((out / "artifact" / "vec_isa.json").read_text())["vec_isa"]
    assert f"used instead of {cxx}, which links libstdc++ statically" in meta["compiler"]
    with zipfile.ZipFile(out / "artifact" / "model.pt2") as package:  # the package's own native code: shared libstdc++
        wrapper = next(n for n in package.namelist() if n.endswith(".so"))
        (tmp_path / "wrapper.so").write_bytes(package.read(wrapper))
    assert "libstdc++.so.6" in cxx_compiler.needed_libraries(tmp_path / "wrapper.so")
    quantization = report["quantization"]
    plan = {g["group"]: (g["precision"], tuple(g["modules"])) for g in quantization["plan"]["groups"]}
    assert (
        quantization["plan"]["method"] == "pt2e-x86-inductor" and quantization["evaluated_on"] == "aoti, on this host"
    )
    assert plan["conv1"] == ("int8", ("features.2", "features.3")) and plan["linear1"][0] == "int8"
    assert plan["first_conv"][0] == "fp32" and plan["head"][0] == "fp32"
    assert quantization["plan"]["activation_type"] == "uint8"
    # what Inductor lowered: one integer conv (conv1) and one integer Linear (linear1), nothing else
    assert meta["freezing"] is True and meta["integer_kernels"] == {"qconv": 1, "qlinear": 1}
    assert not (out / "quantized" / ".compiled").exists() and not (out / "quantized" / ".kept").exists()
    verdicts = {b["budget"]: b["verdict"] for b in report["budgets"]}
    assert verdicts == {"parity_min_cosine": "pass", "accuracy_max_drop": "pass"}
    check = run_cli("check", out, "--json")
    assert check.code == 0, check.err
    # the op profile: Inductor's kernels and the integer oneDNN calls, each named, timed and in its kernel class, from
    # the instrumented package beside the shipped one (hashed with it, not in its size); the shipped one has no records
    files = report["artifact"]["files"]
    assert set(files) == {"model.pt2", "io.json", "vec_isa.json", "profiling/model.pt2"}
    assert report["artifact"]["bytes"] == sum(
        (out / "artifact" / f).stat().st_size for f in files if not f.startswith("profiling/")
    )
    assert "RecordFunction" not in _wrapper(out / "artifact" / "model.pt2")
    assert "RecordFunction" in _wrapper(out / "artifact" / "profiling" / "model.pt2")
    for measured in (report, check.json()):
        profile = measured["measurement"]["op_profile"]
        assert profile["runs"] > 0 and profile["method"].startswith("torch profiler")
        types = {op["op_type"]: op for op in profile["ops"]}
        assert {"aoti_torch_cpu__qconv_pointwise_tensor", "aoti_torch_cpu__qlinear_pointwise_tensor"} <= set(types)
        assert types["aoti_torch_cpu__qconv_pointwise_tensor"]["precision"] == "int8"
        assert all(op["total_us"] > 0 and op["calls"] == profile["runs"] for op in profile["ops"])
        # per-row medians are not additive: under load their sum can pass the median run (profiler_scale mends it)
        assert profile["mean_kernel_us"] > 0 and profile["mean_run_us"] > 0
    classes = {row["op_type"]: row["class"] for row in report["bottlenecks"]["ops"]}
    assert classes["aoti_torch_cpu__qconv_pointwise_tensor"] == "conv"
    assert classes["aoti_torch_cpu__qlinear_pointwise_tensor"] == "matmul"
    # the contract's hook sequence on this package (tests/test_targets.py leaves aoti to this test)
    target = targets.create("aoti", {"threads": 1})
    session = target.session(Artifact("aoti", out / "artifact", "model.pt2"))
    assert session.input_names == ["image"] and session.output_names == report["export"]["output_names"]
    with np.load(out / "golden.npz") as golden:
        images, expected = golden["input.image"][:4], golden[f"output.{session.output_names[0]}"][:4]
    got = np.stack([session.run({"image": image})[session.output_names[0]] for image in images])
    assert (got.argmax(-1) == expected.argmax(-1)).all() and not np.array_equal(got, expected)  # integer, not float
    np.testing.assert_allclose(got, expected, atol=0.5)
    feeds = {"image": images[0]}
    session.bind(feeds)()
    session.synchronize()
    assert session.bind_with_copies(feeds) is None
    with pytest.raises(BadInput, match="rejected its inputs"):
        session.run({"image": np.zeros((1, 3), np.float32)})
    # a fresh process loads it (as aoti-cuda loads its packages) without Inductor's ISA probe: a compile and a child
    # Python per ISA, ~50 s of each fresh process on torch 2.11; and the loaded model answers as torch's loader's does
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_COUNTING_CHILDREN, str(out / "artifact" / "model.pt2")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == ["children", "0", "classes", str(expected.shape[-1])]


LOAD_COUNTING_CHILDREN = """
import subprocess, sys
from pathlib import Path
started = []
popen = subprocess.Popen.__init__
def counted(self, args, *rest, **kwargs):
    started.append(args)
    popen(self, args, *rest, **kwargs)
subprocess.Popen.__init__ = counted
import torch
from tapeout.targets.aoti import load_package
model = load_package(torch, Path(sys.argv[1]))
print("children", len(started), "classes", model(torch.zeros(1, 1, 8, 8))[0].shape[-1])
"""


def _wrapper(package) -> str:
    import zipfile

    with zipfile.ZipFile(package) as archive:
        return "".join(
            archive.read(n).decode("utf-8", "replace") for n in archive.namelist() if n.endswith("wrapper.cpp")
        )


def test_kernel_records_become_one_row_per_call_site_at_their_median():
    """A kernel Inductor reuses (one LayerNorm kernel for every layer) is a row per call in a run, each its median call
    times the runs, so a stalled call does not stand for every run; the graph prefix and the kernel's index go."""
    from tapeout.targets.aoti import kernel_profile

    spans = []
    for run, stall in ((1, 1.0), (2, 50.0), (3, 1.0)):
        spans += [
            ("aoti_torch_cpu__linear_pointwise", run, 10.0 * stall),
            ("graph_0_cpp_fused_native_layer_norm_0", run, 2.0),
            ("aoti_torch_cpu__linear_pointwise", run, 20.0),
            ("graph_0_cpp_fused_native_layer_norm_0", run, 3.0),
        ]
    profile = kernel_profile(spans, [40.0, 500.0, 41.0], "m")
    rows = {op.node: (op.op_type, op.provider, op.calls, op.total_us) for op in profile.ops}
    assert rows == {
        "aoti_torch_cpu__linear_pointwise #1": ("aoti_torch_cpu__linear_pointwise", "oneDNN/ATen", 3, 30.0),
        "cpp_fused_native_layer_norm_0 #1": ("cpp_fused_native_layer_norm", "Inductor C++", 3, 6.0),
        "aoti_torch_cpu__linear_pointwise #2": ("aoti_torch_cpu__linear_pointwise", "oneDNN/ATen", 3, 60.0),
        "cpp_fused_native_layer_norm_0 #2": ("cpp_fused_native_layer_norm", "Inductor C++", 3, 9.0),
    }
    assert profile.ops[0].node == "aoti_torch_cpu__linear_pointwise #1"  # execution order
    assert profile.runs == 3 and profile.run_total_us == 123.0


def test_without_the_profiling_package_there_is_no_op_profiler_and_no_second_compile(tmp_path, monkeypatch):
    import torch

    target = targets.create("aoti", {"op_profile_package": False})
    assert target.capabilities.op_profiler is None and targets.create("aoti", {}).capabilities.op_profiler
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", lambda *a, **k: pytest.fail("compiled"))
    artifact = Artifact("aoti", tmp_path, "model.pt2")
    assert target.instrument(None, artifact) is artifact and not (tmp_path / "profiling").exists()
    (tmp_path / "io.json").write_text(
        json.dumps({"inputs": ["x"], "outputs": ["y"], "shapes": [[2]], "dtypes": ["float32"]})
    )
    with pytest.raises(BadInput) as refused:  # a build dir without it, profiled anyway: one line
        targets.create("aoti", {}).op_profile(artifact, {"x": np.zeros(2, np.float32)}, 3)
    assert "no op-profiling package" in str(refused.value) and "op_profile_package = true" in refused.value.fix


def test_a_package_for_an_isa_this_cpu_lacks_is_refused_before_loading(tmp_path):
    """Loading it would run AVX-512 (or SVE) code on a CPU without it: an illegal instruction, not an error."""
    (tmp_path / "io.json").write_text(
        json.dumps({"inputs": ["x"], "outputs": ["y"], "shapes": [[None, 2]], "dtypes": ["float32"]})
    )
    (tmp_path / "vec_isa.json").write_text(json.dumps({"vec_isa": "sve256"}))
    (tmp_path / "model.pt2").write_bytes(b"not loaded: refused before")
    target = targets.create("aoti", {})
    with pytest.raises(TargetUnavailable) as refused:
        target.session(Artifact("aoti", tmp_path, "model.pt2"))
    assert "compiled for sve256, which this CPU lacks" in str(refused.value)


def test_an_int8_program_without_freezing_is_refused_before_inductor_runs(tmp_path, monkeypatch):
    import torch

    program = torch.export.export(torch.nn.Linear(2, 2), (torch.zeros(1, 2),))
    monkeypatch.setattr("tapeout.targets.aoti._quantized_ops", lambda _program: 4)
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", lambda *a, **k: pytest.fail("compiled"))
    with pytest.raises(BadInput) as refused:
        targets.create("aoti", {"freezing": False}).compile_program(program, tmp_path / "a", [], {}, ["y"])
    assert "needs Inductor's freezing" in str(refused.value) and "freezing = false" in refused.value.fix


def test_without_a_cpp_compiler_the_build_is_one_line(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("CXX", "")
    monkeypatch.setattr("shutil.which", lambda name: None)
    program = torch.export.export(torch.nn.Linear(2, 2), (torch.zeros(1, 2),))
    with pytest.raises(BadInput) as refused:
        targets.create("aoti", {}).compile_program(program, tmp_path / "a", [], {}, ["y"])
    assert "needs a C++ compiler" in str(refused.value) and "apt install g++" in refused.value.fix


@pytest.mark.parametrize(
    "text",
    ['{"inputs": ["x"]}', "not json", '{"inputs": ["x"], "outputs": ["y"], "shapes": [["1"]], "dtypes": ["float32"]}'],
)
def test_a_malformed_io_file_is_one_line(tmp_path, text):
    from tapeout.targets.program_io import read_io

    (tmp_path / "io.json").write_text(text)
    with pytest.raises(BadInput) as refused:
        read_io(tmp_path)
    assert "io.json" in str(refused.value) and "\n" not in str(refused.value)


def test_the_checked_call_names_an_input_the_program_does_not_take(tmp_path):
    """An AOTInductor package reads whatever it is handed: the session's checked call compares first."""
    import numpy as np

    from tapeout.core.schemas import InputSpec
    from tapeout.targets.program_io import read_io, write_io

    write_io(tmp_path, [InputSpec(name="x", shape=["batch", 8])], ["y"], None)
    io = read_io(tmp_path)
    io.check({"x": np.zeros((3, 8), np.float32)})  # any batch: the dim is dynamic
    for bad, said in (
        (np.zeros((1, 3), np.float32), "the program takes float32 [any, 8]"),
        (np.zeros((1, 8), np.float64), "is float64"),
        (np.zeros(8, np.float32), "[8]"),
    ):
        with pytest.raises(ValueError, match="input 'x'") as refused:
            io.check({"x": bad})
        assert said in str(refused.value)
