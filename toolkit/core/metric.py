"""The project's metric: its callable, run on one model's `predict`, returning one finite number."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tapeout.core.errors import BadInput, user_code
from tapeout.core.feeds import Feeds
from tapeout.core.schemas import Project

Predict = Callable[[Feeds], dict[str, np.ndarray]]


def evaluate(project: Project, predict: Predict) -> float:
    """The project's metric for one model: its callable receives `predict(feeds) -> outputs`."""
    assert project.evaluation is not None
    ref = project.evaluation.metric
    if project.workload.kind == "generate":  # the metric sees full-sequence logits, computed through the cache
        from tapeout.core.decoding import graph_layout, teacher_forced

        predict = teacher_forced(predict, graph_layout(project.inputs, project.workload.max_context))
    from tapeout.core.user_code import resolve_callable

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
