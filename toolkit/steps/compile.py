"""Step `compile`: the target compiles the model it asks for — the ONNX file (the default), or the torch.export
program — into the artifact; on a device-compiled target, everything but the engine."""

from __future__ import annotations

from tapeout.core.hashing import tree_hashes, tree_size
from tapeout.records.report import ArtifactInfo
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


class Compile(Step):
    name = "compile"
    needs = ("model", "exported")
    adds = ("artifact", "artifact_info")

    def run(self, state: BuildState) -> None:
        setup = state.setup
        caps, project = setup.capabilities, setup.project
        on_device = " (all but the engine: it is compiled on the device)" if caps.compile_on == "device" else ""
        with state.ui.step(f"compile for {setup.profile.target}{on_device}"):
            if caps.compiles_from == "torch.export":
                artifact = setup.target.compile_program(state.exported.program, state.out / "artifact",
                                                        project.inputs, project.dims, state.exported.info["output_names"])
            else:
                artifact = setup.target.compile(state.model, state.out / "artifact", project.inputs, project.dims)
        files = tree_hashes(artifact.directory)  # hashed once: the report and the manifest share them
        state.artifact = artifact
        state.artifact_info = ArtifactInfo(main_file=artifact.main_file, bytes=tree_size(artifact.directory),
                                           sha256=files[artifact.main_file], files=files, meta=artifact.meta)

    def report(self, state: BuildState) -> dict[str, object]:
        return {"artifact": state.artifact_info}
