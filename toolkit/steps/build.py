"""`tapeout export` and `tapeout build`: source → verified ONNX → lint → compile → golden → measure → verdicts.

Everything a build writes goes into a staging directory that becomes the build dir only when
complete (StagedBuild); `manifest.json` is written last.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tapeout import targets
from tapeout.builds.staging import MANIFEST, StagedBuild
from tapeout.core.console import UI
from tapeout.core.errors import BadInput
from tapeout.core.files import write_json, write_text
from tapeout.core.hashing import sha256_file, tree_hashes, tree_size
from tapeout.core.host import package_versions
from tapeout.core.inputs import sample_inputs
from tapeout.core.metric import Predict, evaluate
from tapeout.core.parity import compare
from tapeout.core.paths import copy_onnx
from tapeout.estimation import bottleneck, cost_units, estimate
from tapeout.graph.analyze import analyze_view
from tapeout.graph.view import GraphView
from tapeout.measurement import verdicts
from tapeout.measurement.measure import placement_from_profile
from tapeout.records.golden import save_golden
from tapeout.records.manifest import SCHEMA
from tapeout.records.report import AccuracyInfo, ArtifactInfo, GoldenInfo, ProjectInfo, Report
from tapeout.reports import html_page
from tapeout.reports.markdown import render_markdown
from tapeout.steps import precision
from tapeout.steps.assemble import assemble
from tapeout.steps.check import measure_target
from tapeout.steps.judge import estimated_verdicts
from tapeout.steps.setup import Context, for_build

DEFAULT_OPSET = 20  # new enough for every exporter feature we use, old enough for TensorRT/QNN parsers


@dataclass
class Exported:
    path: Path
    info: dict[str, Any]
    reference: Predict
    loaded: Any
    lint: list | None = None  # already linted (ONNX sources are linted before they are copied)
    teacher: Predict | None = None  # the FP32 model before pruning: the accuracy reference when pruned
    pruning: dict | None = None


def export_model(ctx: Context, out_path: Path, *, raise_on_lint: bool = True, prune: bool = True) -> Exported:
    """Load the source and produce the FP32 ONNX model the target will compile, verified against torch.

    An ONNX source is linted before anything else; `raise_on_lint=False` returns its findings instead
    of stopping at the first error (what `tapeout lint` wants)."""
    from tapeout.exporters import sources

    project, target, ui = ctx.project, ctx.target, ctx.ui
    input_names = [s.name for s in project.inputs]
    with ui.step(f"load model ({project.model.source})"):
        loaded = sources.load(project.model.source, project.root, input_names, project.model.outputs)
    for note in loaded.notes:
        ui.note(note)
    if ctx.profile.pruning is not None and loaded.kind == "onnx":
        from tapeout.steps import prune as pruning_step

        pruning_step.require_torch(ctx, loaded)
    if loaded.kind == "onnx":
        import onnx

        # Lint the user's file first: a malformed model or wrong inputs fail with a message naming it.
        issues = (lint_or_raise(ctx, loaded.onnx_path) if raise_on_lint
                  else target.lint(loaded.onnx_path, project.inputs, project.dims))
        if any(i.severity == "error" for i in issues):  # only reachable with raise_on_lint=False
            return Exported(loaded.onnx_path, {"exporter": "none (ONNX source)"}, None, loaded, lint=issues)
        copy_onnx(loaded.onnx_path, out_path)  # every external-data file it names, none from outside its folder
        header = onnx.load(str(out_path), load_external_data=False)
        info = {"exporter": "none (ONNX source)",
                "opset": next((i.version for i in header.opset_import if i.domain in ("", "ai.onnx")), None),
                "ir_version": header.ir_version, "seconds": 0.0,
                "dynamic_dims": sorted({d.dim_param for i in header.graph.input
                                        for d in i.type.tensor_type.shape.dim if d.dim_param})}
        # The reference is always the FP32 model on ORT CPU, whatever the target.
        return Exported(out_path, info, targets.reference_session(out_path).run, loaded, lint=issues)

    from tapeout.exporters import torch_onnx

    pruning = teacher = None
    if ctx.profile.pruning is not None and prune:
        from tapeout.steps import prune as pruning_step

        loaded.module, pruning, teacher_module = pruning_step.run(ctx, loaded)

        def teacher(feeds):
            return torch_onnx.torch_outputs(teacher_module, feeds, input_names, loaded.output_names)
    limits = target.limits()
    opset = project.export.opset or min(DEFAULT_OPSET, limits.max_opset)
    if opset > limits.max_opset:
        raise BadInput(f"[export] opset = {opset} is newer than the target runtime supports ({limits.max_opset})",
                       fix=f"set [export] opset <= {limits.max_opset}")
    with ui.step("export to ONNX and verify against torch"):
        result = torch_onnx.export(
            loaded, project.inputs, project.dims, out_path, opset=opset, max_ir_version=limits.max_ir_version,
            dynamic=project.export.dynamic, atol=project.export.atol, rtol=project.export.rtol,
            samples=project.export.samples, seed=project.seed, log=ui.note,
        )
    info = {
        "exporter": result.exporter, "fallback_reason": result.fallback_reason, "opset": result.opset,
        "ir_version": result.ir_version, "seconds": result.seconds, "dynamic_dims": result.dynamic_dims,
        "output_names": result.output_names, "parity": [p.to_json() for p in result.parity],
    }

    def reference(feeds):
        return torch_onnx.torch_outputs(loaded.module, feeds, input_names, result.output_names)

    return Exported(out_path, info, reference, loaded, teacher=teacher, pruning=pruning)


def lint_or_raise(ctx: Context, model_path: Path) -> list:
    issues = ctx.target.lint(model_path, ctx.project.inputs, ctx.project.dims)
    errors = [i for i in issues if i.severity == "error"]
    if errors:
        more = f" (and {len(errors) - 1} more: run `tapeout lint`)" if len(errors) > 1 else ""
        raise BadInput(f"lint: {errors[0].problem}{more}", fix=errors[0].fix)
    return issues


def build(project_dir: Path | str, profile_name: str, out: Path | None, ui: UI, strict: bool = False) -> Report:
    ctx = for_build(project_dir, profile_name, ui)
    out = Path(out) if out else ctx.project.root / "build" / ctx.profile.name
    with StagedBuild(out, log=ui.note) as stage:
        ctx.stage = stage
        report = _build_into(ctx, str(out), strict)
        write_json(stage / "report.json", report.to_json())
        write_text(stage / "report.md", render_markdown(report))
        write_text(stage / "report.html", html_page.render(report))
        write_json(stage / MANIFEST, _manifest(ctx, report))
    return report


def _build_into(ctx: Context, build_dir: str, strict: bool) -> Report:
    project, profile, target, ui, stage = ctx.project, ctx.profile, ctx.target, ctx.ui, ctx.stage
    exported = export_model(ctx, stage / "export" / "model.onnx")
    with ui.step(f"lint for {profile.target}"):
        issues = exported.lint if exported.lint is not None else lint_or_raise(ctx, exported.path)
    fp32_path = target.prepare(exported.path, project.inputs, project.dims)  # e.g. NPUs: pin dims before quantizing

    with ui.step("analyze the model (architecture, costs, activation memory)"):
        view = GraphView.load(fp32_path, project.inputs, project.dims)
        analysis = analyze_view(view, hints=hints_of(exported.loaded))
        kernel_structure = cost_units.structure(view, analysis)  # for the estimate, once the precision is planned
        del view  # the weights it holds are not needed again
    ref_metric = None
    if project.evaluation is not None:
        with ui.step(f"evaluate {project.evaluation.name} on the FP32 reference"):
            ref_metric = evaluate(project, exported.teacher or exported.reference)
        if exported.pruning is not None and profile.precision != "fp32":  # the most a precision can reach (at fp32
            # the artifact's own evaluation says it)
            with ui.step(f"evaluate {project.evaluation.name} on the pruned FP32 model"):
                exported.pruning["metric_fp32"] = evaluate(project, exported.reference)
    model_path, quantization = fp32_path, None
    if profile.precision != "fp32":
        ceiling = (exported.pruning or {}).get("metric_fp32")
        model_path, quantization = precision.quantize(ctx, fp32_path, analysis, ref_metric, ceiling)

    with ui.step(f"compile for {profile.target}" + (" (all but the engine: it is compiled on the device)"
                                                     if ctx.capabilities.compile_on == "device" else "")):
        artifact = target.compile(model_path, stage / "artifact", project.inputs, project.dims)
    engine = None
    if ctx.capabilities.compile_on == "device" and not ctx.deferred:  # the device is here: build its engine now
        with ui.step(f"build the {profile.target} engine on this device"):
            engine = target.build_engine(artifact, ui.detail)
        ui.note(engine.line())

    with ui.step("golden inputs and reference outputs"):
        golden_inputs, golden_source = sample_inputs(project, project.golden_samples)
        reference_outputs = [exported.reference(feeds) for feeds in golden_inputs]
        save_golden(stage / "golden.npz", golden_inputs, reference_outputs)

    m, settings = measure_target(ctx, artifact, stage / "golden.npz", profile.check)
    parity = compare(reference_outputs, m.outputs, profile.check.parity.atol, profile.check.parity.rtol)
    placement = artifact.meta.get("placement")
    if placement is None and ctx.capabilities.accelerator:
        placement = placement_from_profile(m.op_profile, ctx.capabilities.accelerator)

    accuracy = None
    if project.evaluation is not None:
        emulated = ctx.emulated
        with ui.step(f"evaluate {project.evaluation.name} on the artifact" + (" (CPU EP: emulated target)" if emulated else "")):
            if emulated:  # the metric on the graph the artifact was compiled from; golden parity covers the rest
                art_metric = ((quantization or {}).get("search") or {}).get("metric")  # the loop scored it already
                if art_metric is None:
                    art_metric = evaluate(project, targets.reference_session(model_path).run)
            else:
                art_metric = evaluate(project, target.session(artifact).run)
        accuracy = AccuracyInfo(metric=project.evaluation.name, direction=project.evaluation.direction,
                                reference=ref_metric, artifact=art_metric,
                                where=precision.evaluated_on(ctx) if emulated else "at build, on this host")

    with ui.step("estimate latency on the device (roofline, calibrated where measured)"):
        est = estimate.for_model(ctx, kernel_structure, (quantization or {}).get("plan"), (m.device or {}).get("name"))
    ui.note(est.line() if est else "no estimate: the profile names no device spec to estimate for, and no shipped "
            "one matches the device that ran it (set `device = ...` in the profile)")
    p50 = None if ctx.emulated else m.latency.quantiles["p50"].point
    bottlenecks = None if ctx.emulated or est is None else bottleneck.view(m.op_profile, est.roof, p50)

    artifact_bytes = tree_size(artifact.directory)
    artifact_files = tree_hashes(artifact.directory)  # hashed once: report and manifest share it
    budgets = [
        *verdicts.judge_on_device(profile.budgets, m, settings, ctx.emulated, estimated_verdicts(profile.budgets, est, ctx.emulated)),
        *verdicts.judge_artifact(profile.budgets, artifact_bytes),
        *verdicts.judge_placement(profile.budgets, placement),
        verdicts.judge_parity(parity, profile.check.parity),
        *verdicts.judge_accuracy(profile.budgets, accuracy and accuracy.reference, accuracy and accuracy.artifact,
                                 accuracy and accuracy.direction, accuracy.metric if accuracy else "metric"),
    ]
    return assemble(
        "build", ctx, build_dir=build_dir, strict=strict,
        project=ProjectInfo(name=project.display_name, source=project.model.source, file=str(project.file)),
        artifact=ArtifactInfo(main_file=artifact.main_file, bytes=artifact_bytes, sha256=artifact_files[artifact.main_file],
                              files=artifact_files, meta=artifact.meta),
        golden=GoldenInfo(samples=len(golden_inputs), source=golden_source,
                          reference=("the pruned torch module (FP32)" if exported.pruning else "torch (FP32)")
                          if exported.loaded.kind == "torch"
                          else "the source ONNX model (FP32, ORT CPU)"),
        m=m, parity=parity, budgets=budgets, accuracy=accuracy, placement=placement,
        engine=engine.to_json() if engine else None,
        estimate=estimate.with_measured(est, p50) if est else None, bottlenecks=bottlenecks,
        model={"kind": exported.loaded.kind, "description": exported.loaded.description,
               "weights_sha256": exported.loaded.weights_sha256 or sha256_file(exported.loaded.onnx_path),
               "files": {str(f.name): sha256_file(f) for f in exported.loaded.files}},
        export=exported.info, analysis=analysis.to_json(), quantization=quantization, pruning=exported.pruning,
        lint=[i.line() for i in issues],
    )


def hints_of(loaded) -> dict:
    """What the torch side says about the architecture (a Hugging Face config), to back the graph's evidence."""
    config = getattr(getattr(loaded, "module", None), "config", None)
    if config is None:
        return {}
    return {"model_type": getattr(config, "model_type", None), "architectures": getattr(config, "architectures", None)}


