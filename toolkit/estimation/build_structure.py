"""A build's kernel structure as an estimate reads it: structure.json (computed once at build, verified by the
manifest), or its verified export analysed again where the record predates the shapes the predictors read
(kernel_shape.py: a kernel's `function`, a MatMul's m, k, n, a cell's sizes, a conv's width, a movement kernel's
run), so a build made before a feature was kept is priced with it, not left to the calibration."""

from __future__ import annotations

from pathlib import Path

from tapeout.builds.reader import BuildDir
from tapeout.core.schemas import InputSpec
from tapeout.estimation import cost_units as kern
from tapeout.estimation import generation
from tapeout.graph.analyze import analyze_view
from tapeout.graph.view import GraphView


def model_kernels(model_path: Path, inputs: list[InputSpec], dims: dict[str, int]) -> list[kern.Kernel]:
    """The model's kernels as exported (`cost_units.structure`): the graph is loaded, read, and let go."""
    view = GraphView.load(model_path, inputs, dims)
    return kern.structure(view, analyze_view(view))


def dated(kernels: list[kern.Kernel]) -> bool:
    """Whether kernels were kept before a shape their class's predictor reads was (a record from an older tapeout)."""
    def lacks(k: kern.Kernel) -> bool:
        shape = dict(k.shape)
        return ((k.cls in kern.FUNCTION_CLASSES and "function" not in shape)
                or (k.cls in ("matmul", "recurrent") and not {"m", "hidden"} & set(shape))
                or (k.cls == "conv" and "positions" in shape and "width" not in shape)
                or (k.cls == "movement" and bool(k.bytes) and "run" not in shape))
    return any(lacks(k) for k in kernels)


def kernels_of(build: BuildDir) -> list[kern.Kernel] | None:
    """The build's kernel structure at FP32: structure.json, or for a build dir from before it or whose record is
    `dated`, the verified export analysed again at the build's dims; None where it has neither."""
    structure = build.structure()
    exported = (build.directory / "export" / "model.onnx").is_file()
    if structure is not None:
        kernels = kern.from_record(structure)
        if not dated(kernels) or not exported:
            return kernels
    if not exported:
        return None
    man = build.manifest
    return model_kernels(build.exported_model(), man.project.inputs, man.project.dims)


def phases_of(build: BuildDir, kernels: list[kern.Kernel] | None) -> list[generation.Phase] | None:
    """A generate build's phases (prefill per prompt length, decode steps) as structure.json keeps them, or where
    they are `dated`, its verified export read again at each phase's shapes (`kernels`: the build's own, the decode
    step at max_context); None for a build that keeps none."""
    phases = generation.from_record(build.structure())
    workload = build.workload_settings()
    if not phases or not any(dated(p.kernels) for p in phases) or kernels is None or workload is None or \
            not (build.directory / "export" / "model.onnx").is_file():
        return phases
    man = build.manifest
    return generation.structures(build.exported_model(), man.project.inputs, man.project.dims, workload, kernels)
