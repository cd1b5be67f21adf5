"""The one reader of build dirs. A build dir is a folder from elsewhere: its manifest is validated, every
file a command uses is checked against the hash the manifest recorded (check.json against the one
check-manifest.json recorded), and every path in it stays inside it. A bad or edited file is one BadInput
line (exit 2), never a figure shown to anyone.

`check`, `compare`, `diff`, `report`, `estimate`, `calibrate` and the choice among profiles read build
dirs through `open_build` and nothing else.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from tapeout.builds.staging import MANIFEST
from tapeout.core import workload as workloads
from tapeout.core.config import validate
from tapeout.core.errors import BadInput, first_line
from tapeout.core.hashing import sha256_file
from tapeout.core.paths import confined, external_data_files, resolved
from tapeout.core.profile_schema import Profile
from tapeout.core.schemas import DeviceSpec, WorkloadSettings
from tapeout.records.manifest import CHECK_SCHEMA, SCHEMA, CheckManifestRecord, ManifestRecord
from tapeout.records.report import Report, load
from tapeout.records.structure import SCHEMA as STRUCTURE_SCHEMA
from tapeout.records.structure import StructureRecord

MAX_MANIFEST_BYTES = 16 << 20  # a manifest lists files and hashes: kilobytes, never this
CHECK_MANIFEST = "check-manifest.json"
_RESTORE = "restore the build dir as built, or rebuild"


def _json_file(path: Path, schema: str, what: str, fix: str) -> dict:
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise BadInput(f"{path} is {path.stat().st_size:,} bytes, not a {what}", fix=fix)
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise BadInput(
            f"{path} is not valid JSON ({first_line(exc)})", fix=f"{fix}; a {what} is never edited by hand"
        ) from None
    if not isinstance(data, dict) or data.get("schema") != schema:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise BadInput(
            f"{path}: schema {found!r} is not {schema!r}",
            fix="read it with the tapeout version that wrote it, or " + fix,
        )
    return data


def read_manifest(build_dir: Path) -> ManifestRecord:
    if not build_dir.is_dir():
        raise BadInput(f"build dir {build_dir} not found", fix="give the directory `tapeout build` wrote")
    path = build_dir / MANIFEST
    if not path.is_file():
        absent = ", no report.json" if not (build_dir / "report.json").exists() else ""
        raise BadInput(
            f"{build_dir} is not a tapeout build dir (no {MANIFEST}{absent}); an interrupted build leaves none",
            fix="run `tapeout build` again and check the directory it prints",
        )
    return validate(ManifestRecord, _json_file(path, SCHEMA, "manifest", "rebuild"), path)


def verified(build_dir: Path, rel: str, expected: str | None, what: str) -> Path:
    """`build_dir/rel`, confined to the build dir, present, and with the sha256 the manifest recorded."""
    file = confined(build_dir, rel, what)  # a manifest is a file from elsewhere: its paths stay in the build dir
    if not file.is_file():
        raise BadInput(f"{what} {file} is missing", fix="copy the whole build dir to the device, or rebuild")
    if sha256_file(file) != expected:
        raise BadInput(
            f"{what} {file} differs from the one the build recorded (sha256 mismatch): edited after the "
            "build, or from another build",
            fix=_RESTORE,
        )
    return file


class BuildDir:
    """A build dir opened for reading: its manifest validated; each file verified the first time it is asked
    for (a comparison of many builds reads their reports, never hashes their artifacts)."""

    def __init__(self, directory: Path, manifest: ManifestRecord):
        self.directory = directory
        self.manifest = manifest
        self._golden: Path | None = None

    @cached_property
    def profile(self) -> Profile:
        return validate(Profile, self.manifest.profile, self.directory / MANIFEST, prefix="profile.")

    @cached_property
    def device_spec(self) -> DeviceSpec | None:
        spec = self.manifest.device_spec
        return validate(DeviceSpec, spec, self.directory / MANIFEST, "device_spec.") if spec else None

    @cached_property
    def report(self) -> Report:
        """report.json, verified: the build's own figures."""
        rec = self.manifest.report
        return load(verified(self.directory, rec.file, rec.sha256, "build report"))

    @cached_property
    def check_report(self) -> Report | None:
        """check.json, where the build was checked, verified against check-manifest.json (written by the check
        after its reports); None where it was never checked."""
        path = self.directory / "check.json"
        if not path.exists():
            return None
        record_path = self.directory / CHECK_MANIFEST
        if not record_path.is_file():
            raise BadInput(
                f"{path} has no {CHECK_MANIFEST} beside it to verify it against (an interrupted check, or "
                "one by a tapeout before 0.1.0's verified reader)",
                fix="run `tapeout check` on it again, or remove check.json to use the build's own figures",
            )
        record = validate(
            CheckManifestRecord,
            _json_file(record_path, CHECK_SCHEMA, "check manifest", "run `tapeout check` again"),
            record_path,
        )
        if record.build_manifest_sha256 != sha256_file(self.directory / MANIFEST):
            raise BadInput(
                f"{path} is the check of another build (its {CHECK_MANIFEST} names another manifest)",
                fix="run `tapeout check` on this build, or remove check.json",
            )
        return load(verified(self.directory, record.report.file, record.report.sha256, "check report"), "check report")

    def measured(self) -> tuple[Report, Literal["check", "build"]]:
        """The figures measured on the device: the check's where there is one, else the build's."""
        check = self.check_report
        return (check, "check") if check is not None else (self.report, "build")

    def artifact(self) -> Path:
        """The artifact folder, every file in it verified."""
        for rel, expected in self.manifest.artifact.files.items():
            verified(self.directory / "artifact", rel, expected, "artifact file")
        return self.directory / "artifact"

    def golden(self) -> Path:
        """golden.npz, verified the first time it is asked for (a check asks up front, then reads it)."""
        if self._golden is None:
            rec = self.manifest.golden
            self._golden = verified(self.directory, rec.file, rec.sha256, "golden file")
        return self._golden

    def workload(self) -> tuple[WorkloadSettings, Any, Path] | None:
        """A loop's workload: its settings, what its replay needs besides the file (a generate build's cache layout,
        core/workload.Workload.replay) and workload.npz, verified; None for a build that recorded none."""
        settings = self.workload_settings()
        if settings is None:
            return None
        rec = self.manifest.workload
        replay = workloads.get(settings.kind).replay(settings, rec, self.directory / "manifest.json")
        return settings, replay, verified(self.directory, rec.file, rec.sha256, "workload file")

    def workload_settings(self) -> WorkloadSettings | None:
        """The workload's settings alone (what the estimator prices), validated by its kind's schema; None for a
        build that recorded none. The replay data is not read: that is `workload()`, for the commands that replay
        it."""
        rec = self.manifest.workload
        if rec is None:
            return None
        where = self.directory / "manifest.json"
        kind = rec.settings.get("kind")
        known = workloads.kinds()
        if not isinstance(kind, str) or kind not in known:
            raise BadInput(
                f"{where}: workload.settings.kind is {kind!r}, not a workload kind here ({', '.join(known)})",
                fix=_RESTORE,
            )
        return validate(workloads.get(kind).settings, rec.settings, where, "workload.settings.")

    def structure(self) -> StructureRecord | None:
        """structure.json, verified: the kernel structure the build computed; None for a build dir from before it.
        Read once (the kernels and a generate build's phases are both taken from it)."""
        return self._structure

    @cached_property
    def _structure(self) -> StructureRecord | None:
        rec = self.manifest.structure
        if rec is None:
            return None
        path = verified(self.directory, rec.file, rec.sha256, "kernel structure")
        return validate(StructureRecord, _json_file(path, STRUCTURE_SCHEMA, "kernel structure", "rebuild"), path)

    def exported_model(self) -> Path:
        """export/model.onnx, and every external-data file it names, verified (builds before the export was
        hashed: confined only)."""
        hashes = self.manifest.model.export_sha256
        model = confined(self.directory, "export/model.onnx", "exported model")
        if not model.is_file():
            raise BadInput(f"{self.directory} has no export/model.onnx", fix="point at a folder `tapeout build` wrote")
        if hashes:
            verified(self.directory / "export", "model.onnx", hashes.get("model.onnx"), "exported model")
        for location in external_data_files(model):
            data = confined(model.parent, location, "external data of export/model.onnx")
            if hashes:
                verified(
                    self.directory / "export",
                    str(data.relative_to(self.directory / "export")),
                    hashes.get(str(data.relative_to(self.directory / "export"))),
                    "exported model's data",
                )
        return model


def open_build(path: Path | str) -> BuildDir:
    """A build dir, opened: the manifest read and validated. Nothing of the model runs here."""
    directory = resolved(path, "build dir", "give the directory `tapeout build` wrote")
    return BuildDir(directory, read_manifest(directory))


def open_report(path: Path | str) -> tuple[Report, str]:
    """A report named by the user: a build dir (its report.json), or a report.json or check.json inside one,
    read through the build dir's hashes; and where it came from, for the reader."""
    path = Path(path)
    if path.is_dir():
        return open_build(path).report, str(path / "report.json")
    if path.name not in ("report.json", "check.json"):
        raise BadInput(
            f"{path} is not a build dir, report.json or check.json",
            fix="give build dirs, or the report.json / check.json inside one",
        )
    if not path.is_file():
        raise BadInput(f"{path} not found", fix="give build dirs, or report.json / check.json files")
    build = open_build(path.parent)
    report = build.check_report if path.name == "check.json" else build.report
    return report, str(path)