def _manifest(ctx: Context, report: Report) -> dict:
    stage, project, profile = ctx.stage, ctx.project, ctx.profile
    golden = stage / "golden.npz"
    data = report.to_json()
    return {
        "schema": SCHEMA,
        "created": report.created,
        "project": {"name": project.display_name, "file": str(project.file),
                    "file_sha256": sha256_file(project.file), "source": project.model.source,
                    "inputs": [s.model_dump() for s in project.inputs], "dims": project.dims},
        "model": {**data["model"], "export": data["export"], "export_sha256": tree_hashes(stage / "export")},
        "calibration": {"source": report.golden.source,
                        "sha256": sha256_file(project.root / project.calibration.data)
                        if project.calibration and project.calibration.data.endswith(".npz") else None},
        "artifact": {"target": profile.target, "main_file": report.artifact.main_file, "meta": data["artifact"]["meta"],
                     "files": report.artifact.files, "bytes": report.artifact.bytes},
        "golden": {"file": "golden.npz", "sha256": sha256_file(golden), "samples": report.golden.samples},
        # check carries verdicts over from report.json: its hash makes them part of what is verified
        "report": {"file": "report.json", "sha256": sha256_file(stage / "report.json")},
        "profile": profile.model_dump(mode="json"),
        "device_spec": ctx.device.model_dump(mode="json") if ctx.device else None,
        "quantization": None if report.quantization is None else {
            "model_sha256": data["quantization"]["model_sha256"], "plan": data["quantization"]["plan"]},
        "options_resolved": ctx.target.options.model_dump(mode="json"),
        "budgets": profile.budgets.model_dump(mode="json", exclude_none=True),
        "versions": package_versions(),
        "host": data["host"],
        "seeds": {"project": project.seed},
    }
