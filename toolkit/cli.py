"""The `tapeout` command. Each command resolves its inputs and calls one library function.

Exit codes (DESIGN.md §4): 0 all budgets pass · 1 a budget fails · 2 bad input or usage ·
3 inconclusive · 4 target or toolchain not available here.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import click
import typer

from tapeout import __version__
from tapeout.core.errors import EXIT_BAD_INPUT, EXIT_INTERNAL, TapeoutError, one_line

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_enable=False,
                  help="Take a trained model to a deployable artifact for a named device, under budgets, with evidence.")
profiles_app = typer.Typer(no_args_is_help=True, help="List build profiles, or show one as resolved.")
app.add_typer(profiles_app, name="profiles")

JSON = typer.Option(False, "--json", help="Print machine-readable JSON on stdout; progress stays on stderr.")
STRICT = typer.Option(False, "--strict", help="Count unmeasured and estimated verdicts as failures (exit 1).")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tapeout {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """tapeout: export → build --profile → check, with budgets and verdicts."""


def _finish(report, as_json: bool, title: str) -> None:
    from tapeout.core.console import UI
    from tapeout.reports.terminal import verdict_table

    data = report.to_json()
    if as_json:
        typer.echo(json.dumps(data, indent=2, default=str))
    else:
        ui = UI()
        ui.out.print(verdict_table(title, data["budgets"]))
        for name, lat in (("latency", data["measurement"].get("latency_ms")),
                          ("with host copies", data["measurement"].get("latency_e2e_ms"))):
            if not lat:
                continue
            q = lat["quantiles"]
            ui.out.print(
                f"{name} p50 {q['p50']['point']:.3f} ms [{q['p50']['lower']:.3f}, {q['p50']['upper']:.3f}] · "
                f"p90 {q['p90']['point']:.3f} ms [{q['p90']['lower']:.3f}, {q['p90']['upper'] or float('inf'):.3f}] · "
                f"{lat['count']} runs / {lat['repeats']} processes"
                + (" · EMULATED: not the device's timings" if report.target.emulated else ""), markup=False)
        energy = data["measurement"].get("energy")
        if energy:
            ui.out.print(f"energy {energy['mj_per_inference']:.4g} mJ/inference · {energy['power_avg_w']:.4g} W average "
                         f"({energy['meter']}: {energy['scope']})", markup=False)
        ui.out.print(f"{report.kind} dir: {report.build_dir} · exit {report.exit_code}", markup=False)
    raise typer.Exit(report.exit_code)


@app.command()
def build(
    project: Path = typer.Argument(..., help="Project directory (holding tapeout.toml) or the project file."),
    profile: list[str] = typer.Option(..., "--profile", "-p", help="Shipped profile name or path to a profile .toml. "
                                      "Given more than once: build each, keep the fastest that meets its budgets."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Build dir. Default: PROJECT/build/PROFILE "
                                    "(several profiles: PROJECT/build/fastest, one build dir per profile inside)."),
    as_json: bool = JSON,
    strict: bool = STRICT,
) -> None:
    """Export, lint, compile, measure and judge: write a complete build dir, print the budget table."""
    if len(profile) > 1:
        return _choose(project, profile, out, as_json, strict)
    from tapeout.core.console import UI
    from tapeout.steps.build import build as run_build

    report = run_build(project, profile[0], out, UI(), strict=strict)
    _finish(report, as_json, f"{report.project.name} → {report.profile.name}")


def _choose(project: Path, profiles: list[str], out: Path | None, as_json: bool, strict: bool) -> None:
    from rich.table import Table

    from tapeout.core.console import UI
    from tapeout.reports.choice import HEADER, table_rows
    from tapeout.steps.choose import choose

    choice = choose(project, profiles, out, UI(), strict=strict)
    if as_json:
        typer.echo(json.dumps(choice, indent=2))
    else:
        ui = UI()
        table = Table(*HEADER, title="the fastest build that meets its budgets")
        for row in table_rows(choice):
            table.add_row(*row)
        ui.out.print(table)
        for note in choice["notes"]:
            ui.out.print(f"note: {note}", markup=False)
        ui.out.print(f"chosen: {choice['chosen_build_dir'] or 'none'} · exit {choice['exit_code']}", markup=False)
    raise typer.Exit(choice["exit_code"])


@app.command()
def check(
    build_dir: Path = typer.Argument(..., help="A build dir written by `tapeout build`."),
    junit: Path | None = typer.Option(None, "--junit", help="Also write a JUnit XML file for CI systems."),
    # bounded where the profile's values are (types.CheckSettings), checked by `check` before it measures:
    # importing the types here would put pydantic on the start-up path of every command
    iterations: int | None = typer.Option(None, min=10, help="Timed runs per process (default: the profile's)."),
    repeats: int | None = typer.Option(None, min=1, help="Fresh processes (default: the profile's)."),
    as_json: bool = JSON,
    strict: bool = STRICT,
) -> None:
    """On the device: verify the artifact, re-measure, judge the budgets; writes check.json."""
    from tapeout.core.console import UI
    from tapeout.core.files import output_file, write_text
    from tapeout.reports.junit import junit_xml
    from tapeout.steps.check import check as run_check

    if junit is not None:  # before the check, so that a bad path costs nothing and check.json never stands alone
        junit = output_file(junit, "--junit")
    started = time.perf_counter()
    report = run_check(build_dir, UI(), strict=strict, iterations=iterations, repeats=repeats)
    if junit is not None:
        write_text(junit, junit_xml(report, strict=strict, seconds=time.perf_counter() - started))
    _finish(report, as_json, f"check {report.project.name} → {report.profile.name}")


@app.command()
def export(
    project: Path = typer.Argument(..., help="Project directory (holding tapeout.toml) or the project file."),
    out: Path | None = typer.Option(None, "--out", "-o", help="ONNX file to write. Default: PROJECT/build/model.onnx."),
    profile: str = typer.Option("cpu-fp32", "--profile", "-p", help="Whose runtime limits (IR version, opset) apply."),
    as_json: bool = JSON,
) -> None:
    """Export the project's model to ONNX and verify it against torch; nothing is written if it fails."""
    from tapeout.core.console import UI
    from tapeout.steps.build import export_model
    from tapeout.steps.setup import for_build

    ui = UI()
    ctx = for_build(project, profile, ui)
    from tapeout.core.files import disk_full, out_of_space, output_file

    target = output_file(Path(out) if out else ctx.project.root / "build" / "model.onnx", "--out")
    # staged beside the target (same filesystem), then renamed: a failed or killed export leaves no half file
    try:
        with tempfile.TemporaryDirectory(prefix=f".{target.name}.partial-", dir=target.parent) as tmp:
            exported = export_model(ctx, Path(tmp) / target.name)
            for file in Path(tmp).iterdir():
                os.replace(file, target.parent / file.name)
    except OSError as exc:
        if out_of_space(exc):
            raise disk_full(target.parent, exc) from exc
        raise
    info = {**exported.info, "path": str(target)}
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    for p in info.get("parity", []):
        ui.out.print(f"  {p['output']}: max-abs {p['max_abs']:.3g} · max-rel {p['max_rel']:.3g} · cosine {p['cosine']:.6f}")
    ui.out.print(f"wrote {target} ({info['exporter']}, opset {info.get('opset', '?')})")


