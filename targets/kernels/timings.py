"""What `tapeout kernels bench` measured on a GPU, kept per device: for each kernel, shape and dtype, the config
autotuning chose and the kernel's, eager PyTorch's and Inductor's times. The substitution pass decides from it, and
autotuning reads its choice back instead of tuning again.

One JSON file per device key (GPU name, compute capability, Triton and torch versions): a timing from one GPU or
toolchain is never used for another. The file is the user's own cache, still read as data: a malformed one is one
line naming it, never a traceback.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tapeout.core.errors import BadInput
from tapeout.core.files import write_json

SCHEMA = "tapeout.kernel-timings/1"


class Timing(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config: str  # Config.key of the tuned launch
    kernel_ms: float = Field(gt=0)  # p50 over the timed calls
    kernel_p90_ms: float = Field(gt=0)
    eager_ms: float | None = Field(None, gt=0)
    inductor_ms: float | None = Field(None, gt=0)  # torch.compile of the eager chain (Inductor's own code)
    calls: int = Field(ge=1)


class TimingFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_: str = Field(alias="schema")
    device: str
    entries: dict[str, Timing]


def directory() -> Path:
    """$TAPEOUT_KERNEL_CACHE, else ~/.cache/tapeout/kernels (XDG_CACHE_HOME honoured)."""
    if os.environ.get("TAPEOUT_KERNEL_CACHE"):
        return Path(os.environ["TAPEOUT_KERNEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tapeout" / "kernels"


def device_key(gpu: str, capability: tuple[int, int], triton_version: str, torch_version: str) -> str:
    return f"{gpu} | sm{capability[0]}{capability[1]} | triton {triton_version} | torch {torch_version}"


def entry_key(kernel: str, case_key: str, dtype: str) -> str:
    return f"{kernel} | {case_key} | {dtype}"


def path_for(device: str, folder: Path | None = None) -> Path:
    return (folder or directory()) / (re.sub(r"[^A-Za-z0-9._-]+", "_", device).strip("_") + ".json")


def load(device: str, folder: Path | None = None) -> dict[str, Timing]:
    """The timings measured on `device` (empty when none were)."""
    path = path_for(device, folder)
    if not path.is_file():
        return {}
    try:
        found = TimingFile.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError, RecursionError) as exc:
        raise BadInput(
            f"the kernel timings file {path} is malformed ({str(exc).splitlines()[0]})",
            fix="delete it; `tapeout kernels bench` measures again",
        ) from None
    if found.schema_ != SCHEMA or found.device != device:
        raise BadInput(
            f"the kernel timings file {path} is for {found.device!r} ({found.schema_}), not {device!r}",
            fix="delete it; `tapeout kernels bench` measures again",
        )
    return found.entries


def save(device: str, entries: dict[str, Timing], folder: Path | None = None) -> Path:
    """Merge `entries` into the device's file (written whole: never half a file)."""
    path = path_for(device, folder)
    merged = {**load(device, folder), **entries}
    body = TimingFile.model_validate({"schema": SCHEMA, "device": device, "entries": merged})
    write_json(path, body.model_dump(by_alias=True))
    return path
