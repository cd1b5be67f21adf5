"""`tapeout build`: one profile, or several (the fastest that meets its budgets)."""

from __future__ import annotations

from pathlib import Path

from tapeout.commands.output import print_json, show
from tapeout.core.console import UI


def build(project: Path, profiles: list[str], out: Path | None, as_json: bool, strict: bool) -> int:
    if len(profiles) > 1:
        return choose(project, profiles, out, as_json, strict)
    from tapeout.steps.flows import build as run_build

    report = run_build(project, profiles[0], out, UI(), strict=strict)
    return show(report, as_json, f"{report.project.name} → {report.profile.name}")


def choose(project: Path, profiles: list[str], out: Path | None, as_json: bool, strict: bool) -> int:
    from rich.table import Table

    from tapeout.reports.choice import HEADER, table_rows
    from tapeout.steps.choose import choose as run_choice

    choice = run_choice(project, profiles, out, UI(), strict=strict)
    if as_json:
        print_json(choice)
        return choice["exit_code"]
    ui = UI()
    table = Table(*HEADER, title="the fastest build that meets its budgets")
    for row in table_rows(choice):
        table.add_row(*row)
    ui.out.print(table)
    for note in choice["notes"]:
        ui.out.print(f"note: {note}", markup=False)
    ui.out.print(f"chosen: {choice['chosen_build_dir'] or 'none'} · exit {choice['exit_code']}", markup=False)
    return choice["exit_code"]
