"""House rules that are cheap to check on every run: ruff check (incl. no heavy imports at module level), ruff format,
module size."""

import shutil
import subprocess

import pytest

from conftest import REPO


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is in the [test] extra")
def test_ruff_clean():
    result = subprocess.run(["ruff", "check", "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is in the [test] extra")
def test_ruff_formatted():
    """One formatter, so the module-size rule below measures code, not how it was wrapped."""
    result = subprocess.run(["ruff", "format", "--check", "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_modules_stay_small():
    sizes = {
        p.relative_to(REPO): len(p.read_text().splitlines())
        for folder in ("toolkit", "exporters", "quantize", "targets")
        for p in (REPO / folder).rglob("*.py")
    }
    assert sizes and all(lines <= 600 for lines in sizes.values()), {str(k): v for k, v in sizes.items() if v > 400}
