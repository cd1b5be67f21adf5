"""golden.npz: the golden inputs and the reference outputs, stacked on axis 0 (`input.NAME`, `output.NAME`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tapeout.core.errors import BadInput
from tapeout.core.feeds import Feeds, read_stacked, stack, unstack


def save_golden(path: Path, inputs: list[Feeds], outputs: list[dict[str, np.ndarray]]) -> None:
    arrays = {f"input.{k}": v for k, v in stack(inputs).items()}
    arrays.update({f"output.{k}": v for k, v in stack(outputs).items()})
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def load_golden(path: Path) -> tuple[list[Feeds], list[dict[str, np.ndarray]]]:
    if not path.is_file():
        raise BadInput(f"{path} not found: the build dir is incomplete", fix="rebuild with `tapeout build`")
    fix = "copy the build dir to the device as built, or rebuild with `tapeout build`"
    arrays = read_stacked(path, fix)
    inputs = {k[len("input.") :]: a for k, a in arrays.items() if k.startswith("input.")}
    outputs = {k[len("output.") :]: a for k, a in arrays.items() if k.startswith("output.")}
    for what, group in (("input", inputs), ("output", outputs)):
        if not group:
            raise BadInput(f"{path} holds no golden {what}s (no '{what}.NAME' arrays)", fix=fix)
    if not len(next(iter(arrays.values()))):
        raise BadInput(f"{path} holds no golden samples", fix=fix)
    return unstack(inputs), unstack(outputs)
