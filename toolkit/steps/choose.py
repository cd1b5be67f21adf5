"""`tapeout build PROJECT -p A -p B`: build each profile, keep the fastest that meets its budgets (the
rule and the rendering are `reports.choice`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tapeout.builds.reader import open_build
from tapeout.core.console import UI
from tapeout.core.errors import EXIT_BUDGET_FAILED, BadInput, TapeoutError, one_line
from tapeout.core.files import write_json, write_text
from tapeout.reports.choice import CHOICE_FILE, SCHEMA, candidate_row, pick, render


def choose(project: Path, profiles: list[str], out: Path | None, ui: UI, strict: bool = False) -> dict[str, Any]:
    from tapeout.core.config import load_project
    from tapeout.steps.export import ExportShare
    from tapeout.steps.flows import build
    from tapeout.steps.setup import load_profile

    # Every profile and the project are read before the first build: a typo in the third costs nothing.
    loaded = [load_profile(p) for p in profiles]
    names = [p.name for p in loaded]
    if len(set(names)) != len(names):
        raise BadInput(
            f"profiles given twice: {', '.join(sorted({n for n in names if names.count(n) > 1}))}",
            fix="give each --profile once",
        )
    root = load_project(project).root
    out = Path(out) if out else root / "build" / "fastest"
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    shared = ExportShare()  # one export for the candidates whose runtimes take the same opset and IR version
    try:
        for i, (spec, name) in enumerate(zip(profiles, names, strict=True), 1):
            ui.note(f"candidate {i} of {len(profiles)}: {name}")
            build_dir = out / name
            try:
                build(project, spec, build_dir, ui, strict=strict, shared=shared)
                # the choice is made from what the build dirs hold, read back through the verified reader
                rows.append(candidate_row(name, build_dir, report=open_build(build_dir).report))
            except TapeoutError as exc:  # this candidate is out; the others still build
                ui.note(f"{name}: {one_line(str(exc))}")
                rows.append(candidate_row(name, build_dir, error=exc))
    finally:
        shared.close()
    best, notes = pick(rows)
    codes = sorted({r["exit_code"] for r in rows} - {0})
    exit_code = 0 if best else (EXIT_BUDGET_FAILED if EXIT_BUDGET_FAILED in codes or not codes else codes[0])
    choice = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "project": str(root),
        "rule": "all budgets pass (exit 0), then the lowest p50 latency; emulated targets never win",
        "chosen": best["profile"] if best else None,
        "chosen_build_dir": best["build_dir"] if best else None,
        "exit_code": exit_code,
        "notes": notes,
        "candidates": rows,
    }
    write_json(out / CHOICE_FILE, choice)
    write_text(out / "choice.md", render(choice))
    return choice
