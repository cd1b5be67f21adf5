"""Step `open`, a check's first: the build dir's artifact and report verified against the manifest (the golden
file, at the golden step), and what the tail of the build's steps needs from it: the artifact, the precision
plan, and the kernel structure (structure.json; a build dir from before it, analysed again from its verified
export)."""

from __future__ import annotations

from tapeout.core.artifact import Artifact
from tapeout.core.hashing import tree_size
from tapeout.estimation.build_structure import kernels_of, phases_of
from tapeout.records.report import ArtifactInfo, ProjectInfo
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


class Open(Step):
    name = "open"
    adds = ("artifact", "artifact_info", "quantization", "kernels", "phases")

    def run(self, state: BuildState) -> None:
        build = state.opened
        man = build.manifest
        folder = build.artifact()  # every file verified
        build.golden()  # verified up front: a bad golden file costs no engine build, no measurement
        built = build.report
        state.artifact = Artifact(
            man.artifact.target, folder, man.artifact.main_file, meta=dict(man.artifact.meta or {})
        )
        state.artifact_info = ArtifactInfo(
            main_file=man.artifact.main_file,
            bytes=tree_size(folder),
            sha256=man.artifact.files[man.artifact.main_file],
            files=None,
            meta=None,
        )
        state.quantization = (
            built.quantization.model_dump(mode="json", exclude_unset=True) if built.quantization else None
        )
        state.kernels = kernels_of(build)  # None for build dirs from before the estimator (no export/)
        state.phases = phases_of(build)

    def report(self, state: BuildState) -> dict[str, object]:
        project = state.opened.manifest.project
        return {
            "project": ProjectInfo(name=project.name, source=project.source, file=project.file),
            "artifact": state.artifact_info,
        }
