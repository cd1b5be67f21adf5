"""Step `compile`: the target compiles the model it asks for — the ONNX file (the default), or the torch.export
program — into the artifact; on a device-compiled target, everything but the engine. The target-stage graph passes
its capabilities name (rewrites into its runtime's own fused ops) run on the ONNX model first; the report's
`passes` section lists what each did."""

from __future__ import annotations

import functools
import shutil
from dataclasses import replace
from pathlib import Path

from tapeout.core import pt2
from tapeout.core.hashing import tree_hashes, tree_size
from tapeout.records.report import ArtifactInfo
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step
from tapeout.targets.base import PROFILING_DIR, Target


class Compile(Step):
    name = "compile"
    needs = ("model", "exported", "compiled", "companions")
    adds = ("artifact", "artifact_info")

    def run(self, state: BuildState) -> None:
        setup = state.setup
        caps, project = setup.capabilities, setup.project
        on_device = " (all but the engine: it is compiled on the device)" if caps.compile_on == "device" else ""
        with state.ui.step(f"compile for {setup.profile.target}{on_device}"):
            if caps.compiles_from == "torch.export":

                @functools.cache
                def program():  # the quantized program where the precision step wrote one (PT2E), else the exported
                    return pt2.load(state.model) if state.model.suffix == ".pt2" else state.exported.program

                if state.compiled is not None:  # the precision step compiled the program it kept: not twice
                    shutil.move(state.compiled.directory, state.out / "artifact")
                    artifact = replace(state.compiled, directory=state.out / "artifact")
                else:
                    artifact = setup.target.compile_program(
                        program(),
                        state.out / "artifact",
                        project.inputs,
                        project.dims,
                        state.exported.info["output_names"],
                    )
                if (
                    type(setup.target).instrument is not Target.instrument
                ):  # loaded again only for a target that uses it
                    artifact = setup.target.instrument(program(), artifact)
            else:
                model = self._target_passes(state, caps.graph_passes)
                try:
                    artifact = setup.target.compile(model, state.out / "artifact", project.inputs, project.dims)
                finally:
                    if model != state.model:
                        shutil.rmtree(model.parent, ignore_errors=True)
        for name, path in (state.companions or {}).items():  # a speech model's encoder: beside the main graph
            with state.ui.step(f"compile the {name} graph for {setup.profile.target}"):
                companion = next(c for c in state.workload.companions(state) if c.name == name)
                part = setup.target.compile(path, artifact.directory / name, companion.inputs, companion.dims)
            artifact.meta[f"{name}_file"] = f"{name}/{part.main_file}"
        files = tree_hashes(artifact.directory)  # hashed once: the report and the manifest share them
        state.artifact = artifact
        # what the op profile alone loads is hashed with the artifact but not deployed: not in its size
        profiling = artifact.directory / PROFILING_DIR
        size = tree_size(artifact.directory) - (tree_size(profiling) if profiling.is_dir() else 0)
        state.artifact_info = ArtifactInfo(
            main_file=artifact.main_file, bytes=size, sha256=files[artifact.main_file], files=files, meta=artifact.meta
        )

    @staticmethod
    def _target_passes(state: BuildState, names: tuple[str, ...]) -> Path:
        """The model with the target's passes applied (in a folder of its own, removed after the compile), or the
        model as it is where none applied."""
        if not names:
            return state.model
        import onnx

        from tapeout.quantize import passes
        from tapeout.quantize.passes.base import not_run, run_on_proto

        project = state.setup.project
        made = [passes.get(name)(project.inputs, project.dims) for name in names]
        ready = [p for p in made if p.precondition(None) is None]  # a target pass decides from the project
        state.passes += [not_run(p, p.precondition(None)) for p in made if p not in ready]
        if not ready:
            return state.model
        model, records = run_on_proto(onnx.load(str(state.model)), ready)
        state.passes += records
        if not any(r["outcome"] == "applied" for r in records):
            return state.model
        out = state.out / "target-passes" / state.model.name
        out.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(out), save_as_external_data=True, location=out.name + ".data")
        return out

    def report(self, state: BuildState) -> dict[str, object]:
        return {"artifact": state.artifact_info}
