"""Step `estimate`: the latency estimate for the profile's device (roofline per kernel, calibrated where
measured), from the kernel structure the build saved: the profile's device spec, the shipped spec matching the
GPU that ran it, or this host's CPU for a CPU target; none where there is no device to estimate for."""

from __future__ import annotations

import dataclasses

from tapeout.estimation import estimate
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step

NO_DEVICE = (
    "no estimate: the profile names no device spec to estimate for, and no shipped one matches the device "
    "that ran it (set `device = ...` in the profile)"
)


class Estimate(Step):
    name = "estimate"
    needs = ("kernels", "phases", "quantization", "measurement", "loop", "artifact")
    adds = ("estimate",)

    def run(self, state: BuildState) -> str | None:
        if state.kernels is None:
            state.estimate = None
            return "the build dir holds neither its kernel structure nor its exported model"
        plan = (state.quantization or {}).get("plan")
        reported = (state.measurement.device or {}).get("name")
        # a check has no project: the build's inputs and dims, as its manifest recorded them, stand in for it
        setup = (
            state.setup
            if state.opened is None or state.setup.project is not None
            else dataclasses.replace(state.setup, project=state.opened.manifest.project)
        )
        with state.ui.step("estimate latency on the device (roofline, calibrated where measured)"):
            state.estimate = estimate.for_model(setup, state.kernels, plan, reported, state.phases, workload_of(state))
        unpriced = estimate.why_not_priced(state.setup.target.name, state.setup.device)
        none = f"no estimate: {unpriced}" if unpriced else NO_DEVICE
        if state.estimate is None:
            state.ui.note(none)
            return none
        # a bare lower bound is the report's to state, once; and where this run timed the device itself, its
        # measurement is the figure: on the console only a calibrated estimate of a device not timed here speaks
        timed_here = not state.setup.emulated and state.estimate.device.startswith("host-")
        if state.estimate.predicted_s is not None and not timed_here:
            state.ui.note(state.estimate.line())
            if state.estimate.generation is not None:
                state.ui.note(state.estimate.generation.line())
        return None

    def report(self, state: BuildState) -> dict[str, object]:
        if state.estimate is None:
            return {"estimate": None}
        measured = None if state.setup.emulated or state.loop is None else state.loop.to_json()
        return {"estimate": estimate.with_measured(state.estimate, measured_p50(state), measured)}


def workload_of(state: BuildState):
    """The workload: the project's at build, the one the build dir recorded at check (verified)."""
    if state.opened is not None:
        return state.opened.workload_settings()
    return state.setup.project.workload


def measured_p50(state: BuildState) -> float | None:
    """The measured p50, where this host's timings are the device's."""
    return None if state.setup.emulated else state.measurement.latency.quantiles["p50"].point
