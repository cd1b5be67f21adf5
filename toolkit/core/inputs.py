"""The project's inputs: real ones from [calibration] data (an .npz or a callable yielding feeds), else
seeded random ones at the project's shapes.
"""

from __future__ import annotations

import itertools

import numpy as np

from tapeout.core.errors import BadInput, user_code
from tapeout.core.feeds import Feeds, check_feeds, npz_feeds, random_feeds
from tapeout.core.schemas import Project


def sample_inputs(project: Project, count: int) -> tuple[list[Feeds], str]:
    """Up to `count` real inputs from [calibration] data, or seeded random ones; and where they came from."""
    if project.calibration is None:
        rng = np.random.default_rng(project.seed)
        return [random_feeds(project.inputs, project.dims, rng) for _ in range(count)], "random (seeded)"
    return read_inputs(
        project, project.calibration.data, count, "[calibration] data"
    ), f"calibration data {project.calibration.data}"


def read_inputs(project: Project, ref: str, count: int, field: str) -> list[Feeds]:
    """Up to `count` inputs from `ref`, an .npz in the project or a `file.py:callable` yielding feeds dicts;
    `field` names where `ref` was given, for the error lines."""
    if ref.endswith(".npz"):
        samples = npz_feeds(project.root / ref, project.inputs, project.dims, field)
    else:
        from tapeout.core.user_code import resolve_callable

        source = resolve_callable(ref, project.root, field)
        samples = []
        with user_code(f"{field} {ref}", project.root):  # a generator runs the user's code as it yields
            produced = list(itertools.islice(source(), count))
        for feeds in produced:
            if not isinstance(feeds, dict):
                raise BadInput(
                    f"{field} {ref} yielded {type(feeds).__name__}, not a dict of arrays",
                    fix="yield {input_name: numpy array} per sample",
                )
            samples.append(check_feeds(dict(feeds), project.inputs, project.dims, f"{field} {ref}"))
    if not samples:
        raise BadInput(f"{field} {ref} gave no samples", fix="provide at least one sample")
    return samples[:count]


def check_project_files(project: Project) -> None:
    """Before the first expensive step: the calibration .npz read and checked against the inputs (the shapes it may
    have named), and every callable the project names imported and found, so a typo costs no export."""
    from tapeout.core import workload
    from tapeout.core.user_code import resolve_callable

    data = project.calibration.data if project.calibration else None
    if data and workload.of(project).calibration_feeds_inputs(project):  # a decoder's become the cache graph's
        if data.endswith(".npz"):
            npz_feeds(project.root / data, project.inputs, project.dims, "[calibration] data")
        else:
            resolve_callable(data, project.root, "[calibration] data")
    if project.evaluation is not None:
        resolve_callable(project.evaluation.metric, project.root, "[evaluation] metric")
    for field, ref in workload.of(project).user_callables(project).items():
        resolve_callable(ref, project.root, f"[workload] {field}")
