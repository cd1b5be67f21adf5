"""`tapeout estimate` (a build's latency on its profile's device, or another) and `tapeout calibrate` (the
estimator fitted from builds measured on their device)."""

from __future__ import annotations

from pathlib import Path

from tapeout.commands.output import print_json
from tapeout.core.console import UI
from tapeout.core.errors import BadInput


def estimate(build_dir: Path, device: str | None, as_json: bool, target: str | None = None) -> int:
    from tapeout.builds.reader import open_build
    from tapeout.estimation import estimate as estimating

    spec = None
    if device is not None:
        from tapeout.core.config import load_device

        spec = load_device(device)
    if target is not None:
        from tapeout import targets

        if target not in targets.TARGETS:
            raise BadInput(f"unknown target '{target}' for --target", fix=f"use one of: {', '.join(targets.TARGETS)}")
        if spec is None:
            raise BadInput(
                "--target prices the build as another target would run it, on a device: it needs --device",
                fix="add --device NAME (tapeout profiles list shows the device specs)",
            )
    est = estimating.for_build(open_build(build_dir), device_spec=spec, target=target)
    if as_json:
        print_json(est.to_json(top=30))
        return 0
    from rich.table import Table

    ui = UI()
    ui.out.print(est.line(), markup=False)
    table = Table(
        "kernel",
        "class",
        "precision",
        "GFLOP",
        "MB",
        "compute µs",
        "memory µs",
        "bound",
        title=f"the slowest kernels at the roofline ({est.roof.source})",
    )
    for k in est.to_json(top=15)["top_kernels"]:
        table.add_row(
            k["name"],
            k["class"],
            k["precision"],
            f"{k['flops'] / 1e9:.4g}",
            f"{k['bytes'] / 2**20:.4g}",
            f"{k['compute_us']:.3g}",
            f"{k['memory_us']:.3g}",
            "compute" if k["compute_us"] >= k["memory_us"] else "memory",
        )
    ui.out.print(table)
    for note in est.notes:
        ui.out.print(f"note: {note}", markup=False)
    if est.generation is not None:
        _generation(ui, est.generation.to_json())
    return 0


def _generation(ui: UI, g: dict) -> None:
    """A generate build's loop: TTFT per prompt length, TPOT and decode tokens/s, and the calls they come from."""
    from rich.table import Table

    from tapeout.reports import generation

    ui.out.print(f"\nthe generation loop on {g['device']}: {g['method']}", markup=False)
    table = Table(*generation.ESTIMATE_HEADER[:3], title="time to first token and per output token")
    for row in generation.estimate_rows(g):
        table.add_row(*row[:3])
    ui.out.print(table)
    phases = Table(*generation.PHASE_HEADER, title="priced from these calls")
    for row in generation.phase_rows(g):
        phases.add_row(*row)
    ui.out.print(phases)
    ui.out.print(generation.estimate_note(g), markup=False)


def calibrate(build_dirs: list[Path], out: Path | None, as_json: bool, as_class: bool = False) -> int:
    from tapeout import __version__
    from tapeout.builds.reader import open_build
    from tapeout.core.host import host_fingerprint, now
    from tapeout.estimation import estimate as estimating
    from tapeout.estimation import fit, host_probes, roofline

    ui = UI()
    host = host_fingerprint()
    here = roofline.host_key(host)
    with ui.step("measure this host's roof (one-thread multiply and copy probes, ~2 s)"):
        kept = host_probes.kept(host, again=True)  # raised, never lowered: its records and later estimates price alike
    ui.note(f"this host's probes, the highest measured, kept in {kept.path}")
    found = []
    for d in build_dirs:
        got = estimating.measured_record(open_build(d))
        if isinstance(got, str):
            ui.note(f"skipped {got}")
            continue
        device = got[1]["device"]
        if device.startswith("host-") and got[1]["host_key"] != here:  # its roof is that CPU's, not ours
            ui.note(f"skipped {d}: measured on another CPU ({got[1]['host_key']}); calibrate on that machine")
            continue
        if as_class and device.startswith(roofline.host_name(host)):
            got[1]["device"] = roofline.cpu_class(host) + device[len(roofline.host_name(host)) :]
        found.append(got)
    if not found:
        raise BadInput(
            "none of the build dirs has a latency measured on its device with a per-op profile",
            fix="build (or check) on the device with [check] op_profile = true, then calibrate from those",
        )
    folder = out or fit.user_folder()
    results = []
    for cal in fit.make(found, now(), __version__):
        path = fit.save(cal, folder)
        results.append(
            {
                "device": cal.device,
                "target": cal.target,
                "file": str(path),
                "summary": cal.summary(),
                "band": cal.band,
                "held_out": cal.held_out,
            }
        )
        if not as_json:
            ui.out.print(f"{cal.device} × {cal.target}: {cal.summary()} → {path}", markup=False)
    if as_json:
        print_json(results)
    return 0
