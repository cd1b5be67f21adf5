"""Step `placement`: which nodes ran on the target's accelerator — from the backend's own compile-time record
(QNN's op trace), else the per-op profile's provider per node. A check carries the build's: the artifact is
that compiled graph."""

from __future__ import annotations

from tapeout.measurement.measure import placement_from_profile
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


class Placement(Step):
    name = "placement"
    needs = ("artifact", "measurement")
    adds = ("placement",)

    def run(self, state: BuildState) -> str | None:
        if state.opened is not None:
            built = state.opened.report.placement
            state.placement = built.model_dump(mode="json", exclude_unset=True) if built else None
            return "carried from the build (the compile-time op trace of this very artifact)"
        placement = state.artifact.meta.get("placement")
        accelerator = state.setup.capabilities.accelerator
        if placement is None and accelerator:
            placement = placement_from_profile(state.measurement.op_profile, accelerator)
        state.placement = placement
        return None

    def report(self, state: BuildState) -> dict[str, object]:
        return {"placement": state.placement}
