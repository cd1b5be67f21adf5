"""`tapeout report`: report.md and report.html (or check.md and check.html) rendered again from the verified JSON."""

from __future__ import annotations

import sys
from pathlib import Path

from tapeout.core.errors import BadInput


def report(build_dir: Path, of_check: bool) -> int:
    from tapeout.builds.reader import open_build
    from tapeout.core.files import write_text
    from tapeout.reports.html_page import render as render_html
    from tapeout.reports.markdown import render_markdown

    build = open_build(build_dir)
    source = build.directory / ("check.json" if of_check else "report.json")
    loaded = build.check_report if of_check else build.report
    if loaded is None:
        raise BadInput(f"{source} not found", fix="run `tapeout check` on the build first")
    text = render_markdown(loaded)
    print(text)
    try:
        write_text(source.with_suffix(".md"), text)
        write_text(source.with_suffix(".html"), render_html(loaded))
    except OSError as exc:  # a read-only build dir still renders
        print(f"tapeout: note: {source.with_suffix('.md')} not written ({exc.strerror or exc})", file=sys.stderr)
    return 0
