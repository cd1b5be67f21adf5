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
        workload = state.setup.project.workload
        if workload.kind == "generate":
            from tapeout.core.decoding import graph_layout
            from tapeout.steps.generate import make_workload_data

            state.workload_file = make_workload_data(state, graph_layout(state.setup.project.inputs, workload))
        elif workload.kind == "stream":
            from tapeout.steps.stream import make_stream_data

            state.workload_file = make_stream_data(state)
        else:
            state.workload_file = None
            return f"the project's workload is {workload.kind}"
        return None