@app.command()
def lint(
    project: Path = typer.Argument(..., help="Project directory (holding tapeout.toml) or the project file."),
    profile: str = typer.Option("cpu-fp32", "--profile", "-p", help="The profile whose target is checked."),
) -> None:
    """List every problem the profile's target would hit with this model, before compiling."""
    from tapeout.core.console import UI
    from tapeout.steps.build import export_model
    from tapeout.steps.setup import for_build

    ui = UI()
    ctx = for_build(project, profile, ui)
    with tempfile.TemporaryDirectory(prefix="tapeout-lint-") as tmp:
        exported = export_model(ctx, Path(tmp) / "model.onnx", raise_on_lint=False, prune=False)
        issues = (exported.lint if exported.lint is not None
                  else ctx.target.lint(exported.path, ctx.project.inputs, ctx.project.dims))
    for issue in issues:
        ui.out.print(issue.line(), markup=False)
    errors = sum(i.severity == "error" for i in issues)
    ui.out.print(f"{ctx.profile.target}: {errors} error(s), {len(issues) - errors} warning(s)")
    raise typer.Exit(EXIT_BAD_INPUT if errors else 0)


@app.command()
def analyze(
    model: Path = typer.Argument(..., help="A project (directory or tapeout.toml; exported first) or an .onnx file."),
    dim: list[str] = typer.Option([], "--dim", help="NAME=VALUE for a symbolic dim of an .onnx file (default 1)."),
    groups: bool = typer.Option(False, "--groups", help="List every fusion group with its nodes."),
    as_json: bool = JSON,
) -> None:
    """Architecture (family, roles, fusion groups), op census, parameters, FLOPs and peak activation memory."""
    from tapeout.core.console import UI
    from tapeout.core.errors import BadInput
    from tapeout.graph.analyze import analyze as run_analysis
    from tapeout.reports.terminal import analysis_summary

    dims: dict[str, int] = {}
    for item in dim:
        name, _, value = item.partition("=")
        if not name or not value.isdigit() or int(value) <= 0:
            raise BadInput(f"--dim {item!r} is not NAME=VALUE with a positive integer value", fix="e.g. --dim sequence=128")
        dims[name] = int(value)
    ui = UI()
    if model.suffix == ".onnx":
        if not model.is_file():
            raise BadInput(f"{model} not found", fix="check the path")
        result, title = run_analysis(model, None, dims), model.name
    else:
        from tapeout.steps.build import export_model, hints_of
        from tapeout.steps.setup import for_build

        ctx = for_build(model, "cpu-fp32", ui)
        proj = ctx.project
        with tempfile.TemporaryDirectory(prefix="tapeout-analyze-") as tmp:
            exported = export_model(ctx, Path(tmp) / "model.onnx")
            with ui.step("analyze"):
                result = run_analysis(exported.path, proj.inputs, {**proj.dims, **dims}, hints=hints_of(exported.loaded))
        title = proj.display_name
    if as_json:
        typer.echo(json.dumps(result.to_json(top_costs=30), indent=2, default=str))
        return
    analysis_summary(ui.out, title, result, show_groups=groups)


