"""A build's kernel structure as an estimate reads it: structure.json (computed once at build, verified by the
manifest), or for a build dir without one, its verified export analysed again."""

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


def kernels_of(build: BuildDir) -> list[kern.Kernel] | None:
    """The build's kernel structure at FP32: structure.json, else the verified export analysed again at the build's
    dims; None where it has neither. A check on the device never loads the model to read it."""
    structure = build.structure()
    if structure is not None:
        return kern.from_record(structure)
    if not (build.directory / "export" / "model.onnx").is_file():
        return None
    man = build.manifest
    return model_kernels(build.exported_model(), man.project.inputs, man.project.dims)


def phases_of(build: BuildDir) -> list[generation.Phase] | None:
    """A generate build's phases (prefill per prompt length, decode steps) as structure.json keeps them; None for a
    build that keeps none."""
    return generation.from_record(build.structure())
