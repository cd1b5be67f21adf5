"""`tapeout compare` (one model across targets: a table, the Pareto front, a recommendation) and `tapeout diff`
(what moved beyond its noise), both from build dirs read through the verified reader."""

from __future__ import annotations

from pathlib import Path

from tapeout.commands.output import print_json
from tapeout.core.errors import BadInput


def compare(items: list[Path], profiles: list[str], html_out: Path | None, as_json: bool) -> int:
    from tapeout.core.files import output_file, write_text
    from tapeout.reports import compare as comparing

    if html_out is not None:
        html_out = output_file(html_out, "--html")
    result = comparing.compare(comparing.resolve(items, profiles))
    if html_out is not None:
        from tapeout.reports.html_page import render_compare

        write_text(html_out, render_compare(result))
    if as_json:
        print_json(result)
        return 0
    from rich.table import Table

    from tapeout.core.console import UI

    ui = UI()
    table = Table(title="one model, several targets")
    for column in comparing.HEADER:  # a build's name whole; other cells fold rather than end in "…"
        table.add_column(column, overflow="fold", no_wrap=column == "build")
    for row in comparing.table_rows(result):
        table.add_row(*row)
    ui.out.print(table)
    ui.out.print(f"recommendation: {result['why']}", markup=False)
    return 0


def diff(a: Path, b: Path | None, as_json: bool) -> int:
    from tapeout.reports import diff as diffing

    if b is None:
        if not (a / "check.json").exists():
            raise BadInput(
                f"{a} has no check.json to compare its build with", fix="run `tapeout check` on it, or give two builds"
            )
        a, b = a / "report.json", a / "check.json"
    rows = diffing.diff(diffing.load_side(a), diffing.load_side(b))
    if as_json:
        print_json(rows)
    else:
        print(diffing.render_diff(rows, str(a), str(b)))
    return 0
