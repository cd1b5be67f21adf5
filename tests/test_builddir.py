"""Atomic writes: a build that dies leaves nothing that looks complete."""

import json

import pytest

from tapeout.builds.staging import MANIFEST, StagedBuild, is_build_dir
from tapeout.core.errors import BadInput
from tapeout.core.files import write_bytes, write_json


def _complete(stage):
    (stage / "artifact").mkdir()
    (stage / "artifact" / "model.onnx").write_bytes(b"new")
    write_json(stage / MANIFEST, {"ok": True})


def test_failed_build_leaves_no_dir_and_no_staging(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(ValueError), StagedBuild(final) as stage:
        (stage / "artifact").mkdir()
        (stage / "artifact" / "model.onnx").write_bytes(b"half")
        raise ValueError("the build died here")
    assert not final.exists()
    assert list(tmp_path.iterdir()) == []


def test_failed_rebuild_keeps_the_previous_build_intact(tmp_path):
    final = tmp_path / "out"
    with StagedBuild(final) as stage:
        _complete(stage)
    with pytest.raises(KeyboardInterrupt), StagedBuild(final) as stage:
        (stage / "artifact").mkdir()
        raise KeyboardInterrupt
    assert (final / "artifact" / "model.onnx").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_successful_rebuild_replaces_the_old_one(tmp_path):
    final = tmp_path / "out"
    with StagedBuild(final) as stage:
        _complete(stage)
        (stage / "stale.txt").write_text("from the first build")
    with StagedBuild(final) as stage:
        _complete(stage)
    assert not (final / "stale.txt").exists()
    assert is_build_dir(final)


def test_commit_without_manifest_is_refused(tmp_path):
    with pytest.raises(RuntimeError), StagedBuild(tmp_path / "out") as stage:
        (stage / "artifact").mkdir()
    assert not (tmp_path / "out").exists()


def test_refuses_to_overwrite_a_directory_that_is_not_a_build(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(BadInput, match="not a tapeout build dir"):
        StagedBuild(tmp_path / "mine")


def test_write_json_is_all_or_nothing(tmp_path):
    path = tmp_path / "report.json"
    write_json(path, {"version": 1})
    with pytest.raises(TypeError):  # the write dies half-way: nothing replaces the old file
        write_bytes(path, None)
    assert json.loads(path.read_text()) == {"version": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