@app.command()
def report(
    build_dir: Path = typer.Argument(..., help="A build dir."),
    of_check: bool = typer.Option(False, "--check", help="Re-render check.md from check.json instead."),
) -> None:
    """Re-render report.md and report.html (or check.md and check.html) from its JSON; print the markdown."""
    from tapeout.builds.reader import open_build
    from tapeout.core.errors import BadInput
    from tapeout.core.files import write_text
    from tapeout.reports.markdown import render_markdown

    build = open_build(build_dir)
    source = build.directory / ("check.json" if of_check else "report.json")
    loaded = build.check_report if of_check else build.report
    if loaded is None:
        raise BadInput(f"{source} not found", fix="run `tapeout check` on the build first")
    text = render_markdown(loaded)
    typer.echo(text)
    try:
        from tapeout.reports.html_page import render as render_html

        write_text(source.with_suffix(".md"), text)
        write_text(source.with_suffix(".html"), render_html(loaded))
    except OSError as exc:  # a read-only build dir still renders
        typer.echo(f"tapeout: note: {source.with_suffix('.md')} not written ({exc.strerror or exc})", err=True)


@app.command()
def estimate(
    build_dir: Path = typer.Argument(..., help="A build dir written by `tapeout build`."),
    device: str | None = typer.Option(None, "--device", help="Estimate for this device spec instead of the "
                                      "profile's (`tapeout profiles list` shows the specs)."),
    as_json: bool = JSON,
) -> None:
    """Latency estimate on the profile's device: roofline per kernel, calibrated where measured, with its error band."""
    from tapeout.builds.reader import open_build
    from tapeout.core.console import UI
    from tapeout.estimation import estimate as estimating

    spec = None
    if device is not None:
        from tapeout.core.config import load_device

        spec = load_device(device)
    est = estimating.for_build(open_build(build_dir), device_spec=spec)
    if as_json:
        typer.echo(json.dumps(est.to_json(top=30), indent=2, default=str))
        return
    from rich.table import Table

    ui = UI()
    ui.out.print(est.line(), markup=False)
    table = Table("kernel", "class", "precision", "GFLOP", "MB", "compute µs", "memory µs", "bound",
                  title=f"the slowest kernels at the roofline ({est.roof.source})")
    for k in est.to_json(top=15)["top_kernels"]:
        table.add_row(k["name"], k["class"], k["precision"], f"{k['flops'] / 1e9:.4g}", f"{k['bytes'] / 2**20:.4g}",
                      f"{k['compute_us']:.3g}", f"{k['memory_us']:.3g}",
                      "compute" if k["compute_us"] >= k["memory_us"] else "memory")
    ui.out.print(table)
    for note in est.notes:
        ui.out.print(f"note: {note}", markup=False)


