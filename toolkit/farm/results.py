"""What comes back from the workers, verified and written on the head; the farm's summary, table and page.

A build dir from a worker is unpacked into a staging dir and opened through the one verified reader (manifest,
report, artifact, golden file and check against their hashes), and must be the build of the project and profile the
head sent; only then does it replace the build dir (staging.StagedBuild: whole or not at all).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tapeout import __version__
from tapeout.builds.reader import open_build
from tapeout.builds.staging import StagedBuild
from tapeout.core.errors import BadInput
from tapeout.core.files import write_json
from tapeout.farm.bundle import Bundle, unpack
from tapeout.farm.plan import Job, Plan

SCHEMA = "tapeout.farm/1"
SUMMARY = "farm.json"
PAGE = "farm.html"
_FROM_WORKER = "what the worker sent back"


def inputs_key(job: Job, project: Bundle, check: bool) -> str:
    """What a row's result is a function of: the project's files, the profile as resolved, tapeout's version, the
    device, and whether it is checked. A re-run skips a row whose key has not changed."""
    digest = hashlib.sha256(
        json.dumps(
            {
                "profile": job.profile_data,
                "device": job.device,
                "tapeout": __version__,
                "check": check,
                "file": job.project.file.name,
            },
            sort_keys=True,
            default=str,
        ).encode()
    )
    for rel in sorted(project):
        digest.update(f"{rel}:{hashlib.sha256(project[rel]).hexdigest()}\n".encode())
    return digest.hexdigest()


def build_dir(plan: Plan, job: Job) -> Path:
    return plan.out / job.project.display_name / job.profile


def verify(folder: Path, job: Job, checked: bool) -> None:
    """The build dir at `folder` is whole (every file against the manifest's hash) and is `job`'s build; with
    `checked`, its check is whole and of this build. One BadInput line otherwise."""
    opened = open_build(folder)
    report = opened.report
    opened.artifact()
    opened.golden()
    opened.structure()
    if opened.manifest.workload is not None:
        opened.workload()
    if (folder / "export" / "model.onnx").exists():
        opened.exported_model()
    built = (opened.manifest.project.name, opened.profile.name)
    if built != (job.project.display_name, job.profile):
        raise BadInput(
            f"{_FROM_WORKER} is the build of {built[0]}/{built[1]}, not of {job.name}",
            fix="rerun the farm; a worker that answers another build is not to be trusted",
        )
    if report.profile.name != job.profile:
        raise BadInput(
            f"{_FROM_WORKER}: its report is of profile {report.profile.name}, not {job.profile}", fix="rerun the farm"
        )
    if checked and opened.check_report is None:
        raise BadInput(f"{_FROM_WORKER} holds no check of {job.name}", fix="rerun the farm")


def received(files: Bundle, job: Job, scratch: Path) -> None:
    """Verify a build dir as a worker sent it, before anything is scheduled on it."""
    folder = Path(tempfile.mkdtemp(prefix=".received-", dir=scratch))
    try:
        unpack(files, folder / "build", f"{_FROM_WORKER} for {job.name}")
        verify(folder / "build", job, checked=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write(final: Path, files: Bundle, check_files: Bundle | None, job: Job, received_before: bool = False) -> Path:
    """The build (and its check, where one came back) in place at `final`, verified in staging first. A build
    `received` already verified from these same bytes is not hashed again: only its check is."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with StagedBuild(final) as stage:
        unpack(files, stage, f"{_FROM_WORKER} for {job.name}")
        if check_files:
            unpack(check_files, stage, f"the check the worker sent back for {job.name}")
        if not received_before:
            verify(stage, job, checked=bool(check_files))
        elif check_files and open_build(stage).check_report is None:
            raise BadInput(f"the check the worker sent back for {job.name} holds no check report", fix="rerun the farm")
    return final


def unchanged(previous: dict[str, Any] | None, folder: Path, job: Job, checked: bool) -> tuple[str, int] | None:
    """Where the last run's row for the same inputs finished and its build dir is still whole: the row's status and
    exit code as that verified build dir says them (farm.json only says which rows to look at: an edited summary
    must not turn a failed build into a pass). None otherwise."""
    if (
        not previous
        or previous.get("status") not in ("checked", "built")
        or (previous["status"] == "checked") != checked
    ):
        return None
    try:
        verify(folder, job, checked)
        opened = open_build(folder)
        report = opened.check_report if checked else opened.report
    except BadInput:
        return None
    return ("checked" if checked else "built"), report.exit_code


def previous_rows(out: Path) -> tuple[dict[str, dict], str | None]:
    """The last run's rows by inputs key, and a note where its summary could not be read (every row runs)."""
    path = out / SUMMARY
    if not path.is_file():
        return {}, None
    try:
        data = json.loads(path.read_text())
        rows = {r["key"]: r for r in data["rows"] if isinstance(r, dict) and isinstance(r.get("key"), str)}
        if data.get("schema") != SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r}")
        return rows, None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {}, f"{path} is not a farm summary this tapeout reads ({exc}): every row is built again"


def summary(
    plan: Plan, rows: list[dict[str, Any]], nodes: list[dict], seconds: float, ray_start: float
) -> dict[str, Any]:
    """farm.json: every row, the cluster, and the comparison of every build dir that came back whole."""
    from tapeout.reports.compare import compare

    dirs = [Path(r["build_dir"]) for r in rows if r.get("build_dir")]
    return {
        "schema": SCHEMA,
        "tapeout": __version__,
        "plan": str(plan.path),
        "seconds": round(seconds, 2),
        "ray_start_seconds": round(ray_start, 2),
        "nodes": nodes,
        "rows": rows,
        "compare": compare(dirs) if dirs else None,
        "exit_code": exit_code(rows),
    }


def exit_code(rows: list[dict[str, Any]]) -> int:
    """1 where a budget failed; 3 where a row has no verified result on its device; 0 where all passed."""
    if any(r.get("exit_code") == 1 for r in rows):
        return 1
    if any(r["status"] not in ("checked", "built") or r.get("exit_code") not in (0, None) for r in rows):
        return 3
    return 0


def write_summary(plan: Plan, data: dict[str, Any]) -> None:
    from tapeout.core.files import write_text
    from tapeout.reports.farm import render_markdown
    from tapeout.reports.html_page import render_farm

    write_json(plan.out / SUMMARY, data)
    write_text(plan.out / "farm.md", render_markdown(data))
    write_text(plan.out / PAGE, render_farm(data))
