"""OpenVINO backend on its CPU device: real compile, real inference, both samples build and check."""

import json

import pytest

from conftest import SAMPLES, one_line_error, run_cli

pytest.importorskip("openvino", reason="OpenVINO is in the [openvino] extra")


@pytest.fixture(scope="module")
def ov_profile(tmp_path_factory, fast_profile):
    path = tmp_path_factory.mktemp("ov") / "ov-fast.toml"
    # the fast check settings, on the shipped OpenVINO CPU profile
    path.write_text(fast_profile.read_text().replace('extends = "cpu-fp32"', 'extends = "openvino-cpu"'))
    return path


@pytest.mark.parametrize("sample", ["digits-cnn", pytest.param("minilm", marks=pytest.mark.slow)])
def test_sample_builds_and_checks_on_openvino_cpu(sample, tmp_path, ov_profile):
    out = tmp_path / sample
    build = run_cli("build", SAMPLES / sample, "--profile", ov_profile, "--out", out, "--json")
    assert build.code == 0, build.err
    report = build.json()
    assert report["target"]["name"] == "openvino"
    assert (out / "artifact" / "model.xml").is_file() and (out / "artifact" / "model.bin").is_file()
    assert list((out / "ov_cache").glob("*.blob")), "compile should leave the device's blob cache"
    assert report["artifact"]["meta"]["execution_devices"] == ["CPU"]
    assert report["artifact"]["meta"]["inference_precision"] == "f32"
    assert all(p["within_tolerance"] for p in report["parity"])
    assert report["accuracy"]["artifact"] == pytest.approx(report["accuracy"]["reference"], abs=1e-6)
    providers = {t["provider"] for t in report["measurement"]["op_profile"]["op_types"]}
    assert all(p.startswith("CPU:") for p in providers)  # OpenVINO's kernel names, e.g. CPU:brgconv_avx2_f32

    check = run_cli("check", out, "--json")
    assert check.code == 0, check.err
    assert json.loads((out / "check.json").read_text())["target"]["name"] == "openvino"


def test_pinned_shapes(tmp_path, ov_profile):
    profile = tmp_path / "pinned.toml"
    profile.write_text(f'extends = "{ov_profile}"\n[options]\npin_shapes = true\n')
    build = run_cli("build", SAMPLES / "digits-cnn", "--profile", profile, "--out", tmp_path / "b", "--json")
    assert build.code == 0, build.err
    assert build.json()["artifact"]["meta"]["pinned_shapes"] is True
    import openvino as ov

    model = ov.Core().read_model(str(tmp_path / "b" / "artifact" / "model.xml"))
    assert [d.get_length() for d in model.inputs[0].get_partial_shape()] == [1, 1, 8, 8]


def test_missing_device_exits_4_naming_the_driver(tmp_path, ov_profile):
    profile = tmp_path / "npu.toml"
    profile.write_text(f'extends = "{ov_profile}"\n[options]\ndevice = "NPU"\n')
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", profile, "--out", tmp_path / "b")
    assert result.code == 4
    line = one_line_error(result)
    assert "OpenVINO device NPU is not available here" in line and "NPU driver" in line
    assert not (tmp_path / "b").exists()


def test_unknown_option_is_named(tmp_path):
    profile = tmp_path / "bad.toml"
    profile.write_text('extends = "openvino-cpu"\n[options]\ndevice = "VPU"\n')
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", profile)
    assert result.code == 2
    line = one_line_error(result)
    assert "options.device" in line and "'NPU'" in line


def test_openvinos_reason_is_kept_whole_not_cut_at_its_first_line(tmp_path):
    # OpenVINO leads with two "where in our source" lines; the op and the cause come after them
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Foo", ["x"], ["y"], name="custom", domain="com.example")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    (tmp_path / "tapeout.toml").write_text('[model]\nsource = "m.onnx"\n[[inputs]]\nname = "x"\nshape = [1, 4]\n')
    result = run_cli("build", tmp_path, "--profile", "openvino-cpu", "--out", tmp_path / "b")
    assert result.code == 2
    line = one_line_error(result)
    assert "No conversion rule found for operations: com.example.Foo" in line
    assert "Exception from src/" not in line and "--debug" in line
    debug = run_cli("--debug", "build", tmp_path, "--profile", "openvino-cpu", "--out", tmp_path / "b")
    assert "the runtime's whole message:\nException from src/" in debug.err
