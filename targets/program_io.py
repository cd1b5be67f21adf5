"""The interface of a program compiled from torch.export (ExecuTorch's .pte, AOTInductor's .pt2) on our side:
io.json beside it (its inputs' names, shapes, None where a dim is dynamic, and dtypes; its outputs' names, in call
order) and the session shape both targets share (`ProgramSession`). The compiled programs take and return
positional tensors, and an AOTInductor package does not check what it is given (a wrong shape reads past its
buffers), so the checked call compares the feeds with io.json first. io.json is read from a build dir, so it is
checked as data."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tapeout.core.artifact import Artifact
from tapeout.core.errors import BadInput
from tapeout.core.schemas import InputSpec
from tapeout.targets.base import Session

IO_FILE = "io.json"
_FIX = "copy the build dir to the device as built, or rebuild"


@dataclass(frozen=True)
class ProgramIO:
    inputs: list[str]
    outputs: list[str]
    shapes: list[list[int | None]]
    dtypes: list[str]

    def check(self, feeds: dict[str, np.ndarray]) -> None:
        """ValueError naming the first input whose dtype, rank or a fixed dim differs from the program's."""
        for name, shape, dtype in zip(self.inputs, self.shapes, self.dtypes, strict=True):
            if name not in feeds:
                raise ValueError(f"input {name!r} is missing")
            got = np.asarray(feeds[name])
            if (
                str(got.dtype) != dtype
                or got.ndim != len(shape)
                or any(want is not None and want != have for want, have in zip(shape, got.shape, strict=True))
            ):
                wanted = ", ".join("any" if d is None else str(d) for d in shape)
                raise ValueError(
                    f"input {name!r} is {got.dtype} {list(got.shape)}; the program takes {dtype} [{wanted}]"
                )


def write_io(directory: Path, inputs: list[InputSpec], output_names: list[str], dims: dict[str, int] | None) -> None:
    """`dims`: the values the program's symbolic dims were fixed at, or None where they stay dynamic."""
    shapes = [[d if isinstance(d, int) else (dims[d] if dims is not None else None) for d in s.shape] for s in inputs]
    (directory / IO_FILE).write_text(
        json.dumps(
            {
                "inputs": [s.name for s in inputs],
                "outputs": list(output_names),
                "shapes": shapes,
                "dtypes": [s.dtype for s in inputs],
            }
        )
    )


def read_io(directory: Path) -> ProgramIO:
    """The program's signature; a missing, malformed or wrongly typed file is one line."""
    try:
        io = json.loads((directory / IO_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"{directory / IO_FILE} is missing or not JSON ({exc})", fix=_FIX) from None
    names = isinstance(io, dict) and all(
        isinstance(io.get(k), list) and all(isinstance(n, str) for n in io[k]) for k in ("inputs", "outputs", "dtypes")
    )
    shapes = (
        names
        and isinstance(io.get("shapes"), list)
        and all(
            isinstance(s, list) and all(d is None or (isinstance(d, int) and not isinstance(d, bool)) for d in s)
            for s in io["shapes"]
        )
    )
    if not (shapes and len(io["shapes"]) == len(io["inputs"]) == len(io["dtypes"])):
        raise BadInput(f"{directory / IO_FILE} does not describe the program's inputs and outputs", fix=_FIX)
    return ProgramIO(io["inputs"], io["outputs"], io["shapes"], io["dtypes"])


class ProgramSession(Session):
    """A compiled program called with torch tensors in io.json's input order, its outputs named in io.json's. A
    subclass loads the program and implements `_call(tensors)` (and a `bind` without Python in the timed call)."""

    def __init__(self, artifact: Artifact):
        self._io = read_io(artifact.directory)
        self.input_names, self.output_names = self._io.inputs, self._io.outputs

    def _call(self, tensors: list):
        raise NotImplementedError

    def _tensors(self, feeds: dict[str, np.ndarray]) -> list:
        import torch

        return [torch.from_numpy(np.ascontiguousarray(feeds[name])) for name in self.input_names]

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._io.check(feeds)
        out = self._call(self._tensors(feeds))
        outs = out if isinstance(out, tuple | list) else (out,)
        return {name: t.numpy().copy() for name, t in zip(self.output_names, outs, strict=True)}
