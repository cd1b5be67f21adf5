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
    code = ("import torch\nm = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())\n"
            f"torch.export.save(torch.export.export(m, (torch.randn(2, 4),)), {str(path)!r})\n")
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
    proof = subprocess.run([sys.executable, "-c", f"import torch\ntry:\n    torch.export.load({str(hostile)!r})\n"
                            "except Exception:\n    pass\n"], capture_output=True, text=True)
    assert marker.exists(), f"the test's payload did not run under plain torch: {proof.stderr[-500:]}"
    marker.unlink()

    project = _project(tmp_path, hostile)
    for command in (["lint", project], ["analyze", project], ["build", project, "--profile", "cpu-fp32", "--out", tmp_path / "b"]):
        result = run_cli(*command)
        assert result.code == 2, (command, result.err)
        line = one_line_error(result)
        assert "never unpickles" in line and str(hostile.name) in line
        assert not marker.exists(), f"{command[0]} ran the payload"
    assert not (tmp_path / "b").exists()


def test_a_plain_pt2_still_loads(tmp_path):
    from tapeout.exporters import pt2

    _plain_pt2(tmp_path / "m.pt2")
    assert pt2.pickled_entries(tmp_path / "m.pt2") == []
    assert pt2.load(tmp_path / "m.pt2").module() is not None


def test_a_file_that_is_not_an_archive_is_one_line(tmp_path):
    (tmp_path / "junk.pt2").write_bytes(b"not a zip at all")
    result = run_cli("lint", _project(tmp_path, tmp_path / "junk.pt2"))
    assert result.code == 2 and "is not a .pt2 archive" in one_line_error(result)
