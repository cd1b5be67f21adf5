"""The `tapeout` command line: the arguments of each command, and errors turned into one line and an exit code.
Each command's work is in `tapeout.commands`, imported when that command runs (so `--help` and `--version`
start fast and pull in neither pydantic nor numpy).

Exit codes (DESIGN.md §4): 0 all budgets pass · 1 a budget fails · 2 bad input or usage ·
3 inconclusive · 4 target or toolchain not available here.
"""

from __future__ import annotations

import errno
import signal
import sys
from pathlib import Path

import click
import typer

from tapeout import __version__
from tapeout.core.errors import EXIT_BAD_INPUT, EXIT_INTERNAL, TapeoutError, one_line

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="Take a trained model to a deployable artifact for a named device, under budgets, with evidence.",
)
profiles_app = typer.Typer(no_args_is_help=True, help="List build profiles, or show one as resolved.")
app.add_typer(profiles_app, name="profiles")
kernels_app = typer.Typer(no_args_is_help=True, help="The fused Triton kernels: list them, verify them, time them.")
app.add_typer(kernels_app, name="kernels")

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


def _done(code: int) -> None:
    raise typer.Exit(code)


@app.command()
def init(
    model: str = typer.Argument(..., help="A Hugging Face directory, an .onnx or .pt2 file, or file.py:callable."),
    directory: Path = typer.Option(Path("."), "--dir", "-d", help="Where tapeout.toml goes (default: here)."),
    inputs: list[str] = typer.Option(
        [],
        "--input",
        "-i",
        help="NAME=SHAPE[:DTYPE], e.g. image=1x3x224x224:float32; "
        "replaces what was read from the model (needed for a torch module's forward).",
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing tapeout.toml."),
) -> None:
    """Write a tapeout.toml for your model: its inputs read from the model, budgets to declare as comments."""
    from tapeout.commands import init as command

    _done(command.init(model, directory, inputs, force))


@app.command()
def build(
    project: Path = typer.Argument(..., help="Project directory (holding tapeout.toml) or the project file."),
    profile: list[str] = typer.Option(
        ...,
        "--profile",
        "-p",
        help="Shipped profile name or path to a profile .toml. "
        "Given more than once: build each, keep the fastest that meets its budgets.",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Build dir. Default: PROJECT/build/PROFILE "
        "(several profiles: PROJECT/build/fastest, one build dir per profile inside).",
    ),
    as_json: bool = JSON,
    strict: bool = STRICT,
) -> None:
    """Export, lint, compile, measure and judge: write a complete build dir, print the budget table."""
    from tapeout.commands import build as command

    _done(command.build(project, profile, out, as_json, strict))


@app.command()
def check(
    build_dir: Path = typer.Argument(..., help="A build dir written by `tapeout build`."),
    junit: Path | None = typer.Option(None, "--junit", help="Also write a JUnit XML file for CI systems."),
    # bounded where the profile's values are (core.profile_schema.CheckSettings), checked by `check` before it measures:
    # importing the schemas here would put pydantic on the start-up path of every command
    iterations: int | None = typer.Option(None, min=10, help="Timed runs per process (default: the profile's)."),
    repeats: int | None = typer.Option(None, min=1, help="Fresh processes (default: the profile's)."),
    as_json: bool = JSON,
    strict: bool = STRICT,
) -> None:
    """On the device: verify the artifact, re-measure, judge the budgets; writes check.json."""
    from tapeout.commands import check as command

    _done(command.check(build_dir, junit, iterations, repeats, as_json, strict))


@app.command()
def export(
    project: Path = typer.Argument(..., help="Project directory (holding tapeout.toml) or the project file."),
    out: Path | None = typer.Option(None, "--out", "-o", help="ONNX file to write. Default: PROJECT/build/model.onnx."),
    profile: str = typer.Option("cpu-fp32", "--profile", "-p", help="Whose runtime limits (IR version, opset) apply."),
    as_json: bool = JSON,
) -> None:
    """Export the project's model to ONNX and verify it against torch; nothing is written if it fails."""
    from tapeout.commands import export as command

    _done(command.export(project, out, profile, as_json))


@app.command()
def lint(
    project: Path = typer.Argument(..., help="Project directory (holding tapeout.toml) or the project file."),
    profile: str = typer.Option("cpu-fp32", "--profile", "-p", help="The profile whose target is checked."),
) -> None:
    """List every problem the profile's target would hit with this model, before compiling."""
    from tapeout.commands import export as command

    _done(command.lint(project, profile))


@app.command()
def analyze(
    model: Path = typer.Argument(..., help="A project (directory or tapeout.toml; exported first) or an .onnx file."),
    dim: list[str] = typer.Option([], "--dim", help="NAME=VALUE for a symbolic dim of an .onnx file (default 1)."),
    groups: bool = typer.Option(False, "--groups", help="List every fusion group with its nodes."),
    as_json: bool = JSON,
) -> None:
    """Architecture (family, roles, fusion groups), op census, parameters, FLOPs and peak activation memory."""
    from tapeout.commands import export as command

    _done(command.analyze(model, dim, groups, as_json))


@app.command()
def report(
    build_dir: Path = typer.Argument(..., help="A build dir."),
    of_check: bool = typer.Option(False, "--check", help="Re-render check.md from check.json instead."),
) -> None:
    """Re-render report.md and report.html (or check.md and check.html) from its JSON; print the markdown."""
    from tapeout.commands import report as command

    _done(command.report(build_dir, of_check))


@app.command()
def estimate(
    build_dir: Path = typer.Argument(..., help="A build dir written by `tapeout build`."),
    device: str | None = typer.Option(
        None,
        "--device",
        help="Estimate for this device spec instead of the profile's (`tapeout profiles list` shows the specs).",
    ),
    target: str | None = typer.Option(
        None,
        "--target",
        help="With --device: price the model as this target would "
        "run it there (a device the build's own target does not run on).",
    ),
    as_json: bool = JSON,
) -> None:
    """Latency estimate on the profile's device: roofline per kernel, calibrated where measured, with its error band."""
    from tapeout.commands import estimate as command

    _done(command.estimate(build_dir, device, as_json, target))


@app.command()
def calibrate(
    build_dirs: list[Path] = typer.Argument(None, help="Build dirs measured on the device (a check.json counts)."),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Folder for the calibration files (default: $TAPEOUT_CALIBRATION or ~/.local/share/tapeout/calibration).",
    ),
    as_class: bool = typer.Option(
        False,
        "--class",
        help="Save it as this CPU's class (cpu-<vendor>-<tier>): it then "
        "prices every host of that class with no calibration of its own.",
    ),
    as_json: bool = JSON,
) -> None:
    """Fit the estimator (per kernel class: cost per launch, roofline multiple) from measured per-op profiles."""
    if not build_dirs:
        raise TapeoutError(
            "calibrate needs build dirs measured on the device",
            fix="tapeout calibrate BUILD_DIR… (builds or checks with [check] op_profile = true)",
        )
    from tapeout.commands import estimate as command

    _done(command.calibrate(build_dirs, out, as_json, as_class))


