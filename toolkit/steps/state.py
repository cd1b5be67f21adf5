"""The one typed state a build's steps work on, and a check's tail of the same steps.

Every field a step adds starts as PENDING. A step declares the fields it needs (each added by an earlier step,
or by the opening of a check) and the fields it adds; the runner (`steps.step.run`) refuses a step whose needs
are pending and a step that did not add what it declared. A field a step adds may be None: "no estimate
here" is an answer, "not estimated yet" is PENDING.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tapeout.core import workload as workloads

if TYPE_CHECKING:  # annotations only: a step imports what it runs
    from tapeout.builds.reader import BuildDir
    from tapeout.core.artifact import Artifact
    from tapeout.core.feeds import Feeds
    from tapeout.core.metric import Predict
    from tapeout.core.parity import OutputParity
    from tapeout.core.profile_schema import CheckSettings
    from tapeout.core.verdict import BudgetResult
    from tapeout.core.workload import Workload
    from tapeout.estimation.cost_units import Kernel
    from tapeout.estimation.estimate import Estimate
    from tapeout.estimation.generation import Phase
    from tapeout.exporters.sources import LoadedModel
    from tapeout.graph.analysis import Analysis
    from tapeout.measurement.measure import Measurement
    from tapeout.records.passes import PassRecord
    from tapeout.records.report import AccuracyInfo, ArtifactInfo, Report
    from tapeout.steps.setup import Setup
    from tapeout.targets.base import EngineBuild, LintIssue


class _Pending:
    """Not yet added by any step."""

    def __repr__(self) -> str:
        return "PENDING"

    def __bool__(self) -> bool:
        return False


PENDING: Any = _Pending()


@dataclass
class Exported:
    """The FP32 ONNX model the target's side starts from, and what produces the reference outputs."""

    path: Path
    info: dict  # the report's `export` section
    reference: Predict | None  # the FP32 reference: torch, the pruned torch module, or ORT on an ONNX source
    lint: list[LintIssue] | None = None  # an ONNX source is linted before it is copied: its findings
    program: Any = None  # the torch.export ExportedProgram, where the target compiles from it
    passes: list[dict] = field(default_factory=list)  # the export stage's graph passes: what each did
    # a generate workload's torch greedy tokens on its golden prompts, made while verifying the cache graph
    greedy_tokens: Any = None


@dataclass
class Golden:
    """The golden inputs and reference outputs: computed by a build, read back (verified) by a check."""

    path: Path
    inputs: list[Feeds]
    outputs: list[dict]
    source: str  # where the inputs came from
    reference: str  # what produced the outputs


@dataclass
class StepRun:
    """One step of this run: how long it took, or why it did not run."""

    name: str
    seconds: float = 0.0
    skipped: str = ""
    peak_rss_mb: float = (
        0.0  # the process's high-water mark when the step ended: the step that raised it holds the peak
    )


@dataclass
class BuildState:
    setup: Setup
    kind: Literal["build", "check"]
    out: Path  # where this run writes: the staging dir (build) or the build dir (check)
    build_dir: str  # the build dir's place, as the report names it
    settings: CheckSettings  # timing settings: the profile's, or the check's overrides
    strict: bool = False
    opened: BuildDir | None = None  # check: the build dir, opened by the verified reader
    shared: Any = None  # build -p A -p B: the export shared between the candidates (steps.export)
    collect_lint: bool = False  # `tapeout lint`: gather every finding instead of stopping at the first

    loaded: LoadedModel = PENDING
    pruning: dict | None = PENDING  # what [pruning] did; None without it
    teacher: Predict | None = PENDING  # the FP32 model before pruning: the accuracy reference when pruned
    exported: Exported = PENDING
    lint: list[LintIssue] = PENDING
    fp32_model: Path = PENDING  # the prepared FP32 model: what the precision step starts from
    analysis: Analysis = PENDING
    kernels: list[Kernel] = PENDING  # the estimator's cost units at FP32, from the analysis
    phases: list[Phase] | None = PENDING  # a generate workload's calls at their own shapes; None otherwise
    reference_metric: float | None = PENDING
    quantization: dict | None = PENDING  # the precision step's record; None at fp32
    model: Path = PENDING  # the model the target compiles
    compiled: Artifact | None = PENDING  # `model` already compiled by the precision step (a program's kept candidate)
    companions: dict[str, Path] = PENDING  # the workload's companion graphs as the target compiles them (by name)
    artifact: Artifact = PENDING
    artifact_info: ArtifactInfo = PENDING  # its size and hashes, taken once
    engine: EngineBuild | None = PENDING
    golden: Golden = PENDING
    workload_file: Path | None = PENDING  # a loop's workload.npz, written by the record step; None for forward
    measurement: Measurement = PENDING
    parity: list[OutputParity] = PENDING
    loop: Any = PENDING  # the workload's loop measured (GenerationMeasurement, StreamMeasurement, …); None: no loop
    placement: dict | None = PENDING
    accuracy: AccuracyInfo | None = PENDING
    estimate: Estimate | None = PENDING
    bottlenecks: dict | None = PENDING
    budgets: list[BudgetResult] = PENDING
    report: Report = PENDING

    passes: list[PassRecord] = field(default_factory=list)  # graph passes applied and skipped, with reasons
    flow: tuple = ()  # the steps of this run, in order
    ran: list[StepRun] = field(default_factory=list)

    @property
    def ui(self):
        return self.setup.ui

    @property
    def workload(self) -> Workload:
        """The workload this run measures: the project's (a build), the one the build dir records (a check)."""
        if self.opened is not None:
            return workloads.of_settings(self.opened.workload_settings())
        return workloads.of(self.setup.project)
