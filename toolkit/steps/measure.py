"""Step `measure`: the artifact timed in fresh inference processes with the target's meters, the same in a build
and on the device. Through an emulator only enough runs for parity: its timings are never judged."""

from __future__ import annotations

from pathlib import Path

from tapeout import targets
from tapeout.core.artifact import Artifact
from tapeout.core.host import host_fingerprint
from tapeout.core.profile_schema import CheckSettings
from tapeout.measurement import measure as measuring
from tapeout.measurement import verdicts
from tapeout.records.report import DeviceMatch
from tapeout.steps.setup import Setup
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


def measure_target(
    setup: Setup, artifact: Artifact, golden_path: Path, settings: CheckSettings, stand_in: Path | None = None
) -> tuple[measuring.Measurement, CheckSettings]:
    """Fresh-process measurement, and the settings it ran with (an emulator's are cut to what parity needs).
    `stand_in`: the ONNX model that runs on ORT's CPU EP where the target's program cannot run here (deferred),
    when the artifact is not itself ONNX (a target that compiles from torch.export)."""
    emulated = setup.emulated
    if emulated:
        settings = measuring.for_emulator(settings)
    target = setup.target
    if setup.deferred:  # no engine here: the ONNX it is compiled from runs on ORT's CPU EP, for parity only
        target = targets.create("onnxruntime", {"graph_optimization": "basic"})
        onnx = stand_in or artifact.path
        artifact = Artifact("onnxruntime", onnx.parent, onnx.name)
    with setup.ui.step(
        f"measure {artifact.target} in fresh inference processes" + (" (emulated: parity only)" if emulated else "")
    ):
        m = measuring.measure(
            target,
            artifact,
            golden_path,
            settings,
            progress=setup.ui.detail,
            **({} if emulated else {"undecided": verdicts.latency_undecided(setup.profile.budgets, settings)}),
        )
    if emulated:
        m.notes.append(f"{emulated}; {settings.iterations} runs for parity, not judged")
    return m, settings


def device_match(setup: Setup, m: measuring.Measurement) -> DeviceMatch | None:
    """Say when the device that ran is not the profile's (an H200 checking an H100 profile, say)."""
    reported = (m.device or {}).get("name")
    spec = setup.device
    if spec is None and reported is None:
        return None
    if spec is None or not spec.identifiers or reported is None:
        return DeviceMatch(
            spec=spec.name if spec else None,
            reported=reported,
            matches=None,
            note="" if reported is None else "the profile names no device spec to compare with",
        )
    ok = spec.matches(reported)
    return DeviceMatch(
        spec=spec.name,
        reported=reported,
        matches=ok,
        note=""
        if ok
        else f"measured on {reported}, but the profile is for {spec.name}: the "
        "latency, memory and power verdicts are this device's, not the profile's",
    )


class Measure(Step):
    name = "measure"
    needs = ("artifact", "golden", "engine")
    needs_at_build = ("model",)  # the ONNX that stands in where a torch.export program cannot run here
    adds = ("measurement",)

    def run(self, state: BuildState) -> None:
        program = state.setup.capabilities.compiles_from == "torch.export" and state.opened is None
        m, state.settings = measure_target(
            state.setup, state.artifact, state.golden.path, state.settings, stand_in=state.model if program else None
        )
        if state.opened is not None:  # a check on another CPU: parity is that CPU's, and the report says so
            host, built_on = host_fingerprint(), state.opened.manifest.host
            if (host["cpu"], host["cpu_flags"]) != (built_on.cpu, built_on.cpu_flags):
                m.notes.append(
                    f"checked on {host['cpu']} ({' '.join(host['cpu_flags'])}); built on {built_on.cpu} "
                    f"({' '.join(built_on.cpu_flags)}): parity above is this CPU's"
                )
        match = device_match(state.setup, m)
        if match is not None and match.note and match.matches is False:
            m.notes.append(match.note)
        state.measurement = m

    def report(self, state: BuildState) -> dict[str, object]:
        return {"measurement": state.measurement.to_json(), "device": device_match(state.setup, state.measurement)}