@app.command()
def compare(
    items: list[Path] = typer.Argument(..., help="Build dirs, or one project with --profile."),
    profile: list[str] = typer.Option(
        [], "--profile", "-p", help="With a project: compare its builds of these profiles."
    ),
    html_out: Path | None = typer.Option(
        None, "--html", help="Also write the comparison as a self-contained HTML page."
    ),
    as_json: bool = JSON,
) -> None:
    """One table for one model across targets (from existing builds), the Pareto front and a recommendation."""
    from tapeout.commands import compare as command

    _done(command.compare(items, profile, html_out, as_json))


@app.command()
def diff(
    a: Path = typer.Argument(..., help="A build dir, or a report.json / check.json."),
    b: Path | None = typer.Argument(None, help="Another; left out: A's build against its own check."),
    as_json: bool = JSON,
) -> None:
    """Which figures moved beyond their noise between two builds (or a build and its check)."""
    from tapeout.commands import compare as command

    _done(command.diff(a, b, as_json))


@app.command()
def farm(
    what: str = typer.Argument(
        ...,
        metavar="PLAN.toml|worker",
        help="A farm plan to run, or `worker` to start a Ray node here that advertises its devices.",
    ),
    address: str | None = typer.Option(
        None,
        "--address",
        help="The Ray cluster (HEAD:PORT). Left out: a plan runs on "
        "a local Ray instance; a worker starts a cluster's head.",
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Plan: the farm's out dir (default: the plan's [farm] out)."
    ),
    devices: str | None = typer.Option(
        None,
        "--devices",
        help="Worker: the devices it advertises, comma-separated "
        "(host-cpu, device spec names); default: every device found here.",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Worker: print what it would advertise; start nothing."),
    as_json: bool = JSON,
) -> None:
    """Build and check many projects × profiles on a Ray cluster, each check on a node holding its device."""
    from tapeout.commands import farm as command

    _done(command.farm(what, address, out, devices, dry_run, as_json))


