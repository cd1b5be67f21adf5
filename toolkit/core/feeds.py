"""Model inputs as numpy feed dicts: random ones from the input specs, real ones from .npz files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tapeout.core.errors import BadInput, first_line
from tapeout.core.schemas import InputSpec

Feeds = dict[str, np.ndarray]


def random_feeds(inputs: list[InputSpec], dims: dict[str, int], rng: np.random.Generator) -> Feeds:
    """One feed dict drawn inside each input's declared value range."""
    feeds: Feeds = {}
    for spec in inputs:
        shape = spec.concrete_shape(dims)
        if spec.dtype == "bool":
            feeds[spec.name] = rng.integers(0, 2, size=shape).astype(bool)
        elif spec.dtype.startswith(("int", "uint")):
            low, high = spec.range or (0, 10)
            feeds[spec.name] = rng.integers(int(low), int(high) + 1, size=shape).astype(spec.dtype)
        else:
            if spec.range:
                values = rng.uniform(spec.range[0], spec.range[1], size=shape)
            else:
                values = rng.standard_normal(size=shape)
            feeds[spec.name] = values.astype(spec.dtype)
    # a rank-0 input (a sample rate, a gain) is a 0-d array, not a numpy scalar: runtimes take only arrays
    return {name: np.asarray(value) for name, value in feeds.items()}


def check_feeds(feeds: Feeds, inputs: list[InputSpec], dims: dict[str, int], origin: str) -> Feeds:
    """Names, shapes and dtypes of a feed dict against the project's input specs."""
    for spec in inputs:
        if spec.name not in feeds:
            raise BadInput(
                f"{origin}: no array for input '{spec.name}' (has {', '.join(feeds) or 'nothing'})",
                fix=f"provide '{spec.name}' with shape {list(spec.shape)}",
            )
        array = np.asarray(feeds[spec.name])
        want = spec.concrete_shape(dims)
        if array.shape != want:
            raise BadInput(
                f"{origin}: input '{spec.name}' has shape {list(array.shape)}, the project declares "
                f"{list(spec.shape)} = {list(want)}",
                fix="fix the data or the [[inputs]] shape",
            )
        if array.dtype != np.dtype(spec.dtype):
            if not np.can_cast(array.dtype, spec.dtype, casting="same_kind"):
                raise BadInput(
                    f"{origin}: input '{spec.name}' is {array.dtype}, the project declares {spec.dtype}",
                    fix="convert the data or fix the [[inputs]] dtype",
                )
            array = array.astype(spec.dtype)
        feeds[spec.name] = array
    return {spec.name: feeds[spec.name] for spec in inputs}


def read_stacked(path: Path, fix: str) -> dict[str, np.ndarray]:
    """The arrays of an .npz of samples stacked on axis 0 (calibration data, golden files): readable
    without unpickling, at least one, numeric, each with a sample axis, all with the same count."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as exc:  # not a zip, an object array (a pickle), a truncated file: numpy raises several kinds
        raise BadInput(f"{path} is not a readable .npz file ({first_line(exc)})", fix=fix) from None
    if not arrays:
        raise BadInput(f"{path} holds no arrays", fix=fix)
    for name, array in arrays.items():
        if array.ndim == 0:
            raise BadInput(f"{path}: array '{name}' is a 0-d scalar, not a stack of samples", fix=fix)
        if array.dtype.kind not in "biufc":
            raise BadInput(f"{path}: array '{name}' holds {array.dtype}, not numbers", fix=fix)
    counts = {len(a) for a in arrays.values()}
    if len(counts) != 1:
        raise BadInput(f"{path}: arrays have different sample counts {sorted(counts)}", fix=fix)
    return arrays


def npz_feeds(
    path: Path, inputs: list[InputSpec], dims: dict[str, int], field: str = "[calibration] data"
) -> list[Feeds]:
    """An .npz holds one array per input name, its samples stacked on a leading axis: `(N, *input shape)`, or, for
    an input whose first dim is its batch, the samples along that axis, `(N, *input shape[1:])`, taken a batch at a
    time. `field` names where it was given."""
    if not path.is_file():
        raise BadInput(f"{field}: data file {path} not found", fix=f"check {field} in the project or profile file")
    arrays = read_stacked(
        path,
        fix=f"save one numeric array per input ({', '.join(s.name for s in inputs)}) with "
        "numpy.savez, samples stacked on axis 0",
    )
    per_input = {}
    for spec in inputs:
        if spec.name not in arrays:
            raise BadInput(
                f"{path}: no array for input '{spec.name}' (has {', '.join(arrays)})",
                fix=f"save it as {spec.name}=array of shape {_layouts(spec, dims)}",
            )
        per_input[spec.name] = _samples(arrays[spec.name], spec, dims, path)
    counts = {name: len(samples) for name, samples in per_input.items()}
    if len(set(counts.values())) != 1:
        raise BadInput(
            f"{path}: the inputs hold different numbers of samples ({counts})",
            fix="give every input the same number of samples",
        )
    count = next(iter(counts.values()))
    return [
        check_feeds({name: samples[i] for name, samples in per_input.items()}, inputs, dims, str(path))
        for i in range(count)
    ]


def _layouts(spec: InputSpec, dims: dict[str, int]) -> str:
    want = list(spec.concrete_shape(dims))
    shapes = [f"(N, {', '.join(map(str, want))})" if want else "(N,)"]
    if want:
        shapes.append(f"(N, {', '.join(map(str, want[1:]))})" if len(want) > 1 else "(N,)")
    return " or ".join(dict.fromkeys(shapes))


def _samples(array: np.ndarray, spec: InputSpec, dims: dict[str, int], path: Path) -> list[np.ndarray]:
    """One input's samples: each `array[i]` where a row is the input's shape, else batches of rows where a row is
    one item of the batch; any other shape is one line naming the shapes that work."""
    want = spec.concrete_shape(dims)
    if array.shape[1:] == want:
        return [array[i, ...] for i in range(len(array))]  # a scalar input's sample stays a 0-d array
    if want and array.shape[1:] == want[1:] and len(array) >= want[0]:
        batch = want[0]
        return [array[i * batch : (i + 1) * batch] for i in range(len(array) // batch)]
    raise BadInput(
        f"{path}: array '{spec.name}' has shape {list(array.shape)}, and input '{spec.name}' is "
        f"{list(spec.shape)} = {list(want)}",
        fix=f"save {len(array)} samples as {_layouts(spec, dims)}",
    )


def stack(samples: list[Feeds]) -> Feeds:
    return {name: np.stack([s[name] for s in samples]) for name in samples[0]}


def unstack(stacked: dict[str, np.ndarray]) -> list[Feeds]:
    count = len(next(iter(stacked.values())))
    # v[i, ...]: a scalar input's sample stays a 0-d array (v[i] would be a numpy scalar, which runtimes refuse)
    return [{k: v[i, ...] for k, v in stacked.items()} for i in range(count)]
