"""Folders sent between the head and the workers as data: {relative path: bytes}.

A bundle from a worker is a file from elsewhere: every name is confined to the folder it is unpacked into (no
absolute path, no '..', no link: links are never sent, only files' bytes), sizes are bounded, and what it
claims is verified by the build dir's manifest after unpacking, never before.
"""

from __future__ import annotations

import os
from pathlib import Path

from tapeout.core.errors import BadInput
from tapeout.core.files import write_bytes
from tapeout.core.paths import confined

Bundle = dict[str, bytes]

MAX_BUNDLE_BYTES = 8 << 30  # a build dir or a project the farm moves: a large model's weights, never more
MAX_FILES = 20_000
SKIPPED_DIRS = {"build", "__pycache__"}  # a project's default build dirs and bytecode: outputs, not inputs


def pack(folder: Path, skip: set[Path] = frozenset()) -> Bundle:
    """Every file under `folder` (hidden folders, build outputs and `skip` left out), by POSIX relative path."""
    folder = folder.resolve()
    found: Bundle = {}
    total = 0
    for here, dirs, files in os.walk(folder):
        base = Path(here)
        dirs[:] = sorted(
            d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".") and (base / d).resolve() not in skip
        )
        for name in sorted(files):
            path = base / name
            if not path.is_file():  # a broken link or a socket: nothing a build reads
                continue
            data = path.read_bytes()
            total += len(data)
            if total > MAX_BUNDLE_BYTES or len(found) >= MAX_FILES:
                raise BadInput(
                    f"{folder} holds over {MAX_BUNDLE_BYTES >> 30} GiB or {MAX_FILES:,} files: too much "
                    "to send to a farm worker",
                    fix="keep data the build does not read outside the project",
                )
            found[path.relative_to(folder).as_posix()] = data
    return found


def pack_build(build_dir: Path) -> Bundle:
    """Every file of a build dir (its own hidden files too: the manifest lists what it holds)."""
    found: Bundle = {}
    for path in sorted(build_dir.rglob("*")):
        if path.is_symlink():
            raise BadInput(f"{path} is a link inside a build dir", fix="rebuild: a build dir holds files only")
        if path.is_file():
            found[path.relative_to(build_dir).as_posix()] = path.read_bytes()
    return found


def unpack(bundle: object, folder: Path, what: str) -> list[Path]:
    """Write a bundle from elsewhere into `folder` (which must be empty): names confined, types and sizes checked."""
    if not isinstance(bundle, dict) or len(bundle) > MAX_FILES:
        raise BadInput(
            f"{what} is not a bundle of at most {MAX_FILES:,} files",
            fix="rerun the farm with the same tapeout version on every node",
        )
    total = sum(len(v) for v in bundle.values() if isinstance(v, bytes | bytearray))
    if total > MAX_BUNDLE_BYTES:
        raise BadInput(
            f"{what} is {total:,} bytes, over the farm's {MAX_BUNDLE_BYTES >> 30} GiB",
            fix="rerun the farm with the same tapeout version on every node",
        )
    written = []
    for rel, data in bundle.items():
        if not isinstance(rel, str) or not isinstance(data, bytes | bytearray):
            raise BadInput(
                f"{what} holds an entry that is not a file name and its bytes",
                fix="rerun the farm with the same tapeout version on every node",
            )
        path = confined(folder, rel, f"{what}: file")
        if path.exists():
            raise BadInput(
                f"{what}: file '{rel}' is named twice", fix="rerun the farm with the same tapeout version on every node"
            )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_bytes(path, bytes(data))
        except (NotADirectoryError, IsADirectoryError, FileExistsError):
            raise BadInput(
                f"{what}: file '{rel}' collides with another entry's folder",
                fix="rerun the farm with the same tapeout version on every node",
            ) from None
        written.append(path)
    return written