@app.command()
def calibrate(
    build_dirs: list[Path] = typer.Argument(..., help="Build dirs measured on the device (a check.json counts)."),
    out: Path | None = typer.Option(None, "--out", help="Folder for the calibration files (default: "
                                    "$TAPEOUT_CALIBRATION or ~/.local/share/tapeout/calibration)."),
    as_json: bool = JSON,
) -> None:
    """Fit the estimator (per kernel class: cost per launch, roofline multiple) from measured per-op profiles."""
    from tapeout.builds.reader import open_build
    from tapeout.core.console import UI
    from tapeout.core.errors import BadInput
    from tapeout.core.host import host_fingerprint, now
    from tapeout.estimation import estimate as estimating
    from tapeout.estimation import fit, roofline

    ui = UI()
    here = roofline.host_key(host_fingerprint())
    found = []
    for d in build_dirs:
        got = estimating.measured_record(open_build(d))
        if isinstance(got, str):
            ui.note(f"skipped {got}")
            continue
        if got[1]["device"].startswith("host-") and got[1]["host_key"] != here:  # its roof is that CPU's, not ours
            ui.note(f"skipped {d}: measured on another CPU ({got[1]['host_key']}); calibrate on that machine")
            continue
        found.append(got)
    if not found:
        raise BadInput("none of the build dirs has a latency measured on its device with a per-op profile",
                       fix="build (or check) on the device with [check] op_profile = true, then calibrate from those")
    folder = out or fit.user_folder()
    results = []
    for cal in fit.make(found, now(), __version__):
        path = fit.save(cal, folder)
        results.append({"device": cal.device, "target": cal.target, "file": str(path), "summary": cal.summary(),
                        "band": cal.band, "held_out": cal.held_out})
        if not as_json:
            ui.out.print(f"{cal.device} × {cal.target}: {cal.summary()} → {path}", markup=False)
    if as_json:
        typer.echo(json.dumps(results, indent=2, default=str))


@app.command()
def compare(
    items: list[Path] = typer.Argument(..., help="Build dirs, or one project with --profile."),
    profile: list[str] = typer.Option([], "--profile", "-p", help="With a project: compare its builds of these profiles."),
    html_out: Path | None = typer.Option(None, "--html", help="Also write the comparison as a self-contained HTML page."),
    as_json: bool = JSON,
) -> None:
    """One table for one model across targets (from existing builds), the Pareto front and a recommendation."""
    from tapeout.core.files import output_file, write_text
    from tapeout.reports import compare as comparing


    if html_out is not None:
        html_out = output_file(html_out, "--html")
    result = comparing.compare(comparing.resolve(items, profile))
    if html_out is not None:
        from tapeout.reports.html_page import render_compare

        write_text(html_out, render_compare(result))
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
        return
    from rich.table import Table

    from tapeout.core.console import UI

    ui = UI()
    table = Table(*comparing.HEADER, title="one model, several targets")
    for row in comparing.table_rows(result):
        table.add_row(*row)
    ui.out.print(table)
    ui.out.print(f"recommendation: {result['why']}", markup=False)


