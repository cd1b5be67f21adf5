"""Atomic writes: a build is staged in a hidden sibling directory and renamed into place only when complete.

A build that dies leaves at most a `.NAME.partial-PID` directory, never a build dir that looks complete.
`manifest.json` is written last, so a directory without one is not a build.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tapeout.errors import BadInput

MANIFEST = "manifest.json"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: Path, text: str) -> None:
    """Write so that readers see the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp creates 0600; a report is for everyone to read
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


class StagedBuild:
    """`with StagedBuild(out) as staging:` — write into `staging`; on success it becomes `out`."""

    def __init__(self, final: Path):
        self.final = Path(final).resolve()
        if self.final.exists() and not is_build_dir(self.final) and any(self.final.iterdir()):
            raise BadInput(f"{self.final} exists and is not a tapeout build dir",
                           fix="choose another --out directory, or remove it")
        self.staging = self.final.parent / f".{self.final.name}.partial-{os.getpid()}"

    def __enter__(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir()
        return self.staging

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            return
        if not (self.staging / MANIFEST).is_file():
            shutil.rmtree(self.staging, ignore_errors=True)
            raise RuntimeError("internal: a staged build was committed without its manifest")
        old = self.final.parent / f".{self.final.name}.old-{os.getpid()}"
        if self.final.exists():
            os.replace(self.final, old)
        os.replace(self.staging, self.final)
        shutil.rmtree(old, ignore_errors=True)


def is_build_dir(path: Path) -> bool:
    return (Path(path) / MANIFEST).is_file()
