"""The device-side install is `pip install .` with the declared dependencies and nothing else. A
dependency imported but not declared (click, once) gives a `tapeout` that cannot start; this test
builds that environment offline and runs `tapeout check` in it.

The environment: tapeout installed from this tree with `pip install --target` (no dependencies), plus
the files of exactly the distributions its `dependencies` name, transitively, linked from this
interpreter's site-packages; run with `python -S` (no site-packages), so nothing else is importable.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from conftest import REPO


def declared_closure(root: md.Distribution, extras: tuple[str, ...] = ()) -> dict[str, md.Distribution]:
    """Every distribution `root` needs (with its `extras`; the others' without), by the requirements each one
    declares; the dependencies are looked up in this interpreter's environment."""
    found: dict[str, md.Distribution] = {}
    todo = [root]
    while todo:
        dist = todo.pop()
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in found:
            continue
        found[key] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            wanted = ("", *extras) if dist is root else ("",)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in wanted):
                todo.append(md.distribution(req.name))
    return found


def isolated_site(tmp_path: Path, extras: tuple[str, ...] = ()) -> tuple[Path, dict[str, md.Distribution]]:
    """tapeout from this tree and the files of exactly its declared closure, in one folder for `python -S`."""
    site = tmp_path / "site"
    pip = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            str(REPO),
        ],
        capture_output=True,
        text=True,
    )
    assert pip.returncode == 0, pip.stderr[-2000:]
    # the requirements as this tree declares them now (the wheel just built), not as last installed
    built = next(md.distributions(path=[str(site)]))
    closure = declared_closure(built, extras)
    files = {
        name: [f for f in dist.files or [] if f.parts[0] != ".." and f.suffix != ".pyc"]  # scripts, bytecode
        for name, dist in closure.items()
        if name != "tapeout"
    }  # tapeout: installed from the tree above
    # a top-level folder only one distribution has files in is linked whole (torch's are thousands of files)
    owners: dict[str, set[str]] = {}
    for name, owned in files.items():
        for file in owned:
            owners.setdefault(file.parts[0], set()).add(name)
    for name, owned in files.items():
        dist = closure[name]
        for file in owned:
            top = file.parts[0]
            whole = len(file.parts) > 1 and owners[top] == {name}
            target = site / (top if whole else file)
            if target.exists() or target.is_symlink():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            source = Path(dist.locate_file(top if whole else file)).resolve()
            target.symlink_to(source, target_is_directory=source.is_dir())
    return site, closure


def test_check_runs_with_the_declared_dependencies_only(digits_build, tmp_path):
    site, closure = isolated_site(tmp_path)
    assert {"typer", "onnxruntime", "numpy", "pydantic"} <= closure.keys()
    assert "torch" not in closure  # the device side never needs it
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(site), "HOME": str(tmp_path), "COLUMNS": "200"}
    isolated = [sys.executable, "-S"]
    probe = subprocess.run(
        [*isolated, "-c", "import tapeout.cli, sys; import torch"], env=env, capture_output=True, text=True
    )
    assert "No module named 'torch'" in probe.stderr, "the environment is not isolated"
    result = subprocess.run(
        [*isolated, "-m", "tapeout", "check", str(digits_build), "--iterations", "20", "--repeats", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "check dir:" in result.stdout


@pytest.mark.slow
def test_an_executorch_build_checks_with_the_executorch_extra_only(executorch_digits_build, tmp_path):
    """The README's device side for an ExecuTorch build: tapeout's dependencies and its `executorch` extra (which
    brings torch for ExecuTorch's Python runtime), nothing else: no exporter, no transformers, no OpenVINO."""
    result, build = executorch_digits_build
    assert result.code == 0, result.err
    site, closure = isolated_site(tmp_path, ("executorch",))
    assert {"executorch", "torch"} <= closure.keys() and not {"transformers", "onnxscript", "openvino"} & closure.keys()
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(site), "HOME": str(tmp_path), "COLUMNS": "200"}
    isolated = [sys.executable, "-S"]
    probe = subprocess.run([*isolated, "-c", "import transformers"], env=env, capture_output=True, text=True)
    assert "No module named 'transformers'" in probe.stderr, "the environment is not isolated: " + probe.stderr[-500:]
    checked = subprocess.run(
        [*isolated, "-m", "tapeout", "check", str(build), "--iterations", "20", "--repeats", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert "check dir:" in checked.stdout
    assert json.loads((build / "check.json").read_text())["parity"][0]["within_tolerance"]  # the .pte, re-run there
