"""A build's kernel structure as an estimate reads it: structure.json (computed once at build, verified by the
manifest), or its verified export analysed again where the record predates the shapes the predictors read
(kernel_shape.py: a kernel's `function`, a MatMul's m, k, n, a cell's sizes, a conv's width, a movement kernel's
run, a Softmax's masked share from its golden input), so a build made before a feature was kept is priced with it,
not left to the calibration."""

from __future__ import annotations

from pathlib import Path

from tapeout.builds.reader import BuildDir
from tapeout.core.decoding import graph_layout
from tapeout.core.schemas import InputSpec
from tapeout.estimation import cost_units as kern
from tapeout.estimation import generation, kernel_shape, softmax_masks
from tapeout.graph.analyze import analyze_view
from tapeout.graph.view import GraphView
from tapeout.records.structure import StructureRecord


def model_kernels(model_path: Path, inputs: list[InputSpec], dims: dict[str, int]) -> list[kern.Kernel]:
    """The model's kernels as exported (`cost_units.structure`): the graph is loaded, read, and let go."""
    view = GraphView.load(model_path, inputs, dims)
    return kern.structure(view, analyze_view(view))


def dated(structure: StructureRecord) -> bool:
    """Whether the record keeps an earlier version of the kernel shapes than this tapeout reads (kernel_shape.VERSION):
    one written before a shape its class's predictor reads was kept."""
    return structure.shapes < kernel_shape.VERSION


def kernels_of(build: BuildDir) -> list[kern.Kernel] | None:
    """The build's kernel structure at FP32: structure.json, or for a build dir from before it or whose record is
    `dated`, the verified export analysed again at the build's dims; None where it has neither. A current record is
    taken as it is, so a check on the device never loads the model to read it."""
    structure = build.structure()
    exported = (build.directory / "export" / "model.onnx").is_file()
    if structure is not None and (not dated(structure) or not exported):
        return kern.from_record(structure)
    if not exported:
        return None
    man = build.manifest
    kernels = model_kernels(build.exported_model(), man.project.inputs, man.project.dims)
    return softmax_masks.with_masks(kernels, _masked_percents(build))


def _masked_percents(build: BuildDir) -> dict[str, float] | None:
    """Each Softmax's masked percent on the build's first golden input (verified), as its build step reads it; {}
    where the build keeps no golden file, None where its export cannot be run on it."""
    from tapeout.core.errors import TapeoutError
    from tapeout.records.golden import load_golden

    if build.manifest.golden is None:
        return {}
    try:
        inputs, _ = load_golden(build.golden())
    except (TapeoutError, OSError, ValueError):
        return {}
    return softmax_masks.measured(build.exported_model(), inputs[0]) if inputs else {}


def phases_of(build: BuildDir, kernels: list[kern.Kernel] | None) -> list[generation.Phase] | None:
    """A generate build's phases (prefill per prompt length, decode steps) as structure.json keeps them, or where
    they are `dated`, its verified export read again at each phase's shapes, its Softmaxes' masked shares with them
    (`kernels`: the build's own, the decode step at max_context); None for a build that keeps none."""
    structure = build.structure()
    phases = generation.from_record(structure)
    workload = build.workload_settings()
    if not phases or not dated(structure) or kernels is None or workload is None or \
            not (build.directory / "export" / "model.onnx").is_file():
        return phases
    man = build.manifest
    phases = generation.structures(build.exported_model(), man.project.inputs, man.project.dims, workload, kernels)
    return softmax_masks.masked_phases(build.exported_model(), phases, graph_layout(man.project.inputs, workload),
                                       kernels)
