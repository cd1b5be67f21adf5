"""`tapeout targets`: which backends work on this host, their precisions, and why not, with what to install."""

from __future__ import annotations

import platform

from tapeout.commands.output import print_json


def rows() -> list[dict]:
    from tapeout import targets as registry
    from tapeout.core.errors import BadInput

    found = []
    for name, info in registry.TARGETS.items():
        probe = registry.target_class(name).probe()
        reason, install = probe.reason, probe.install_hint
        if probe.available:  # built in; can it run here with its default options (CUDA loads, the device exists)?
            try:
                here = registry.readiness(registry.create(name))
            except BadInput:
                here = None  # no default options (qnn names its SoC): its profiles' preflight decides at build time
            if here is not None and not here.ready:
                reason, install = here.problem.problem, here.problem.fix or ""
        caps = info.capabilities
        found.append(
            {
                "target": name,
                "available": probe.available and not reason,
                "version": probe.version,
                "reason": reason,
                "install": install,
                "summary": info.summary,
                "precisions": list(caps.precisions),
                "workloads": list(caps.workloads),
                "workloads_not": dict(caps.workloads_not),
                "compile_on": caps.compile_on,
                "meters": list(caps.meters),
                "emulated_here": caps.emulated_on.get(platform.machine().lower()),
            }
        )
    return found


def targets(as_json: bool) -> int:
    found = rows()
    if as_json:
        print_json(found)
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(
        "target", "available", "version", "precisions", "workloads", "what", "why not / install", show_lines=True
    )
    for r in found:
        unavailable = (
            "[yellow]host part only[/]: the engine is built on the device"
            if r["compile_on"] == "device"
            else "[red]no[/]"
        )
        table.add_row(
            r["target"],
            ("yes" + (" (emulator)" if r["emulated_here"] else "")) if r["available"] else unavailable,
            r["version"] or "—",
            ", ".join(r["precisions"]),
            ", ".join(r["workloads"]),
            escape(r["summary"]),
            escape(f"{r['reason']} — {r['install']}" if r["reason"] else "—"),
        )
    Console(width=None if Console().is_terminal else 160).print(table)
    return 0