@app.command()
def diff(
    a: Path = typer.Argument(..., help="A build dir, or a report.json / check.json."),
    b: Path | None = typer.Argument(None, help="Another; left out: A's build against its own check."),
    as_json: bool = JSON,
) -> None:
    """Which figures moved beyond their noise between two builds (or a build and its check)."""
    from tapeout.core.errors import BadInput
    from tapeout.reports import diff as diffing

    if b is None:
        if not (a / "check.json").exists():
            raise BadInput(f"{a} has no check.json to compare its build with", fix="run `tapeout check` on it, or give two builds")
        a, b = a / "report.json", a / "check.json"
    rows = diffing.diff(diffing.load_side(a), diffing.load_side(b))
    if as_json:
        typer.echo(json.dumps(rows, indent=2, default=str))
    else:
        typer.echo(diffing.render_diff(rows, str(a), str(b)))
    raise typer.Exit(0)


@app.command()
def targets(as_json: bool = JSON) -> None:
    """Which backends work on this host, and why not."""
    import platform

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from tapeout import targets as registry
    from tapeout.core.errors import BadInput, TargetUnavailable

    rows = []
    for name, info in registry.TARGETS.items():
        probe = registry.target_class(name).probe()
        reason, install = probe.reason, probe.install_hint
        if probe.available:  # built in; can it run here with its default options (CUDA loads, the device exists)?
            try:
                registry.create(name).preflight()
            except TargetUnavailable as exc:
                reason, install = exc.problem, exc.fix or ""
            except BadInput:
                pass  # no default options (qnn names its SoC): its profiles' preflight decides at build time
        caps = info.capabilities
        rows.append({"target": name, "available": probe.available and not reason, "version": probe.version,
                     "reason": reason, "install": install, "summary": info.summary,
                     "precisions": list(caps.precisions), "compile_on": caps.compile_on, "meters": list(caps.meters),
                     "emulated_here": caps.emulated_on.get(platform.machine().lower())})
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table("target", "available", "version", "precisions", "what", "why not / install", show_lines=True)
    for r in rows:
        unavailable = ("[yellow]host part only[/]: the engine is built on the device" if r["compile_on"] == "device"
                       else "[red]no[/]")
        table.add_row(r["target"], ("yes" + (" (emulator)" if r["emulated_here"] else "")) if r["available"] else unavailable,
                      r["version"] or "—", ", ".join(r["precisions"]), escape(r["summary"]),
                      escape(f"{r['reason']} — {r['install']}" if r["reason"] else "—"))
    Console(width=None if Console().is_terminal else 160).print(table)


@profiles_app.command("list")
def profiles_list(as_json: bool = JSON) -> None:
    """Shipped build profiles and device specs."""
    from tapeout.core.config import list_devices, list_profiles
    from tapeout.steps.setup import load_profile

    names = list_profiles()
    if as_json:
        typer.echo(json.dumps({"profiles": names, "devices": list_devices()}, indent=2))
        return
    for name in names:
        p = load_profile(name)
        typer.echo(f"{name:<20} {p.target:<12} {p.description}")
    typer.echo(f"device specs: {', '.join(list_devices())}")


@profiles_app.command("show")
def profiles_show(name: str = typer.Argument(..., help="Profile or device spec name, or a path to a profile .toml.")) -> None:
    """A profile as resolved (extends merged, defaults filled) with its device spec, or a device spec, as JSON."""
    from tapeout.core.config import list_devices, list_profiles, load_device
    from tapeout.steps.setup import load_profile

    if name in list_devices() and name not in list_profiles():
        typer.echo(json.dumps({"device_spec": load_device(name).model_dump(mode="json")}, indent=2))
        return
    profile = load_profile(name)
    spec = load_device(profile.device).model_dump(mode="json") if profile.device else None
    typer.echo(json.dumps({**profile.model_dump(mode="json"), "device_spec": spec}, indent=2))


