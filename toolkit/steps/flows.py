"""The build as one ordered list of steps, and check as an opening plus the tail of the same list.

    BUILD = load → prune → export → lint → prepare → analyze → reference → golden → record → release →
            precision → compile → engine → measure → parity → loop → placement → accuracy → estimate →
            bottlenecks → verdicts → report → write
    CHECK = open → golden → engine → … → write        (golden read back, then the tail of BUILD from the engine on)

What runs the torch module comes before `release`, which lets it go: the steps after it work from ONNX files.

A new step (a kernel substitution) is a module under steps/ and an entry here; the
commands only choose a list and hand it a state.
"""

from __future__ import annotations

from pathlib import Path

from tapeout.builds import reader
from tapeout.builds.staging import StagedBuild
from tapeout.core.config import validate
from tapeout.core.console import UI
from tapeout.core.files import output_file, writable_dir
from tapeout.core.profile_schema import CheckSettings
from tapeout.records.report import Report
from tapeout.steps.accuracy import Accuracy
from tapeout.steps.analyze import Analyze
from tapeout.steps.assemble import Assemble
from tapeout.steps.bottlenecks import Bottlenecks
from tapeout.steps.compile import Compile
from tapeout.steps.engine import Engine
from tapeout.steps.estimate import Estimate
from tapeout.steps.export import Export, ExportShare
from tapeout.steps.golden import MakeGolden
from tapeout.steps.lint import Lint
from tapeout.steps.load import Load
from tapeout.steps.loop import Loop
from tapeout.steps.measure import Measure
from tapeout.steps.open import Open
from tapeout.steps.parity import Parity
from tapeout.steps.placement import Placement
from tapeout.steps.precision import Precision
from tapeout.steps.prepare import Prepare
from tapeout.steps.prune import Prune
from tapeout.steps.record import Record
from tapeout.steps.reference import Reference
from tapeout.steps.release import Release
from tapeout.steps.setup import Setup, for_build, for_check
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step, run
from tapeout.steps.verdicts import Verdicts
from tapeout.steps.write import Write

BUILD: tuple[Step, ...] = (
    Load(),
    Prune(),
    Export(),
    Lint(),
    Prepare(),
    Analyze(),
    Reference(),
    MakeGolden(),
    Record(),
    Release(),
    Precision(),
    Compile(),
    Engine(),
    Measure(),
    Parity(),
    Loop(),
    Placement(),
    Accuracy(),
    Estimate(),
    Bottlenecks(),
    Verdicts(),
    Assemble(),
    Write(),
)
TAIL = BUILD[next(i for i, step in enumerate(BUILD) if isinstance(step, Engine)) :]
CHECK: tuple[Step, ...] = (Open(), MakeGolden(), *TAIL)
EXPORT: tuple[Step, ...] = (Load(), Prune(), Export())  # `tapeout export`, `tapeout analyze`
LINT: tuple[Step, ...] = (Load(), Export(), Lint())  # `tapeout lint`: the unpruned model, every finding

CHECK_OUTPUTS = ("check.json", "check.md", "check.html", reader.CHECK_MANIFEST)


def build(
    project_dir: Path | str,
    profile_name: str,
    out: Path | None,
    ui: UI,
    strict: bool = False,
    shared: ExportShare | None = None,
) -> Report:
    """`tapeout build`: every step into a staging dir that becomes the build dir only when complete."""
    setup = for_build(project_dir, profile_name, ui)
    out = Path(out) if out else setup.project.root / "build" / setup.profile.name
    with StagedBuild(out, log=ui.note) as stage:
        state = BuildState(setup, "build", stage, str(out), setup.profile.check, strict, shared=shared)
        run(BUILD, state)
    return state.report


def check(
    build_dir: Path | str, ui: UI, strict: bool = False, iterations: int | None = None, repeats: int | None = None
) -> Report:
    """`tapeout check`: open the build dir through the verified reader, run the tail of the build's steps on this
    device, write check.json (and its record) into the build dir."""
    opened = reader.open_build(build_dir)
    setup = for_check(opened, ui)
    writable_dir(
        opened.directory,
        "build dir",
        fix="check writes check.json and check.md into it: copy the build dir somewhere writable and check that copy",
    )
    for name in CHECK_OUTPUTS:  # before the work: a check.json that is a directory costs no measurement
        output_file(opened.directory / name, name)
    settings = setup.profile.check
    if iterations or repeats:  # validated like the profile's own values, never copied in unchecked
        override = {k: v for k, v in {"iterations": iterations, "repeats": repeats}.items() if v}
        settings = validate(CheckSettings, {**settings.model_dump(), **override}, Path("command line"), "--")
    state = BuildState(setup, "check", opened.directory, str(opened.directory), settings, strict, opened=opened)
    run(CHECK, state)
    return state.report


def export(setup: Setup, out: Path, steps: tuple[Step, ...] = EXPORT, collect_lint: bool = False) -> BuildState:
    """The head of the build (load, prune, export; or `steps`) into `out`: what export, lint and analyze run."""
    state = BuildState(setup, "build", out, str(out), setup.profile.check, collect_lint=collect_lint)
    return run(steps, state)
