"""Step `export`: the FP32 ONNX model the target's side starts from, verified against torch; an ONNX source is
linted first, then copied as given. Where the target compiles from torch.export, its ExportedProgram too.

`build -p A -p B` exports once: the first candidate that needs an export with given options makes it, and
the others copy its files and reuse its reference (`ExportShare`); a candidate that prunes exports its own.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

from tapeout import targets
from tapeout.core.errors import BadInput
from tapeout.core.paths import copy_onnx
from tapeout.records.report import ExportInfo
from tapeout.steps import export_cache
from tapeout.steps.state import BuildState, Exported
from tapeout.steps.step import Step


class ExportShare:
    """Exports made for one project, reused by its other candidates while `build -p A -p B` runs."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="tapeout-shared-export-"))
        self._entries: dict[object, tuple[Exported, Path, str]] = {}

    def get(self, key: object) -> tuple[Exported, Path, str] | None:
        return self._entries.get(key)

    def put(self, key: object, exported: Exported, profile: str) -> None:
        folder = self.folder / str(len(self._entries))
        shutil.copytree(exported.path.parent, folder)
        self._entries[key] = (exported, folder, profile)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _export_passes(proto, records: list[dict]):
    """The export stage's graph passes (built in: fold the recurrent weights; and any plug-in's), on the exported
    model before it is saved and verified; what each did goes into `records`."""
    from tapeout.quantize import passes
    from tapeout.quantize.passes.base import run_on_proto

    proto, found = run_on_proto(proto, passes.export_passes())
    records += found
    return proto


def lint_or_raise(state: BuildState, model_path: Path) -> list:
    """The target's lint of `model_path`: every finding, or one line for the first error (`tapeout lint` lists all)."""
    project = state.setup.project
    return _raise_for_errors(state, state.setup.target.lint(model_path, project.inputs, project.dims))


def _raise_for_errors(state: BuildState, issues: list) -> list:
    errors = [i for i in issues if i.severity == "error"]
    if errors and not state.collect_lint:
        more = f" (and {len(errors) - 1} more: run `tapeout lint`)" if len(errors) > 1 else ""
        raise BadInput(f"lint: {errors[0].problem}{more}", fix=errors[0].fix)
    return issues


def _torch_reference(loaded, project, output_names):
    """The FP32 reference: the loaded torch module's outputs on given feeds. It reads `loaded.module` at each call and
    keeps no module of its own, so the release step's letting go of the module frees it."""
    from tapeout.exporters import torch_onnx

    names = [s.name for s in project.inputs]

    def reference(feeds):
        if loaded.module is None:
            raise RuntimeError("internal: the FP32 torch reference ran after the release step let the module go")
        return torch_onnx.torch_outputs(loaded.module, feeds, names, output_names)

    return reference


def _loads(path: Path) -> bool:
    """Whether onnx reads the file at all (its graph, not its weights): what a source pass needs before it looks."""
    import onnx

    try:
        onnx.load(str(path), load_external_data=False)
    except Exception:  # a malformed file: the lint's finding says what is wrong
        return False
    return True


def _same_function(project, source: Path, rewritten: Path, applied: list[str]) -> None:
    """The rewritten model's outputs are the source's on the project's sample inputs, or one line naming the pass."""
    import numpy as np

    from tapeout.core.inputs import sample_inputs

    feeds, where = sample_inputs(project, 3)
    for spec in project.inputs:  # a pinned input is a constant of the build: real samples must agree with it
        if spec.range is not None and spec.range[0] == spec.range[1]:
            off = next((s[spec.name] for s in feeds if not np.all(s[spec.name] == spec.range[0])), None)
            if off is not None:
                raise BadInput(
                    f"{where} gives {spec.name} = {np.asarray(off).ravel()[0]:g}, and [[inputs]] range pins it to "
                    f"{spec.range[0]:g}",
                    fix=f"give samples at {spec.name} = {spec.range[0]:g}, or widen its range",
                )
    before, after = targets.reference_session(source), targets.reference_session(rewritten)
    for sample in feeds:
        expected, got = before.run(sample), after.run(sample)
        for name, value in expected.items():
            if got[name].shape != value.shape or not np.allclose(got[name], value, rtol=1e-4, atol=1e-5):
                raise BadInput(
                    f"graph pass {', '.join(applied)} changed the model's output {name} on a sample input",
                    fix="report it to the pass's author; uninstall a plug-in pass to build without it",
                )


