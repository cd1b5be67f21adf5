"""The package's layers (importlinter.ini, docs/architecture.md), checked by import-linter on the package as it
installs: a backward import (the core reaching up to the steps, a step to the CLI, one card folder into
another) fails here."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LINTER = Path(sys.executable).with_name("lint-imports")


@pytest.mark.skipif(
    not LINTER.exists() and shutil.which("lint-imports") is None, reason="import-linter is in the [test] extra"
)
def test_every_layer_contract_is_kept():
    run = subprocess.run(
        [sys.executable, str(REPO / ".ci" / "lint-imports")], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout, run.stdout[-2000:]


def test_a_backward_import_breaks_a_contract(tmp_path):
    """The check itself can fail: the same contracts over a copy of the package in which the core imports the
    steps are broken."""
    if not LINTER.exists() and shutil.which("lint-imports") is None:
        pytest.skip("import-linter is in the [test] extra")
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "lint_imports_script",
        REPO / ".ci" / "lint-imports",
        loader=importlib.machinery.SourceFileLoader("lint_imports_script", str(REPO / ".ci" / "lint-imports")),
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    root = script.lay_out(tmp_path / "tree")
    errors = root / "tapeout" / "core" / "errors.py"
    text = errors.read_text()
    errors.unlink()  # a link to the repository's file: write a copy, never through the link
    errors.write_text(text + "\n\ndef _backward():\n    from tapeout.steps import setup  # noqa: F401\n")
    run = subprocess.run(
        [str(LINTER if LINTER.exists() else "lint-imports"), str(REPO / "importlinter.ini")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(root), "PATH": str(Path(sys.executable).parent)},
    )
    assert run.returncode != 0
    assert "tapeout.core is not allowed to import tapeout.steps" in run.stdout, run.stdout[-3000:]


def test_every_subpackage_is_installed():
    """pyproject lists the packages a wheel holds (package-dir maps the card's folders in): a subpackage left out
    would be missing on a device that installs with `pip install .`."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    for package, folder in config["package-dir"].items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            name = ".".join([package, *rel.parts])
            owner = max(
                (p for p, f in config["package-dir"].items() if (REPO / f) in (init.parent, *init.parent.parents)),
                key=len,
            )
            if owner == package:
                assert name in listed, f"{name} ({init.parent}) is not in pyproject's packages"
