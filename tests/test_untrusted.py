"""Untrusted files are data, never code. Hostile model files carry a payload that creates a marker file
when unpickled; each test first proves, in a separate process with plain torch, that the payload does
run, then that no tapeout command runs it and each says so in one line."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import one_line_error, run_cli


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))  # unpickling calls open(marker, "w"): the file appears


def _plain_pt2(path: Path) -> None:
    code = (
        "import torch\nm = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())\n"
        f"torch.export.save(torch.export.export(m, (torch.randn(2, 4),)), {str(path)!r})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def _rewrite(src: Path, dst: Path, replace) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, replace(info.filename.split("/", 1)[-1], zin.read(info.filename)))


def _hostile(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    marker = tmp_path / f"pwned-{kind}"
    plain, hostile = tmp_path / "plain.pt2", tmp_path / f"{kind}.pt2"
    _plain_pt2(plain)
    payload = pickle.dumps(_Payload(marker))

    def replace(rel: str, data: bytes) -> bytes:
        if kind == "weights" and rel == "data/weights/model_weights_config.json":
            config = json.loads(data)
            config["config"]["0.weight"]["use_pickle"] = True
            return json.dumps(config).encode()
        if kind == "weights" and rel == "data/weights/weight_0":
            return payload
        if kind == "sample-inputs" and rel.startswith("data/sample_inputs/"):
            return payload  # not named by any config: only the guard around torch.export.load stops it
        return data

    _rewrite(plain, hostile, replace)
    return hostile, marker


def _project(tmp_path: Path, source: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "tapeout.toml").write_text(f'[model]\nsource = "{source}"\n\n[[inputs]]\nname = "x"\nshape = [2, 4]\n')
    return project


@pytest.mark.parametrize("kind", ["weights", "sample-inputs"])
def test_a_hostile_pt2_is_refused_and_its_payload_never_runs(tmp_path, kind):
    hostile, marker = _hostile(tmp_path, kind)
    proof = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import torch\ntry:\n    torch.export.load({str(hostile)!r})\nexcept Exception:\n    pass\n",
        ],
        capture_output=True,
        text=True,
    )
    assert marker.exists(), f"the test's payload did not run under plain torch: {proof.stderr[-500:]}"
    marker.unlink()

    project = _project(tmp_path, hostile)
    for command in (
        ["lint", project],
        ["analyze", project],
        ["build", project, "--profile", "cpu-fp32", "--out", tmp_path / "b"],
    ):
        result = run_cli(*command)
        assert result.code == 2, (command, result.err)
        line = one_line_error(result)
        assert "never unpickles" in line and str(hostile.name) in line
        assert not marker.exists(), f"{command[0]} ran the payload"
    assert not (tmp_path / "b").exists()


def test_a_plain_pt2_still_loads(tmp_path):
    from tapeout.core import pt2

    _plain_pt2(tmp_path / "m.pt2")
    assert pt2.pickled_entries(tmp_path / "m.pt2") == []
    assert pt2.load(tmp_path / "m.pt2").module() is not None


def test_a_file_that_is_not_an_archive_is_one_line(tmp_path):
    (tmp_path / "junk.pt2").write_bytes(b"not a zip at all")
    result = run_cli("lint", _project(tmp_path, tmp_path / "junk.pt2"))
    assert result.code == 2 and "is not a .pt2 archive" in one_line_error(result)


def _onnx_with_external_data(folder: Path, location: str) -> Path:
    """y = relu(x @ W + b) with W and b in the external-data file `location`."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnx.external_data_helper import convert_model_to_external_data

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["z"]),
            helper.make_node("Relu", ["z"], ["y"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[
            numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location=location, size_threshold=0)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, folder / "model.onnx")
    return folder / "model.onnx"


def _onnx_project(tmp_path: Path, model: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "tapeout.toml").write_text(f'[model]\nsource = "{model}"\n\n[[inputs]]\nname = "x"\nshape = [1, 8]\n')
    return project


def test_an_onnx_source_brings_every_external_data_file_it_names(tmp_path, fast_profile):
    model = _onnx_with_external_data(tmp_path / "src", "weights.bin")  # not <name>.data: it used to be left out
    result = run_cli("build", _onnx_project(tmp_path, model), "--profile", fast_profile, "--out", tmp_path / "b")
    assert result.code == 0, result.err
    assert (tmp_path / "b" / "export" / "weights.bin").read_bytes() == (tmp_path / "src" / "weights.bin").read_bytes()


def test_external_data_behind_a_symlink_or_outside_the_folder_is_refused(tmp_path, fast_profile):
    secret = tmp_path / "secret.bin"
    model = _onnx_with_external_data(tmp_path / "src", "model.onnx.data")
    secret.write_bytes((tmp_path / "src" / "model.onnx.data").read_bytes())  # same size: it would load and fold
    (tmp_path / "src" / "model.onnx.data").unlink()
    (tmp_path / "src" / "model.onnx.data").symlink_to(secret)
    linked = run_cli("build", _onnx_project(tmp_path, model), "--profile", fast_profile, "--out", tmp_path / "b")
    assert linked.code == 2 and "passes through the symlink" in one_line_error(linked)
    assert not (tmp_path / "b").exists()

    climbing = _onnx_with_external_data(tmp_path / "src2", "weights.bin")
    (tmp_path / "secr.bin").write_bytes((tmp_path / "src2" / "weights.bin").read_bytes())
    # onnx itself will not write '..': edit the serialized location, same length so the protobuf stays valid
    climbing.write_bytes(climbing.read_bytes().replace(b"weights.bin", b"../secr.bin"))
    result = run_cli("build", _onnx_project(tmp_path, climbing), "--profile", fast_profile, "--out", tmp_path / "c")
    assert result.code == 2 and "not a plain relative path" in one_line_error(result)
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    ("field", "value"), [("name", "../../escaped"), ("device", "../../../etc/passwd"), ("name", ".hidden")]
)
def test_profile_names_that_would_be_paths_are_refused(tmp_path, field, value):
    from conftest import SAMPLES

    profile = tmp_path / "p.toml"
    profile.write_text(f'extends = "cpu-fp32"\n{field} = "{value}"\n')
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", profile)
    assert result.code == 2 and f"'{field}'" in one_line_error(result) and "plain name" in result.err
    assert not (tmp_path.parent / "escaped").exists()