class Export(Step):
    name = "export"
    needs = ("loaded",)
    adds = ("exported",)

    def run(self, state: BuildState) -> None:
        out = state.out / "export" / "model.onnx"
        state.exported = self._onnx_source(state, out) if state.loaded.kind == "onnx" else self._torch(state, out)
        state.passes += state.exported.passes

    def _onnx_source(self, state: BuildState, out: Path) -> Exported:
        import onnx

        from tapeout.quantize import passes
        from tapeout.quantize.passes.base import not_run

        if state.setup.capabilities.compiles_from == "torch.export":
            raise BadInput(
                f"target '{state.setup.target.name}' compiles from a torch.export program, and the project's "
                f"[model] source is an ONNX file",
                fix="point [model] source at the torch module "
                "(file.py:callable, a Hugging Face directory or a .pt2), or use a target that takes ONNX",
            )
        source = state.loaded.onnx_path
        project = state.setup.project
        # Lint the user's file first: a malformed model or wrong inputs fail with a message naming it. Where a source
        # pass rewrites the model (an If folded to its branch), the rewritten model is what the target gets and is
        # linted instead: an op the target refuses may have been in the branch not taken.
        issues = state.setup.target.lint(source, project.inputs, project.dims)
        made = passes.source_passes(project.inputs, project.dims)
        ready = [p for p in made if p.precondition(None) is None]  # decided from the project, before any load
        records = [not_run(p, p.precondition(None)) for p in made if p not in ready]
        failed = any(i.severity == "error" for i in issues)
        if not failed or (ready and _loads(source)):
            copy_onnx(source, out)  # every external-data file it names, none from outside its folder
            if ready:
                records += self._source_passes(state, ready, source, out)
                if any(r["outcome"] == "applied" for r in records):
                    issues = state.setup.target.lint(out, project.inputs, project.dims)
        _raise_for_errors(state, issues)
        if any(i.severity == "error" for i in issues):  # only reachable when collecting (`tapeout lint`)
            return Exported(source, {"exporter": "none (ONNX source)"}, None, lint=issues)
        header = onnx.load(str(out), load_external_data=False)
        info = {
            "exporter": "none (ONNX source)",
            "opset": next((i.version for i in header.opset_import if i.domain in ("", "ai.onnx")), None),
            "ir_version": header.ir_version,
            "seconds": 0.0,
            "dynamic_dims": sorted(
                {d.dim_param for i in header.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
            ),
        }
        # The reference is always the FP32 model on ORT CPU, whatever the target.
        return Exported(out, info, targets.reference_session(out).run, lint=issues, passes=records)

    @staticmethod
    def _source_passes(state: BuildState, ready: list, source: Path, out: Path) -> list[dict]:
        """The source stage's graph passes on the copy `out`; where one rewrote it, the copy is replaced by the
        rewritten model, which must compute what the source does on sample inputs. What each did, for the report."""
        import onnx

        from tapeout.core.onnx_graphs import save_model
        from tapeout.quantize.passes.base import run_on_proto

        project = state.setup.project
        proto, records = run_on_proto(onnx.load(str(out)), ready)
        applied = [r["name"] for r in records if r["outcome"] == "applied"]
        if applied:
            shutil.rmtree(out.parent)  # the copy and its external data, replaced by the rewritten model
            out.parent.mkdir(parents=True)
            save_model(proto, out)
            del proto
            _same_function(project, source, out, applied)
        return records

    def _torch(self, state: BuildState, out: Path) -> Exported:
        from tapeout.exporters import torch_onnx

        setup, loaded = state.setup, state.loaded
        project = setup.project
        limits = setup.target.limits()
        options = torch_onnx.ExportOptions.for_project(project, limits.max_opset, limits.max_ir_version)
        program_wanted = setup.capabilities.compiles_from == "torch.export"
        share = state.shared if state.pruning is None else None  # a pruned module is this candidate's own
        key = (options, program_wanted)
        cached = share.get(key) if share is not None else None
        if cached is not None:
            exported, folder, first = cached
            shutil.copytree(folder, out.parent, dirs_exist_ok=True)
            state.ui.note(
                f"export shared with candidate {first} (same opset {options.opset}, IR version "
                f"{options.max_ir_version} and tolerances)"
            )
            # the first candidate's reference runs its own module, which its release step lets go: this one's runs ours
            reference = _torch_reference(loaded, project, exported.info.get("output_names"))
            return dataclasses.replace(exported, path=out, reference=reference)
        disk = self._from_cache(state, options, program_wanted, out)
        if isinstance(disk, Exported):
            if share is not None:
                share.put(key, disk, setup.profile.name)
            return disk
        records: list[dict] = []
        workload = state.workload
        dims = workload.export_dims(project)
        with state.ui.step("export to ONNX and verify against torch"):
            result = torch_onnx.export(
                loaded,
                project.inputs,
                dims,
                out,
                options,
                log=state.ui.note,
                rewrite=lambda proto: _export_passes(proto, records),
                stage=state.ui.detail,
            )
        verification, greedy_tokens = workload.verify_export(project, loaded.module, out, options, state.ui)
        program = None
        if program_wanted:
            with state.ui.step("export the torch.export program"):
                program = torch_onnx.export_program(loaded, project.inputs, project.dims, options)
        info = {
            "exporter": result.exporter,
            "fallback_reason": result.fallback_reason,
            "opset": result.opset,
            "ir_version": result.ir_version,
            "seconds": result.seconds,
            "dynamic_dims": result.dynamic_dims,
            "output_names": result.output_names,
            "parity": [p.to_json() for p in result.parity],
        }
        if verification is not None:
            info["generation"] = verification.to_json()
        reference = _torch_reference(loaded, project, result.output_names)
        exported = Exported(out, info, reference, program=program, passes=records, greedy_tokens=greedy_tokens)
        if share is not None:
            share.put(key, exported, setup.profile.name)
        if disk is not None:
            folder, entry = disk
            try:
                export_cache.store(folder, entry, out.parent, info, records, greedy_tokens)
            except OSError as exc:  # a cache that cannot be written costs the next build an export, not this one
                state.ui.note(f"export cache: could not keep this export in {folder} ({exc.strerror or exc})")
        return exported

    def _from_cache(self, state: BuildState, options, program_wanted: bool, out: Path):
        """The export from the cache (steps/export_cache.py) as this build's; else (its folder, the entry to write
        once exported), or None where no cache applies (turned off, a pruned module, a torch.export program)."""
        folder = export_cache.root()
        if folder is None or program_wanted or state.pruning is not None:
            return None
        from tapeout.quantize import passes

        project, loaded = state.setup.project, state.loaded
        entry = export_cache.key(loaded.module, project, options, Path(project.root), passes.names())
        found = export_cache.load(folder, entry, out)
        if isinstance(found, str):
            if found:
                state.ui.note(f"export cache: {found}; exporting afresh")
            return folder, entry
        info, records, greedy_tokens = found
        state.ui.note(f"export reused from the cache (same weights, project, settings and versions): {folder / entry}")
        reference = _torch_reference(loaded, project, info.get("output_names"))
        return Exported(out, {**info, "cached": True}, reference, passes=records, greedy_tokens=greedy_tokens)

    def report(self, state: BuildState) -> dict[str, object]:
        return {"export": ExportInfo.model_validate(state.exported.info)}
