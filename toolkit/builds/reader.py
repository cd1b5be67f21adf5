"""The one reader of build dirs. A build dir is a folder from elsewhere: its manifest is validated, every
file a command uses is checked against the hash the manifest recorded, and every path in it stays inside
it. A bad or edited file is one BadInput line (exit 2), never a figure shown to anyone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from tapeout.builds.staging import MANIFEST
from tapeout.core.config import validate
from tapeout.core.errors import BadInput, first_line
from tapeout.core.hashing import sha256_file
from tapeout.core.paths import confined
from tapeout.records.manifest import SCHEMA, ManifestRecord

if TYPE_CHECKING:  # annotations only: the registry imports a backend when `check` creates one
    pass



MAX_MANIFEST_BYTES = 16 << 20  # a manifest lists files and hashes: kilobytes, never this


def read_manifest(build_dir: Path) -> ManifestRecord:
    if not build_dir.is_dir():
        raise BadInput(f"build dir {build_dir} not found", fix="give the directory `tapeout build` wrote")
    path = build_dir / MANIFEST
    if not path.is_file():
        raise BadInput(f"{build_dir} is not a tapeout build dir (no {MANIFEST}); an interrupted build leaves none",
                       fix="run `tapeout build` again and check the directory it prints")
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise BadInput(f"{path} is {path.stat().st_size:,} bytes, not a manifest", fix="rebuild")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise BadInput(f"{path} is not valid JSON ({first_line(exc)})",
                       fix="rebuild; a manifest is never edited by hand") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise BadInput(f"{path}: schema {found!r} is not {SCHEMA!r}",
                       fix="check it with the tapeout version that built it, or rebuild")
    return validate(ManifestRecord, data, path)


def verified(build_dir: Path, rel: str, expected: str | None, what: str) -> Path:
    file = confined(build_dir, rel, what)  # a manifest is a file from elsewhere: its paths stay in the build dir
    if not file.is_file():
        raise BadInput(f"{what} {file} is missing", fix="copy the whole build dir to the device, or rebuild")
    if sha256_file(file) != expected:
        raise BadInput(f"{what} {file} differs from the one the build recorded (sha256 mismatch)",
                       fix="restore the build dir as built, or rebuild")
    return file


def verify_artifact(build_dir: Path, man: ManifestRecord) -> None:
    for rel, expected in man.artifact.files.items():
        verified(build_dir / "artifact", rel, expected, "artifact file")
