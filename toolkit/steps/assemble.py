"""Step `report`: one report for a build or a check from the sections the steps that ran contribute; the exit
code follows from the verdicts (DESIGN §4)."""

from __future__ import annotations

from tapeout.core.host import host_fingerprint, now
from tapeout.measurement import verdicts
from tapeout.records.report import SCHEMA, ProfileInfo, Report, RunCost, StepTime, TargetRun
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step, high_water_mb, sections

# A report names every section, the absent ones as null: it says what it does not have.
_OPTIONAL = (
    "device",
    "accuracy",
    "placement",
    "engine",
    "estimate",
    "bottlenecks",
    "model",
    "export",
    "analysis",
    "quantization",
    "pruning",
    "lint",
)


class Assemble(Step):
    name = "report"
    needs = ("budgets",)
    adds = ("report",)

    def run(self, state: BuildState) -> None:
        setup = state.setup
        caps, profile = setup.capabilities, setup.profile
        fields = {name: [] if name == "lint" else None for name in _OPTIONAL}
        fields.update(sections(state))
        fields["passes"] = state.passes  # every step that ran passes added its records
        state.report = Report(
            schema=SCHEMA,
            kind=state.kind,
            created=now(),
            exit_code=verdicts.exit_code(state.budgets, state.strict),
            build_dir=state.build_dir,
            profile=ProfileInfo(
                name=profile.name,
                target=profile.target,
                device=profile.device,
                precision=profile.precision,
                budgets_from_project=list(setup.budgets_from_project),
            ),
            target=TargetRun(
                name=setup.target.name,
                version=setup.probe.version,
                emulated=setup.emulated,
                compile_on=caps.compile_on,
                meters=list(caps.meters),
            ),
            host=host_fingerprint(),
            run=run_cost(state),
            **fields,
        )


def run_cost(state: BuildState) -> RunCost:
    """The steps that ran so far, each with its time and the peak memory when it ended (the report and the write
    after it take well under a second; a step with nothing to do is left out), and the peak memory."""
    steps = [
        StepTime(name=r.name, seconds=round(r.seconds, 3), peak_rss_mb=r.peak_rss_mb)
        for r in state.ran
        if not r.skipped
    ]
    return RunCost(steps=steps, seconds=round(sum(s.seconds for s in steps), 3), peak_rss_mb=high_water_mb())
