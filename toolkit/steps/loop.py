"""Step `loop`: the workload's loop measured on the target in fresh processes (core/workload.py): a generate
workload's prefill and decode over the KV cache, a stream's chunks with state carried, a plug-in's own. A build's
record step wrote the replay data; a check replays the build's, verified against the manifest. Nothing to do for a
workload of one call."""

from __future__ import annotations

from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


class Loop(Step):
    name = "loop"
    needs = ("artifact", "artifact_info", "golden", "engine")
    needs_at_build = ("workload_file",)
    adds = ("loop",)

    def run(self, state: BuildState) -> str | None:
        workload = state.workload
        state.loop = workload.measure(state)
        return None if state.loop is not None else f"the {workload.kind} workload runs no loop beside the call measured"

    def report(self, state: BuildState) -> dict[str, object]:
        return {"workload": state.loop.to_json()} if state.loop is not None else {}
