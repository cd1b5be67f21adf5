"""Files written so that readers see the old file or the new one, never half of one; and the checks that
an output path can be written, made before the long work so that a typo costs nothing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tapeout.core.errors import BadInput, first_line


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: Path, text: str) -> None:
    """Write so that readers see the old file or the new one, never half of one."""
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp creates 0600; a report is for everyone to read
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def nearest_existing(path: Path) -> Path:
    """`path` or its closest ancestor that exists (the root always does)."""
    return next(p for p in (path, *path.parents) if p.exists())


def name_max(folder: Path) -> int:
    try:
        return os.pathconf(nearest_existing(folder), "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(nearest_existing(folder)).free
    except OSError:
        return None


def _free_text(folder: Path) -> str:
    free = free_bytes(folder)
    return "free space unknown" if free is None else f"{free / 2**20:.1f} MiB free"


def out_of_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full(folder: Path, exc: BaseException) -> BadInput:
    return BadInput(
        f"no space left on the disk holding {folder} ({_free_text(folder)}); the work stopped at: {first_line(exc)}",
        fix="free space there, or pass --out a path on another disk",
    )


def writable_dir(folder: Path, what: str, fix: str) -> Path:
    """`folder`, or one line saying why nothing can be written there (read-only, not a directory)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BadInput(f"{what} {folder} is not a directory", fix=fix)
    if not os.access(folder, os.W_OK):  # honours read-only mounts, for root too
        raise BadInput(f"{what} {folder} is read-only", fix=fix)
    return folder


def output_file(path: Path, what: str) -> Path:
    """Prepare to write `path` (a report, an ONNX file): its folder exists and is writable, and it is not
    a directory. Called before the long work, so a typo in `--junit` costs nothing."""
    path = Path(path).absolute()
    existing = nearest_existing(path.parent)
    if len(os.fsencode(path.name)) > name_max(existing):  # before any stat of it, which would raise
        raise BadInput(f"{what} name '{path.name[:40]}…' is too long for this filesystem", fix="choose a shorter name")
    if path.is_dir():
        raise BadInput(f"{what} {path} is a directory", fix=f"give a file name for {what}, e.g. {path / 'out'}")
    if not existing.is_dir():
        raise BadInput(f"{what} {path} is under {existing}, which is a file", fix=f"give {what} another path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(
            f"cannot create {path.parent} for {what}: {exc.strerror or exc}", fix=f"give {what} a path you can write"
        ) from None
    writable_dir(path.parent, f"{what} folder", fix=f"give {what} a path you can write")
    return path
