"""Step `parity`: the artifact's outputs on the golden inputs against the reference outputs, per output."""

from __future__ import annotations

from tapeout.core.parity import compare
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


class Parity(Step):
    name = "parity"
    needs = ("golden", "measurement")
    adds = ("parity",)

    def run(self, state: BuildState) -> None:
        tolerance = state.settings.parity
        state.parity = compare(state.golden.outputs, state.measurement.outputs, tolerance.atol, tolerance.rtol)

    def report(self, state: BuildState) -> dict[str, object]:
        return {"parity": state.parity}