def _edited_build(digits_build: Path, tmp_path: Path, edit) -> Path:
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(digits_build, copy)
    man = json.loads((copy / "manifest.json").read_text())
    man = edit(man)
    (copy / "manifest.json").write_text(json.dumps(man))
    return copy


def _files(man, files):
    man["artifact"]["files"] = files
    return man


@pytest.mark.parametrize(
    ("case", "edit", "says"),
    [
        ("no files", lambda m: _files(m, {}), "artifact.files"),
        (
            "main file not hashed",
            lambda m: {**m, "artifact": {**m["artifact"], "main_file": "other.onnx"}},
            "is not among the hashed files",
        ),
        (
            "a file outside",
            lambda m: _files(m, {**m["artifact"]["files"], "../report.json": "0" * 64}),
            "not a plain relative path",
        ),
        (
            "absolute golden",
            lambda m: {**m, "golden": {**m["golden"], "file": "/etc/hostname"}},
            "not a plain relative path",
        ),
        ("not an object", lambda m: [], "schema"),
        ("missing golden", lambda m: {k: v for k, v in m.items() if k != "golden"}, "missing required field 'golden'"),
    ],
)
def test_a_manifest_from_elsewhere_is_data_its_paths_stay_in_the_build_dir(digits_build, tmp_path, case, edit, says):
    result = run_cli("check", _edited_build(digits_build, tmp_path, edit))
    assert result.code == 2, (case, result.err)
    assert says in one_line_error(result), case


def _forged(digits_build: Path, tmp_path: Path, name: str) -> Path:
    """A copy of the build whose `name` (report.json or check.json) says p50 1e-6 ms: valid JSON, a valid
    report, a false figure — what `compare` would otherwise recommend."""
    import shutil

    copy = tmp_path / "forged"
    shutil.copytree(digits_build, copy)
    if name == "check.json" and not (copy / "check.json").exists():
        checked = run_cli("check", copy, "--iterations", "30", "--repeats", "1")
        assert checked.code == 0, checked.err
    report = json.loads((copy / name).read_text())
    report["measurement"]["latency_ms"]["quantiles"]["p50"].update(point=1e-6, lower=1e-6, upper=1e-6)
    (copy / name).write_text(json.dumps(report))
    return copy


@pytest.mark.parametrize("command", ["compare", "diff", "report", "estimate", "calibrate"])
def test_a_report_edited_after_the_build_is_refused_by_every_reader(digits_build, tmp_path, command):
    forged = _forged(digits_build, tmp_path, "report.json")
    args = {
        "compare": ["compare", digits_build, forged],
        "diff": ["diff", digits_build, forged],
        "report": ["report", forged],
        "estimate": ["estimate", forged],
        "calibrate": ["calibrate", forged, "--out", tmp_path / "cal"],
    }[command]
    result = run_cli(*args)
    line = one_line_error(result)
    assert result.code == 2 and "report.json" in line and "sha256 mismatch" in line, (command, line)
    assert "1e-06" not in result.out and not (tmp_path / "cal").exists()


@pytest.mark.parametrize("command", ["compare", "diff"])
def test_a_check_edited_after_the_check_is_refused(digits_build, tmp_path, command):
    forged = _forged(digits_build, tmp_path, "check.json")
    result = run_cli(*(["compare", forged] if command == "compare" else ["diff", forged]))
    line = one_line_error(result)
    assert result.code == 2 and "check.json" in line and "sha256 mismatch" in line, line
    (forged / "check-manifest.json").unlink()  # no record at all: refused as well, naming what to do
    result = run_cli("compare", forged)
    assert result.code == 2 and "check-manifest.json" in one_line_error(result) and "tapeout check" in result.err


@pytest.mark.parametrize("command", ["check", "estimate", "report", "calibrate", "compare", "diff", "build-out"])
def test_a_build_dir_that_is_a_symlink_loop_is_one_line(tmp_path, command):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    if command == "build-out":
        args = ["build", tmp_path / "p", "--profile", "cpu-fp32", "--out", tmp_path / "a"]
        (tmp_path / "p").mkdir()
        (tmp_path / "p" / "tapeout.toml").write_text(
            '[model]\nsource = "m.onnx"\n[[inputs]]\nname = "x"\nshape = [1]\n'
        )
        (tmp_path / "p" / "m.onnx").write_bytes(b"")
    else:
        args = [command, tmp_path / "a"]
    result = run_cli(*args)
    assert result.code == 2, result.err
    one_line_error(result)
