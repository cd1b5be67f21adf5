"""Step `record`: what a build writes down from the FP32 reference for the loop it measures later, while the torch
model is still loaded: a generate workload's workload.npz (the prompts and torch's greedy tokens), a stream's (the
golden stream and the reference carried over it). Nothing for a forward workload; a check replays the file the
build wrote, so the step is the build's only."""

from __future__ import annotations

from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


class Record(Step):
    name = "record"
    needs = ("loaded", "exported", "golden")
    adds = ("workload_file",)

    def run(self, state: BuildState) -> str | None:
        workload = state.workload
        state.workload_file = workload.record(state)
        return None if state.workload_file is not None else f"the {workload.kind} workload replays nothing"
