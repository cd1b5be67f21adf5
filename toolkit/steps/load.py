"""Step `load`: the project's model source, loaded (a torch module, or an ONNX file taken as given)."""

from __future__ import annotations

from tapeout.core.errors import BadInput
from tapeout.core.hashing import sha256_file
from tapeout.records.report import ModelInfo, ProjectInfo
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


def require_torch(source: str, loaded) -> None:
    """[pruning] works on the torch module: an ONNX source has none."""
    if loaded.kind != "torch":
        raise BadInput(
            f'[pruning] needs a torch model, and [model] source = "{source}" is ONNX',
            fix="point [model] source at the torch module (file.py:callable, a Hugging Face directory "
            "or a .pt2), or remove [pruning] from the profile",
        )


class Load(Step):
    name = "load"
    adds = ("loaded",)

    def run(self, state: BuildState) -> None:
        from tapeout.exporters import sources

        project = state.setup.project
        with state.ui.step(f"load model ({project.model.source})"):
            loaded = sources.load(
                project.model.source, project.root, [s.name for s in project.inputs], project.model.outputs
            )
        for note in loaded.notes:
            state.ui.note(note)
        if state.setup.profile.pruning is not None:
            require_torch(project.model.source, loaded)
        state.loaded = state.workload.load(state, loaded)

    def report(self, state: BuildState) -> dict[str, object]:
        project, loaded = state.setup.project, state.loaded
        return {
            "project": ProjectInfo(name=project.display_name, source=project.model.source, file=str(project.file)),
            "model": ModelInfo(
                kind=loaded.kind,
                description=loaded.description,
                weights_sha256=loaded.weights_sha256 or sha256_file(loaded.onnx_path),
                files={str(f.name): sha256_file(f) for f in loaded.files},
            ),
        }