_INTERRUPTED = "tapeout: interrupted (Ctrl-C); a build in progress leaves the build dir as it was"
_TERMINATED = "tapeout: terminated (SIGTERM); a build in progress leaves the build dir as it was"
# Faults of the machine, not of tapeout: a full disk, a read-only mount, no permission, a name too long.
_ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG}
_terminated = False


def _on_sigterm(signum, frame) -> None:
    # SIGTERM (CI timeouts, `kill`) unwinds like Ctrl-C, so staging dirs and temp files are removed
    global _terminated
    _terminated = True
    raise KeyboardInterrupt


def _interrupted() -> None:
    typer.echo(_TERMINATED if _terminated else _INTERRUPTED, err=True)
    sys.exit(143 if _terminated else 130)


def _click_exceptions(name: str) -> tuple[type[BaseException], ...]:
    """click's exception class and typer's vendored copy of it (typer >= 0.2x ships click as typer._click,
    whose usage errors are not click's classes)."""
    found = [getattr(click.exceptions, name)]
    try:
        from typer._click import exceptions as vendored
    except ImportError:
        vendored = None
    found.append(getattr(vendored, name, None))
    if name == "Exit":
        found.append(typer.Exit)
    return tuple(dict.fromkeys(cls for cls in found if cls is not None))


def main() -> None:
    # --debug is global: accepted before or after the command, and never part of what typer parses
    debug = "--debug" in sys.argv
    sys.argv = [a for a in sys.argv if a != "--debug"]
    signal.signal(signal.SIGTERM, _on_sigterm)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # left alone where started ignored (nohup, &)
        from tapeout.core.console import on_sigint

        signal.signal(signal.SIGINT, on_sigint)
    try:
        code = app(standalone_mode=False)
    except TapeoutError as exc:
        _after_ctrl_c()
        if debug:  # the traceback (the user's own, for errors in their code), and still the exit code
            import traceback

            traceback.print_exc()
            if exc.detail:
                typer.echo(f"the runtime's whole message:\n{exc.detail}", err=True)
        more = " (`tapeout --debug …` prints the runtime's whole message)" if exc.detail and not debug else ""
        typer.echo(f"tapeout: error: {one_line(str(exc))}{more}", err=True)
        sys.exit(exc.exit_code)
    except _click_exceptions("Exit") as exc:  # typer.Exit
        sys.exit(exc.exit_code)
    except _click_exceptions("ClickException") as exc:  # usage: a missing option, an unknown command, ...
        exc.show()
        sys.exit(EXIT_BAD_INPUT)
    except (KeyboardInterrupt, *_click_exceptions("Abort")):
        _interrupted()
    except OSError as exc:
        _after_ctrl_c()
        if exc.errno not in _ENVIRONMENT_ERRNOS:
            _internal_error()
        if debug:
            import traceback

            traceback.print_exc()
        where = one_line(f": {exc.filename}") if exc.filename else ""
        typer.echo(f"tapeout: error: {exc.strerror}{where} — free space, fix the permissions, or choose "
                   "another path", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except Exception:
        _after_ctrl_c()
        _internal_error()
    if code == 130:  # typer turns Ctrl-C into Exit(130) and, outside standalone mode, returns its code
        _interrupted()
    sys.exit(code if isinstance(code, int) else 0)


def _after_ctrl_c() -> None:
    """A failure after a Ctrl-C Python dropped (an import it cut short, say) is the interrupt's doing: say that."""
    from tapeout.core.console import interrupt_pending

    if interrupt_pending():
        _interrupted()


def _internal_error() -> None:
    # Anything that is not a TapeoutError is our bug: keep the traceback, and an exit code that
    # no CI system will read as "budget failed".
    import traceback

    traceback.print_exc()
    typer.echo("tapeout: internal error (a bug in tapeout, not in your model); please report it with the "
               "traceback above", err=True)
    sys.exit(EXIT_INTERNAL)
