"""What a target's compile writes: the artifact directory and its main file, with the backend's notes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Artifact:
    """What runs on the device: a directory under the build dir, with its main file."""

    target: str
    directory: Path
    main_file: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.directory / self.main_file
