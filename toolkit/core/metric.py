"""The project's metric: its callable, run on one model's `predict`, returning one finite number."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tapeout.core.errors import BadInput, user_code
from tapeout.core.feeds import Feeds
from tapeout.core.schemas import Project

Predict = Callable[[Feeds], dict[str, np.ndarray]]


def evaluate(project: Project, predict: Predict, through_cache: bool = True) -> float:
    """The project's metric for one model: its callable receives `predict(feeds) -> outputs`. For a generate workload
    `predict` is one call of the cache graph, run through the cache here, unless `through_cache` is False (it returns
    every position's logits itself: core/decoding.teacher_forced_loop)."""
    assert project.evaluation is not None
    ref = project.evaluation.metric
    if through_cache:  # a decoder's metric sees full-sequence logits, computed through the cache
        from tapeout.core import workload

        predict = workload.of(project).metric_predict(project, predict)
    from tapeout.core.user_code import resolve_callable

    metric = resolve_callable(ref, project.root, "[evaluation] metric")
    with user_code(f"[evaluation] metric {ref}", project.root):
        value = metric(predict)
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise BadInput(
            f"[evaluation] metric {ref} returned {type(value).__name__}, not a number", fix="return one float"
        ) from None
    if not math.isfinite(value):
        raise BadInput(f"[evaluation] metric {ref} returned {value}", fix="return a finite float")
    return value
