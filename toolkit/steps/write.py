"""Step `write`: the reports and the records that vouch for them. A build writes structure.json, report.json,
report.md and report.html into its staging dir, and manifest.json last (a directory without one is not a
build); a check writes check.json, .md and .html into the build dir, and check-manifest.json last."""

from __future__ import annotations

from pathlib import Path

from tapeout.builds.reader import CHECK_MANIFEST
from tapeout.builds.staging import MANIFEST
from tapeout.core.files import write_json, write_text
from tapeout.core.hashing import sha256_file, tree_hashes
from tapeout.core.host import package_versions
from tapeout.estimation import cost_units, generation
from tapeout.records.manifest import CHECK_SCHEMA, SCHEMA
from tapeout.records.report import Report
from tapeout.reports import html_page
from tapeout.reports.markdown import render_markdown
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step

STRUCTURE = "structure.json"


def write_reports(folder: Path, stem: str, report: Report) -> None:
    write_json(folder / f"{stem}.json", report.to_json())
    write_text(folder / f"{stem}.md", render_markdown(report))
    write_text(folder / f"{stem}.html", html_page.render(report))


def write_check(build_dir: Path, report: Report) -> None:
    """check.json, .md and .html, then check-manifest.json with check.json's hash: the reader verifies the check
    against it. The old record goes first, so a check cut short leaves no record that vouches for it."""
    (build_dir / CHECK_MANIFEST).unlink(missing_ok=True)
    write_reports(build_dir, "check", report)
    write_json(
        build_dir / CHECK_MANIFEST,
        {
            "schema": CHECK_SCHEMA,
            "created": report.created,
            "report": {"file": "check.json", "sha256": sha256_file(build_dir / "check.json")},
            "build_manifest_sha256": sha256_file(build_dir / MANIFEST),
        },
    )


class Write(Step):
    name = "write"
    needs = ("report",)
    needs_at_build = ("kernels", "phases", "golden", "quantization", "loop")

    def run(self, state: BuildState) -> None:
        if state.kind == "check":
            write_check(state.out, state.report)
            return
        structure = cost_units.to_record(state.kernels, generation.to_records(state.phases or []))
        write_json(state.out / STRUCTURE, structure.model_dump(mode="json", by_alias=True))
        write_reports(state.out, "report", state.report)
        write_json(state.out / MANIFEST, manifest(state))


def manifest(state: BuildState) -> dict:
    """The build's lockfile: hashes of what went in and what came out, versions, the profile as resolved, host."""
    setup, report, stage = state.setup, state.report, state.out
    project, profile = setup.project, setup.profile
    data = report.to_json()
    return {
        "schema": SCHEMA,
        "created": report.created,
        "project": {
            "name": project.display_name,
            "file": str(project.file),
            "file_sha256": sha256_file(project.file),
            "source": project.model.source,
            "inputs": [s.model_dump() for s in project.inputs],
            "dims": project.dims,
        },
        "model": {**data["model"], "export": data["export"], "export_sha256": tree_hashes(stage / "export")},
        "calibration": {
            "source": report.golden.source,
            "sha256": sha256_file(project.root / project.calibration.data)
            if project.calibration and project.calibration.data.endswith(".npz")
            else None,
        },
        "artifact": {
            "target": profile.target,
            "main_file": report.artifact.main_file,
            "meta": data["artifact"]["meta"],
            "files": report.artifact.files,
            "bytes": report.artifact.bytes,
        },
        "golden": {"file": "golden.npz", "sha256": sha256_file(state.golden.path), "samples": report.golden.samples},
        # check carries verdicts over from report.json: its hash makes them part of what is verified
        "report": {"file": "report.json", "sha256": sha256_file(stage / "report.json")},
        "structure": {"file": STRUCTURE, "sha256": sha256_file(stage / STRUCTURE)},
        "workload": state.workload.manifest_record(state),
        "profile": profile.model_dump(mode="json"),
        "device_spec": setup.device.model_dump(mode="json") if setup.device else None,
        "quantization": None
        if report.quantization is None
        else {"model_sha256": data["quantization"]["model_sha256"], "plan": data["quantization"]["plan"]},
        "options_resolved": setup.target.options.model_dump(mode="json"),
        "budgets": profile.budgets.model_dump(mode="json", exclude_none=True),
        "versions": package_versions(),
        "host": data["host"],
        "seeds": {"project": project.seed},
    }
