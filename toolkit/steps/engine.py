"""Step `engine`: a target compiled on the device (TensorRT, MIGraphX) builds its engine for this device and
toolchain, or reuses the one cached beside the artifact. A build without the device defers it to `check`."""

from __future__ import annotations

from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


class Engine(Step):
    name = "engine"
    needs = ("artifact",)
    adds = ("engine",)

    def run(self, state: BuildState) -> str | None:
        setup = state.setup
        if setup.capabilities.compile_on != "device":
            state.engine = None
            return f"{setup.target.name} compiles on the host"
        if setup.deferred:
            state.engine = None
            return f"no device here ({setup.deferred}): the first `tapeout check` on the device builds it"
        with state.ui.step(f"{setup.profile.target} engine for this device"):
            state.engine = setup.target.build_engine(state.artifact, state.ui.detail)
        state.ui.note(state.engine.line())  # built (and why: another GPU, toolchain, driver) or reused
        return None

    def report(self, state: BuildState) -> dict[str, object]:
        return {"engine": state.engine.to_json() if state.engine else None}
