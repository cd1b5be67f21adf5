"""Step `bottlenecks`: each profiled op against the device's roofs — compute-, memory- or overhead-bound, the
time outside the ops, and chains a fused kernel would collapse; only where the timings are the device's."""

from __future__ import annotations

from tapeout.estimation import bottleneck
from tapeout.steps.estimate import measured_p50
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


class Bottlenecks(Step):
    name = "bottlenecks"
    needs = ("measurement", "estimate")
    adds = ("bottlenecks",)

    def run(self, state: BuildState) -> str | None:
        if state.setup.emulated or state.estimate is None:
            state.bottlenecks = None
            return "the timings are not the device's" if state.setup.emulated else "no roofs to judge against"
        state.bottlenecks = bottleneck.view(state.measurement.op_profile, state.estimate.roof, measured_p50(state))
        return None

    def report(self, state: BuildState) -> dict[str, object]:
        return {"bottlenecks": state.bottlenecks}
