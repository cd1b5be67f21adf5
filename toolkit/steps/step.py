"""The step contract and the runner. A step is one class: its name, the state fields it needs and adds, and
`run`, which may return why it did nothing here (an fp32 build has no precision step to run; a check does
not evaluate the metric). The runner checks each step's needs before it runs and its adds after, records
how long it took, and keeps going until the list ends.

A step also contributes its report sections (`report`), so a new step brings its own part of the report
without editing the step that assembles it.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import fields
from typing import ClassVar

from tapeout.core.console import honour_interrupt
from tapeout.steps.state import PENDING, BuildState, StepRun

STATE_FIELDS = frozenset(f.name for f in fields(BuildState))


class Step(ABC):
    name: ClassVar[str]
    needs: ClassVar[tuple[str, ...]] = ()   # BuildState fields it reads, added before it runs
    # what a build's run of it reads besides `needs` (a check reads those from the build dir it opened)
    needs_at_build: ClassVar[tuple[str, ...]] = ()
    adds: ClassVar[tuple[str, ...]] = ()    # BuildState fields it sets (None is a value; PENDING is not)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        unknown = [n for n in (*cls.needs, *cls.needs_at_build, *cls.adds) if n not in STATE_FIELDS]
        if unknown:
            raise TypeError(f"step {cls.__name__} names {unknown}, which are not BuildState fields")

    @abstractmethod
    def run(self, state: BuildState) -> str | None:
        """Do the step's work and set what it adds; return why it had nothing to do here, or None."""

    def report(self, state: BuildState) -> dict[str, object]:
        """The report sections this step contributes (report field -> value); none by default."""
        return {}


def run(steps: Sequence[Step], state: BuildState) -> BuildState:
    """Run `steps` over `state`, in order."""
    state.flow = tuple(steps)
    for step in steps:
        honour_interrupt()
        needs = (*step.needs, *(step.needs_at_build if state.kind == "build" else ()))
        missing = [n for n in needs if getattr(state, n) is PENDING]
        if missing:
            raise RuntimeError(f"internal: step '{step.name}' needs {missing}, which no earlier step added")
        started = time.perf_counter()
        skipped = step.run(state) or ""
        left = [n for n in step.adds if getattr(state, n) is PENDING]
        if left:
            raise RuntimeError(f"internal: step '{step.name}' did not add {left}")
        state.ran.append(StepRun(step.name, time.perf_counter() - started, skipped))
    return state


def sections(state: BuildState) -> dict[str, object]:
    """Every report section the steps of this run that have run contribute."""
    names = {r.name for r in state.ran}
    out: dict[str, object] = {}
    for step in state.flow:
        if step.name in names:
            out.update(step.report(state))
    return out
