"""The step contract and the runner. A step is one class: its name, the state fields it needs and adds, and
`run`, which may return why it did nothing here (an fp32 build has no precision step to run; a check does
not evaluate the metric). The runner checks each step's needs before it runs and its adds after, records
how long it took, and keeps going until the list ends.

A step also contributes its report sections (`report`), so a new step brings its own part of the report
without editing the step that assembles it.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import fields
from typing import ClassVar

from tapeout.core.console import honour_interrupt
from tapeout.core.heap import return_freed_memory
from tapeout.steps.state import PENDING, BuildState, StepRun

STATE_FIELDS = frozenset(f.name for f in fields(BuildState))


class Step(ABC):
    name: ClassVar[str]
    needs: ClassVar[tuple[str, ...]] = ()  # BuildState fields it reads, added before it runs
    # what a build's run of it reads besides `needs` (a check reads those from the build dir it opened)
    needs_at_build: ClassVar[tuple[str, ...]] = ()
    adds: ClassVar[tuple[str, ...]] = ()  # BuildState fields it sets (None is a value; PENDING is not)

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
    with _long_lived_heap() as settle:
        for step in steps:
            _run_one(step, state)
            # What a step let go often sits in reference cycles (graph views, exporter IR, sessions): collected
            # now, before the next step allocates its own, a build's peak memory is one step's, not the sum of
            # what several left behind. Only what was made since the heap last settled is walked.
            gc.collect()
            return_freed_memory()
            settle()
    return state


_settling = False  # a run in progress owns the frozen heap; a run nested in it leaves the heap alone


def collect_all() -> None:
    """Collect every cycle, the frozen heap's too: for a step that lets go of something long-lived (the torch
    module), which the heap frozen after earlier steps would otherwise keep until the list ends. The runner
    freezes what survives again after the step."""
    gc.unfreeze()
    gc.collect()


@contextlib.contextmanager
def _long_lived_heap():
    """After each step's collection, move what survived it (torch, the exporter and the runtimes imported: some
    200k objects that live as long as the process; the model and what the step added) out of the cyclic
    collector's way: every full collection walks it again, about 0.1 s each on a 2-core host and one per step.
    What is frozen is still freed by its reference count; only a cycle let go by a later step waits for the end
    of the list, when the heap is put back, so that a caller that runs many builds in one process (the tests)
    keeps nothing it would have collected."""
    global _settling
    if _settling:
        yield lambda: None
        return
    _settling, frozen = True, False

    def settle() -> None:
        nonlocal frozen
        gc.freeze()
        frozen = True

    try:
        yield settle
    finally:
        _settling = False
        if frozen:
            gc.unfreeze()


def _run_one(step: Step, state: BuildState) -> None:
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
    state.ran.append(StepRun(step.name, time.perf_counter() - started, skipped, high_water_mb()))


def high_water_mb() -> float:
    """This process's peak resident memory so far, in MB."""
    import resource

    scale = 1 / 2**20 if sys.platform == "darwin" else 1 / 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, 1)


def sections(state: BuildState) -> dict[str, object]:
    """Every report section the steps of this run that have run contribute."""
    names = {r.name for r in state.ran}
    out: dict[str, object] = {}
    for step in state.flow:
        if step.name in names:
            out.update(step.report(state))
    return out
