"""The build's lockfile: what went in (hashes, versions, profile, seeds) and where it was built.

The records are what `check` and the reader take from manifest.json, validated before any of it is used.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tapeout.core.schemas import InputSpec

SCHEMA = "tapeout.manifest/2"


class _Recorded(BaseModel):
    model_config = ConfigDict(extra="allow")  # a manifest records more than `check` reads


class ArtifactRecord(_Recorded):
    target: str
    main_file: str
    files: dict[str, str] = Field(min_length=1, description="every artifact file and its sha256")
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _main_file_is_hashed(self) -> ArtifactRecord:
        if self.main_file not in self.files:
            raise ValueError(f"main_file {self.main_file!r} is not among the hashed files")
        return self


class FileRecord(_Recorded):
    file: str
    sha256: str


class ProjectRecord(_Recorded):
    name: str
    source: str
    file: str
    # the shapes the build was made at: the estimate in `check` re-derives the model's kernels from them
    inputs: list[InputSpec] = Field(default_factory=list)
    dims: dict[str, int] = Field(default_factory=dict)


class HostRecord(_Recorded):
    """The build machine, as far as `check` compares it with its own."""

    cpu: str | None = None
    cpu_flags: list[str] = Field(default_factory=list)


class ModelRecord(_Recorded):
    """The source model and its export; `export_sha256` hashes every file of export/."""

    export_sha256: dict[str, str] = Field(default_factory=dict)


class WorkloadRecord(_Recorded):
    """A generate or stream workload: its settings, the cache layout of a generate graph (None for a stream), and
    workload.npz (the prompts and reference tokens, or the golden stream and the reference's outputs)."""

    settings: dict[str, Any]
    layout: dict[str, Any] | None = None
    file: str
    sha256: str


class ManifestRecord(_Recorded):
    """What `check` reads from manifest.json, validated before any of it is used."""

    artifact: ArtifactRecord
    golden: FileRecord
    report: FileRecord
    project: ProjectRecord
    model: ModelRecord = ModelRecord()
    structure: FileRecord | None = None  # structure.json (builds before it: the kernels come from the export)
    workload: WorkloadRecord | None = None  # a generate workload (forward builds: none)
    profile: dict[str, Any]
    device_spec: dict[str, Any] | None = None
    host: HostRecord = HostRecord()


CHECK_SCHEMA = "tapeout.check-manifest/1"


class CheckManifestRecord(_Recorded):
    """check-manifest.json, written by `tapeout check` after its reports: the hash of check.json, and of the
    build manifest it checked (a check of another build of the same name is not this build's)."""

    report: FileRecord
    build_manifest_sha256: str
