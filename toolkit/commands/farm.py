"""`tapeout farm PLAN.toml` (run a plan on a Ray cluster, or a local Ray instance) and `tapeout farm worker` (start a
Ray node that advertises the devices it holds)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from tapeout.commands.output import print_json
from tapeout.core.console import UI
from tapeout.core.errors import BadInput, TargetUnavailable

WORKER = "worker"


def farm(what: str, address: str | None, out: Path | None, devices: str | None, dry_run: bool, as_json: bool) -> int:
    if what == WORKER:
        if out is not None:
            raise BadInput("--out is for a plan, not for `tapeout farm worker`", fix="leave it out")
        return worker(address, devices, dry_run, as_json)
    for flag, given in (("--devices", devices), ("--dry-run", dry_run)):
        if given:
            raise BadInput(
                f"{flag} is for `tapeout farm worker`, not for a plan",
                fix="leave it out, or run `tapeout farm worker …` on the node",
            )
    return run_plan(Path(what), address, out, as_json)


def run_plan(path: Path, address: str | None, out: Path | None, as_json: bool) -> int:
    from tapeout.farm import head
    from tapeout.farm.plan import load_plan
    from tapeout.reports import farm as table

    ui = UI()
    plan = load_plan(path, out)
    data = head.run(plan, address, ui)
    if as_json:
        print_json(data)
        return data["exit_code"]
    from rich.table import Table

    rows = Table(*table.HEADER, title="the farm's rows")
    for row in table.table_rows(data):
        rows.add_row(*row)
    ui.out.print(rows)
    if data["compare"]:
        from tapeout.reports.compare import HEADER, table_rows

        builds = Table(*HEADER, title="builds side by side (verified on the head)")
        for row in table_rows(data["compare"]):
            builds.add_row(*row)
        ui.out.print(builds)
        ui.out.print(f"recommendation: {data['compare']['why']}", markup=False)
    ui.out.print(
        f"wrote {plan.out / 'farm.json'} and {plan.out / 'farm.html'} · exit {data['exit_code']}", markup=False
    )
    return data["exit_code"]


def worker(address: str | None, devices: str | None, dry_run: bool, as_json: bool) -> int:
    """Check the devices, then become a Ray node advertising them (`ray start --block`)."""
    from tapeout.farm import devices as found
    from tapeout.farm.plan import device_name
    from tapeout.farm.runtime import hide_broken_amdsmi, node_resources

    if devices:
        try:
            names = [device_name(d.strip(), "device") for d in devices.split(",") if d.strip()]
        except ValueError as exc:
            raise BadInput(f"--devices: {exc}", fix="e.g. --devices host-cpu,h100-sxm") from None
        names = found.usable(list(dict.fromkeys(names)))
    else:
        names = found.found_here()
    resources = node_resources(names)
    ray_cli = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    command = [
        ray_cli,
        "start",
        *(["--address", address] if address else ["--head"]),
        "--resources",
        json.dumps(resources),
        "--block",
    ]
    if as_json or dry_run:
        from tapeout.farm.tasks import machine_state

        description = {"devices": names, "resources": resources, "command": command, "machine": machine_state()}
        if as_json:
            print_json(description)
        else:
            import shlex

            m = description["machine"]
            UI().out.print(
                f"devices: {', '.join(names)}\nmachine: {m['cpu']}, {m['logical_cores']} logical cores, "
                f"{m['memory_gb']} GB, flags {' '.join(m['cpu_flags'])}\nray: {shlex.join(command)}",
                markup=False,
            )
        if dry_run:
            return 0
    if not Path(ray_cli).exists():
        raise TargetUnavailable("Ray's `ray` command is not installed here", fix='pip install "tapeout[farm]"')
    hide_broken_amdsmi()  # the node's Ray processes inherit PYTHONPATH from here
    # token authentication on every node tapeout starts (Ray's default for `ray start --head` since 2.59, and for
    # every cluster from 2.61): a worker joins with the head's token (~/.ray/auth_token or RAY_AUTH_TOKEN)
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    UI().note(f"starting a Ray node advertising {', '.join(names)} (Ctrl-C stops it)")
    os.execv(ray_cli, command)
    return 0  # not reached
