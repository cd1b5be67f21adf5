"""The project's data: sample inputs (calibration data, else random), golden I/O files, the metric."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tapeout.errors import BadInput, user_code
from tapeout.feeds import Feeds, check_feeds, npz_feeds, random_feeds, read_stacked, stack, unstack
from tapeout.types import Project

Predict = Callable[[Feeds], dict[str, np.ndarray]]


def sample_inputs(project: Project, count: int) -> tuple[list[Feeds], str]:
    """Up to `count` real inputs from [calibration] data, or seeded random ones; and where they came from."""
    if project.calibration is None:
        rng = np.random.default_rng(project.seed)
        return [random_feeds(project.inputs, project.dims, rng) for _ in range(count)], "random (seeded)"
    return read_inputs(project, project.calibration.data, count, "[calibration] data"), \
        f"calibration data {project.calibration.data}"


def read_inputs(project: Project, ref: str, count: int, field: str) -> list[Feeds]:
    """Up to `count` inputs from `ref`, an .npz in the project or a `file.py:callable` yielding feeds dicts;
    `field` names where `ref` was given, for the error lines."""
    if ref.endswith(".npz"):
        samples = npz_feeds(project.root / ref, project.inputs, project.dims, field)
    else:
        from tapeout.exporters.sources import resolve_callable

        source = resolve_callable(ref, project.root, field)
        samples = []
        with user_code(f"{field} {ref}", project.root):  # a generator runs the user's code as it yields
            produced = list(itertools.islice(source(), count))
        for feeds in produced:
            if not isinstance(feeds, dict):
                raise BadInput(f"{field} {ref} yielded {type(feeds).__name__}, not a dict of arrays",
                               fix="yield {input_name: numpy array} per sample")
            samples.append(check_feeds(dict(feeds), project.inputs, project.dims, f"{field} {ref}"))
    if not samples:
        raise BadInput(f"{field} {ref} gave no samples", fix="provide at least one sample")
    return samples[:count]


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
    inputs = {k[len("input."):]: a for k, a in arrays.items() if k.startswith("input.")}
    outputs = {k[len("output."):]: a for k, a in arrays.items() if k.startswith("output.")}
    for what, group in (("input", inputs), ("output", outputs)):
        if not group:
            raise BadInput(f"{path} holds no golden {what}s (no '{what}.NAME' arrays)", fix=fix)
    if not len(next(iter(arrays.values()))):
        raise BadInput(f"{path} holds no golden samples", fix=fix)
    return unstack(inputs), unstack(outputs)


def evaluate(project: Project, predict: Predict) -> float:
    """The project's metric for one model: its callable receives `predict(feeds) -> outputs`."""
    assert project.evaluation is not None
    ref = project.evaluation.metric
    from tapeout.exporters.sources import resolve_callable

    metric = resolve_callable(ref, project.root, "[evaluation] metric")
    with user_code(f"[evaluation] metric {ref}", project.root):
        value = metric(predict)
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise BadInput(f"[evaluation] metric {ref} returned {type(value).__name__}, not a number",
                       fix="return one float") from None
    if not math.isfinite(value):
        raise BadInput(f"[evaluation] metric {ref} returned {value}", fix="return a finite float")
    return value