@app.command()
def targets(as_json: bool = JSON) -> None:
    """Which backends work on this host, and why not."""
    from tapeout.commands import targets as command

    _done(command.targets(as_json))


@profiles_app.command("list")
def profiles_list(as_json: bool = JSON) -> None:
    """Shipped build profiles and device specs."""
    from tapeout.commands import profiles as command

    _done(command.listing(as_json))


@profiles_app.command("show")
def profiles_show(
    name: str = typer.Argument(..., help="Profile or device spec name, or a path to a profile .toml."),
) -> None:
    """A profile as resolved (extends merged, defaults filled) with its device spec, or a device spec, as JSON."""
    from tapeout.commands import profiles as command

    _done(command.show(name))


KERNEL_NAMES = typer.Argument(
    None, metavar="[KERNEL]...", help="Kernels by name (`tapeout kernels list`); default: all."
)


@kernels_app.command("list")
def kernels_list(as_json: bool = JSON) -> None:
    """The kernels, what each replaces and its dtypes."""
    from tapeout.commands import kernels as command

    _done(command.listing(as_json))


@kernels_app.command("verify")
def kernels_verify(
    names: list[str] | None = KERNEL_NAMES,
    dtype: str | None = typer.Option(
        None, "--dtype", help="float32, float16, bfloat16 (comma-separated); default: all."
    ),
    all_configs: bool = typer.Option(
        False, "--all-configs", help="Every config of each tuning space, not the default."
    ),
    as_json: bool = JSON,
) -> None:
    """Each kernel against its PyTorch reference on fresh inputs (on the GPU, else in Triton's interpreter); exit 1
    when one fails."""
    from tapeout.commands import kernels as command

    _done(command.verify(names, dtype, all_configs, as_json))


@kernels_app.command("bench")
def kernels_bench(
    names: list[str] | None = KERNEL_NAMES,
    dtype: str | None = typer.Option(
        None, "--dtype", help="float32, float16, bfloat16 (comma-separated); default: float16."
    ),
    calls: int = typer.Option(100, "--calls", help="Timed calls per kernel and case."),
    max_autotune: bool = typer.Option(False, "--max-autotune", help="Also time torch.compile(mode='max-autotune')."),
    retune: bool = typer.Option(False, "--retune", help="Autotune again even where this GPU's choice is cached."),
    as_json: bool = JSON,
) -> None:
    """Time each kernel at the sample models' shapes on this GPU beside eager PyTorch and Inductor (exit 4 without
    a GPU); the timings the substitution pass decides from."""
    from tapeout.commands import kernels as command

    _done(command.bench(names, dtype, calls, max_autotune, retune, as_json))


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
    _forget_interrupt_in_embedded_code()
    sys.exit(143 if _terminated else 130)


def _forget_interrupt_in_embedded_code() -> None:
    """CPython ends a `python -m` process by SIGINT, whatever its exit code, once a KeyboardInterrupt has left a
    nested PyRun_* call (C extensions run Python that way, pybind11's exec among them) — so a SIGTERM that landed
    there exited -2, not 143. A nested run that succeeds clears that flag; the interrupt itself was handled."""
    try:
        import ctypes

        ctypes.pythonapi.PyRun_SimpleString(b"pass")
    except (ImportError, AttributeError, OSError):  # not CPython: no such flag
        pass


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
        from tapeout.core.console import on_sigint, quiet_dropped_interrupt

        signal.signal(signal.SIGINT, on_sigint)
        sys.unraisablehook = quiet_dropped_interrupt
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
        typer.echo(
            f"tapeout: error: {exc.strerror}{where} — free space, fix the permissions, or choose another path", err=True
        )
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
    typer.echo(
        "tapeout: internal error (a bug in tapeout, not in your model); please report it with the traceback above",
        err=True,
    )
    sys.exit(EXIT_INTERNAL)
