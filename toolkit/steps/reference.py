"""Step `reference`: the project's metric on the FP32 reference (the unpruned teacher where the model was
pruned), and on the pruned FP32 model: the most any precision can reach. A generate workload's reference is the
torch decoder's plain forward over each whole sequence, the model as trained; its artifact's goes through the cache.

The FP32 reference metric of an unpruned model is determined by the exported model and the project's files, and
it can take seconds (a language model's perplexity over many windows): within one process
(`build -p A -p B`, several builds of one project from Python) it is computed once per export and project state.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tapeout.core.hashing import sha256_file
from tapeout.core.metric import evaluate
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step

_MEMO: dict[str, float] = {}  # this process's FP32 reference metrics, by `_inputs_key`
_SKIPPED_DIRS = {"build", "__pycache__"}  # the default build dirs and bytecode: outputs, not what the metric reads


class Reference(Step):
    name = "reference"
    needs = ("loaded", "exported", "teacher", "pruning")
    adds = ("reference_metric",)

    def run(self, state: BuildState) -> str | None:
        project, profile = state.setup.project, state.setup.profile
        if project.evaluation is None:
            state.reference_metric = None
            return "the project has no [evaluation] metric"
        key = _inputs_key(state) if state.pruning is None else None  # a pruned model's teacher is this run's own
        if key in _MEMO:
            state.reference_metric = _MEMO[key]
            state.ui.note(
                f"{project.evaluation.name} on the FP32 reference: {state.reference_metric:.6g}, as this "
                "process computed it for the same export and project files"
            )
        else:
            with state.ui.step(
                f"evaluate {project.evaluation.name} on the FP32 reference{state.workload.reference_how(state)}"
            ):
                state.reference_metric = _reference_metric(state)
            if key is not None:
                _MEMO[key] = state.reference_metric
        if state.pruning is not None and profile.precision != "fp32":  # at fp32 the artifact's own evaluation says it
            with state.ui.step(f"evaluate {project.evaluation.name} on the pruned FP32 model"):
                state.pruning["metric_fp32"] = evaluate(project, state.exported.reference)
        return None


def _reference_metric(state: BuildState) -> float:
    own = state.workload.reference_metric(state)  # a decoder's: its plain forward over whole sequences
    if own is not None:
        return own
    return evaluate(state.setup.project, state.teacher or state.exported.reference)


def _inputs_key(state: BuildState) -> str:
    """What the reference metric is a function of: the exported model's bytes (the weights, wherever the source
    keeps them), the project's settings, and every file of the project's folder by path, size and modification
    time (the metric's code and data; build outputs left out)."""
    project = state.setup.project
    digest = hashlib.sha256(project.model_dump_json().encode())
    export = Path(state.exported.path).parent
    for path in sorted(export.rglob("*")):
        if path.is_file():
            digest.update(f"{path.relative_to(export)}:{sha256_file(path)}".encode())
    root, out = Path(project.root).resolve(), Path(state.out).resolve()
    stat = Path(project.file).stat()
    digest.update(f"{root}|{Path(project.file).resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS and not d.startswith(".") and here / d != out)
        for name in sorted(files):
            stat = (here / name).stat()
            digest.update(f"{(here / name).relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()
