"""The commands that run the head of the build: `tapeout export` (the verified ONNX), `tapeout lint` (what the
target would reject) and `tapeout analyze` (the architecture and costs)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tapeout.commands.output import print_json
from tapeout.core.console import UI
from tapeout.core.errors import EXIT_BAD_INPUT, BadInput


def export(project: Path, out: Path | None, profile: str, as_json: bool) -> int:
    from tapeout.core.files import disk_full, out_of_space, output_file
    from tapeout.steps import flows
    from tapeout.steps.setup import for_build

    ui = UI()
    setup = for_build(project, profile, ui)
    target = output_file(Path(out) if out else setup.project.root / "build" / "model.onnx", "--out")
    # staged beside the target (same filesystem), then renamed: a failed or killed export leaves no half file
    try:
        with tempfile.TemporaryDirectory(prefix=f".{target.name}.partial-", dir=target.parent) as tmp:
            state = flows.export(setup, Path(tmp))
            for file in (Path(tmp) / "export").iterdir():
                name = target.name if file == state.exported.path else file.name
                os.replace(file, target.parent / name)
    except OSError as exc:
        if out_of_space(exc):
            raise disk_full(target.parent, exc) from exc
        raise
    info = {**state.exported.info, "path": str(target)}
    if as_json:
        print_json(info)
        return 0
    for p in info.get("parity", []):
        ui.out.print(
            f"  {p['output']}: max-abs {p['max_abs']:.3g} · max-rel {p['max_rel']:.3g} · cosine {p['cosine']:.6f}"
        )
    ui.out.print(f"wrote {target} ({info['exporter']}, opset {info.get('opset', '?')})")
    return 0


def lint(project: Path, profile: str) -> int:
    from tapeout.steps import flows
    from tapeout.steps.setup import for_build

    ui = UI()
    setup = for_build(project, profile, ui)
    with tempfile.TemporaryDirectory(prefix="tapeout-lint-") as tmp:
        issues = flows.export(setup, Path(tmp), flows.LINT, collect_lint=True).lint
    for issue in issues:
        ui.out.print(issue.line(), markup=False)
    errors = sum(i.severity == "error" for i in issues)
    ui.out.print(f"{setup.profile.target}: {errors} error(s), {len(issues) - errors} warning(s)")
    return EXIT_BAD_INPUT if errors else 0


def analyze(model: Path, dim: list[str], groups: bool, as_json: bool) -> int:
    from tapeout.graph.analyze import analyze as run_analysis
    from tapeout.reports.terminal import analysis_summary

    dims: dict[str, int] = {}
    for item in dim:
        name, _, value = item.partition("=")
        if not name or not value.isdigit() or int(value) <= 0:
            raise BadInput(
                f"--dim {item!r} is not NAME=VALUE with a positive integer value", fix="e.g. --dim sequence=128"
            )
        dims[name] = int(value)
    ui = UI()
    if model.suffix == ".onnx":
        if not model.is_file():
            raise BadInput(f"{model} not found", fix="check the path")
        result, title = run_analysis(model, None, dims), model.name
    else:
        from tapeout.steps import flows
        from tapeout.steps.analyze import hints_of
        from tapeout.steps.setup import for_build

        setup = for_build(model, "cpu-fp32", ui)
        project = setup.project
        with tempfile.TemporaryDirectory(prefix="tapeout-analyze-") as tmp:
            state = flows.export(setup, Path(tmp))
            with ui.step("analyze"):
                result = run_analysis(
                    state.exported.path, project.inputs, {**project.dims, **dims}, hints=hints_of(state.loaded)
                )
        title = project.display_name
    if as_json:
        print_json(result.to_json(top_costs=30))
        return 0
    analysis_summary(ui.out, title, result, show_groups=groups)
    return 0
