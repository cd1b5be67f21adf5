"""`tapeout check`: on the device, the tail of the build's steps over the verified build dir."""

from __future__ import annotations

import time
from pathlib import Path

from tapeout.commands.output import show
from tapeout.core.console import UI
from tapeout.core.files import output_file, write_text


def check(
    build_dir: Path, junit: Path | None, iterations: int | None, repeats: int | None, as_json: bool, strict: bool
) -> int:
    from tapeout.reports.junit import junit_xml
    from tapeout.steps.flows import check as run_check

    if junit is not None:  # before the check, so that a bad path costs nothing and check.json never stands alone
        junit = output_file(junit, "--junit")
    started = time.perf_counter()
    report = run_check(build_dir, UI(), strict=strict, iterations=iterations, repeats=repeats)
    if junit is not None:
        write_text(junit, junit_xml(report, strict=strict, seconds=time.perf_counter() - started))
    return show(report, as_json, f"check {report.project.name} → {report.profile.name}")
