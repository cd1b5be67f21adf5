"""NVIDIA TensorRT engines (GPUs and Jetson), compiled on the device; TensorRT for RTX as a flavour.

An engine is tied to the GPU model, the TensorRT version and the driver, so `build` writes everything
but the engine (`compile_on = "device"`): the ONNX to compile, with its precision already in the graph
(TensorRT 11 networks are strongly typed: FP16 as FP16 tensors, INT8/FP8 as explicit symmetric Q/DQ
from the precision step; no builder precision flags, no calibrators), and `engine-settings.json` (the
optimization profile per input from `[dims]` and the options, and the builder settings). The first
`check` on the device builds the engine, with a timing cache, into `engines/` beside the artifact,
keyed by GPU, compute capability, TensorRT version, driver, ONNX hash and settings; later checks
reuse it, and a check on another GPU or TensorRT says what it rebuilt and why.

Written against TensorRT's Python API (10.12+ and 11.x; research nvidia.md §1). The full builder is not
installable on the CI machine, so the tests check tapeout's side of this contract against a stand-in
built from the TensorRT API's own stubs (tests/trt_standin.py); tests/gpu/ runs the real thing.
"""

from __future__ import annotations

import importlib
import json
import re
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tapeout.core.artifact import Artifact
from tapeout.core.errors import BadInput, TargetUnavailable, first_line
from tapeout.core.paths import copy_onnx
from tapeout.core.schemas import InputSpec
from tapeout.targets.base import EngineBuild, LintIssue, OpProfile, Probe, RuntimeLimits, Session, Target

ARTIFACT_FILE = "model.onnx"
SETTINGS_FILE = "engine-settings.json"  # engine_cache.SETTINGS_FILE
SETTINGS_SCHEMA = "tapeout.engine-settings/1"
SUPPORT_DATA = Path(__file__).parent / "data" / "tensorrt-onnx-support.json"
MODULES = {"tensorrt": "tensorrt", "tensorrt_rtx": "tensorrt_rtx"}
INSTALL = {
    "tensorrt": 'on the device: pip install "tapeout[cuda]" tensorrt (NVIDIA\'s wheels; the libs come from '
    "pypi.nvidia.com), or use the TensorRT of JetPack / an NGC container",
    "tensorrt_rtx": "on the device (an RTX GPU): pip install tensorrt-rtx (from pypi.nvidia.com)",
}


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    flavour: Literal["tensorrt", "tensorrt_rtx"] = Field(
        "tensorrt", description="tensorrt, or TensorRT for RTX (JIT-compiled engines for RTX GPUs)"
    )
    prepared_for: str = Field(
        "11.4",
        pattern=r"^\d+\.\d+$",
        description="the TensorRT version the ONNX is linted "
        "for (operator support, opset); recorded in the manifest, compared at check",
    )
    device_id: int = Field(0, ge=0, le=1023)
    optimization_level: int = Field(
        3, ge=0, le=5, description="builder optimization level (TensorRT's default 3; 5 may take hours on big models)"
    )
    workspace_mb: int | None = Field(
        None,
        ge=1,
        le=2**24,
        description="cap on the builder's workspace pool (default: all GPU memory; cap it on a Jetson)",
    )
    tf32: bool = Field(False, description="let FP32 layers use TF32 (TensorRT's own default is on)")
    sparse_weights: bool = Field(
        False, description="let the builder pick 2:4 sparse kernels where weights allow (Ampere and newer)"
    )
    version_compatible: bool = Field(
        False, description="engine runs on later TensorRT versions (lean runtime embedded; may be slower)"
    )
    hardware_compatibility: Literal["none", "ampere_plus", "same_compute_capability"] = "none"
    cuda_graph: bool = Field(False, description="capture the run once and replay it as a CUDA graph")
    timing_cache: bool = Field(
        True,
        description="keep the builder's timing cache per GPU and TensorRT version "
        "beside the engines (rebuilds take seconds, not minutes)",
    )
    dims_min: dict[str, int] = Field(
        default_factory=dict, description="optimization profile minimum per symbolic dim (default: the [dims] value)"
    )
    dims_max: dict[str, int] = Field(
        default_factory=dict, description="optimization profile maximum per symbolic dim (default: the [dims] value)"
    )


class InputProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min: list[int]
    opt: list[int]
    max: list[int]


class EngineSettings(BaseModel):
    """engine-settings.json: what the device needs, besides the ONNX, to build the engine the build meant."""

    model_config = ConfigDict(extra="forbid")

    schema_id: Literal["tapeout.engine-settings/1"] = Field(alias="schema")
    flavour: Literal["tensorrt", "tensorrt_rtx"]
    prepared_for: str
    strongly_typed: bool = True
    profile: dict[str, InputProfile]
    builder: dict[str, int | bool | str | None]
    expect: list[Literal["FP32", "FP16", "BF16", "INT8", "FP8"]] = Field(
        description="precisions the ONNX holds: the built engine must have layers in each"
    )


# ---------------------------------------------------------------- host side


def onnx_precisions(model) -> list[str]:
    """What precision the graph asks for, from its tensors: FP16 initializers or casts, INT8/FP8 Q/DQ."""
    from onnx import TensorProto

    found = {"FP32"}
    types = {i.data_type for i in model.graph.initializer}
    types |= {a.i for n in model.graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"}
    if TensorProto.FLOAT16 in types:
        found.add("FP16")
    if TensorProto.BFLOAT16 in types:
        found.add("BF16")
    inits = {i.name: i.data_type for i in model.graph.initializer}
    fp8 = (TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2)
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear":  # the zero point's type (or output_dtype) is the quantized type
            zp = inits.get(node.input[2]) if len(node.input) > 2 else None
            out = next((a.i for a in node.attribute if a.name == "output_dtype"), None)
            found.add("FP8" if zp in fp8 or out in fp8 else "INT8")
    return sorted(found)


def optimization_profile(model, inputs: list[InputSpec], dims: dict[str, int], options: Options) -> dict[str, dict]:
    """min/opt/max per graph input: opt is the [dims] value, min and max from the options (default opt)."""
    declared = {s.name: s for s in inputs}
    profile = {}
    for value in model.graph.input:
        spec = declared.get(value.name)
        shape = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]
        if spec is not None and len(spec.shape) == len(shape):
            shape = [
                s if isinstance(s, int) else (g if isinstance(g, int) and g > 0 else s)
                for s, g in zip(spec.shape, shape, strict=True)
            ]
        opt, lo, hi = [], [], []
        for d in shape:
            if isinstance(d, int) and d > 0:
                opt.append(d), lo.append(d), hi.append(d)
                continue
            if d not in dims:
                raise BadInput(
                    f"input '{value.name}' has symbolic dim '{d}' with no value in [dims]",
                    fix=f"add {d} = N to the project's [dims] (the engine's optimal shape)",
                )
            lo.append(options.dims_min.get(d, dims[d]))
            opt.append(dims[d])
            hi.append(options.dims_max.get(d, dims[d]))
            if not lo[-1] <= opt[-1] <= hi[-1]:
                raise BadInput(
                    f"optimization profile for dim '{d}': min {lo[-1]} ≤ opt {opt[-1]} ≤ max {hi[-1]} does not hold",
                    fix="fix [options] dims_min / dims_max, or the project's [dims]",
                )
        profile[value.name] = {"min": lo, "opt": opt, "max": hi}
    unknown = sorted((set(options.dims_min) | set(options.dims_max)) - set(dims))
    if unknown:
        raise BadInput(
            f"[options] dims_min/dims_max name dim(s) {', '.join(unknown)} not in the project's [dims]",
            fix=f"use the dims the project declares: {', '.join(dims) or 'none'}",
        )
    return profile


@cache
def support_data() -> dict:
    return json.loads(SUPPORT_DATA.read_text())


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


def supported_ops(version: str) -> tuple[set[str], set[str], tuple[int, int]]:
    """(supported op types, unsupported op types, opset range) of TensorRT's ONNX parser at `version`."""
    data = support_data()
    ops = set(data["ops"])
    for since, added in data["added"].items():
        if _version_tuple(version) >= _version_tuple(since):
            ops |= set(added)
    ranges = sorted(data["opset_range"].items(), key=lambda kv: _version_tuple(kv[0]))
    opset = next(
        (tuple(r) for v, r in reversed(ranges) if _version_tuple(version) >= _version_tuple(v)), tuple(ranges[0][1])
    )
    return ops, set(data["unsupported"]) - ops, opset


def lint_ops(model, version: str) -> list[LintIssue]:
    """Operators, domains, opset, types, dynamic-shape limits and Q/DQ zero points against TensorRT `version`'s
    ONNX parser, naming nodes (the parser itself has the last word on the device)."""
    from onnx import TensorProto

    from tapeout.core.onnx_graphs import nonzero_zero_points

    ops, unsupported, (lo, hi) = supported_ops(version)
    restrictions = {name: entry.get("restrictions", "") for name, entry in support_data()["ops"].items()}
    issues = []
    opset = next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), None)
    if opset is not None and not lo <= opset <= hi:
        issues.append(
            LintIssue(
                "error",
                f"opset {opset} is outside TensorRT {version}'s parser range {lo}..{hi}",
                f"export with [export] opset between {lo} and {hi}",
            )
        )
    dynamic = any(d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim)
    constant = {i.name for i in model.graph.initializer} | {
        o for n in model.graph.node if n.op_type == "Constant" for o in n.output
    }
    for node in model.graph.node:
        where = node.name or node.output[0]
        if node.domain not in ("", "ai.onnx"):
            issues.append(
                LintIssue(
                    "error",
                    f"{node.domain}::{node.op_type} is a custom operator: TensorRT's ONNX parser needs a plugin for it",
                    "export without custom ops (plain ONNX operators), or register a TensorRT plugin on the device",
                    where,
                )
            )
        elif node.op_type in unsupported:
            issues.append(
                LintIssue(
                    "error",
                    f"{node.op_type} is not supported by TensorRT {version}'s ONNX parser",
                    "rewrite or remove it before export (see docs/target-contract.md)",
                    where,
                )
            )
        elif node.op_type not in ops:
            issues.append(
                LintIssue(
                    "warning",
                    f"{node.op_type} is not in TensorRT {version}'s operator list "
                    "(newer than the list tapeout carries?)",
                    "the parser decides on the device",
                    where,
                )
            )
        elif dynamic and "dynamic" in restrictions.get(node.op_type, "").lower():
            issues.append(
                LintIssue(
                    "warning",
                    f"{node.op_type}: {restrictions[node.op_type]}",
                    "pin the shapes: dims_min = dims_max = the [dims] values",
                    where,
                )
            )
        else:
            for name in _computed_but_must_be_initializer(node, restrictions.get(node.op_type, ""), constant, opset):
                issues.append(
                    LintIssue(
                        "warning",
                        f"{node.op_type} input `{name}` is computed, and TensorRT's parser wants an initializer there",
                        "export with constant folding (the default exporter folds it), or make it a constant",
                        where,
                    )
                )
    doubles = [i.name for i in model.graph.initializer if i.data_type == TensorProto.DOUBLE]
    doubles += [i.name for i in model.graph.input if i.type.tensor_type.elem_type == TensorProto.DOUBLE]
    if doubles:
        issues.append(
            LintIssue(
                "warning",
                f"{len(doubles)} float64 tensor(s) ({', '.join(doubles[:3])}): TensorRT casts "
                "DOUBLE down to FLOAT, clamping to ±FLT_MAX",
                "export float32",
                doubles[0],
            )
        )
    for name in nonzero_zero_points(model):
        issues.append(
            LintIssue(
                "error",
                "Q/DQ with a non-zero zero point: TensorRT takes symmetric quantization only",
                "quantize with the tensorrt profiles (symmetric Q/DQ)",
                name,
            )
        )
    return issues


def _computed_but_must_be_initializer(node, restriction: str, constant: set[str], opset: int | None) -> list[str]:
    """The inputs a restriction like "`axes` must be an initializer" names, where the graph computes them."""
    import re as _re

    from onnx import defs

    wanted = _re.findall(r"`(\w+)` (?:input )?must be an initializer", restriction)
    if not wanted:
        return []
    try:
        schema = defs.get_schema(node.op_type, opset or defs.onnx_opset_version())
    except Exception:  # an op type onnx does not know at that opset: the parser decides
        return []
    names = [i.name for i in schema.inputs]
    return [
        w
        for w in wanted
        if w in names
        and names.index(w) < len(node.input)
        and node.input[names.index(w)]
        and node.input[names.index(w)] not in constant
    ]


# ---------------------------------------------------------------- the target


class TensorRT(Target):
    Options = Options

    @classmethod
    def probe(cls) -> Probe:
        found = []
        for flavour, module in MODULES.items():
            try:
                trt = importlib.import_module(module)
            except Exception as exc:  # ImportError, or a libs package that cannot load libnvinfer
                found.append((flavour, None, first_line(exc)))
                continue
            found.append((flavour, getattr(trt, "__version__", "unknown"), ""))
        have = [(f, v) for f, v, _ in found if v]
        if not have:
            return Probe(
                False,
                reason="TensorRT is not installed here (neither tensorrt nor tensorrt_rtx imports; "
                "its full builder is not on the public package index)",
                install_hint=INSTALL["tensorrt"],
                details={f: why for f, _, why in found},
            )
        return Probe(True, version=", ".join(f"{f} {v}" for f, v in have), details={f: v for f, v in have})

    def _trt(self):
        module = MODULES[self.options.flavour]
        try:
            return importlib.import_module(module)
        except Exception as exc:
            raise TargetUnavailable(
                f"target 'tensorrt' (flavour {self.options.flavour}) is not available here: "
                f"{module} does not import ({first_line(exc)})",
                fix=INSTALL[self.options.flavour],
            ) from None

    def preflight(self) -> None:
        """The flavour's module and a CUDA GPU: without both there is no engine to build or run here."""
        from tapeout.targets import cuda_rt

        self._trt()
        cuda_rt.gpu(self.options.device_id)

    def limits(self) -> RuntimeLimits:
        from tapeout.targets.onnx_lint import ort_limits

        ort = ort_limits()
        _, _, (_, hi) = supported_ops(self.options.prepared_for)
        return RuntimeLimits(ort.max_ir_version, min(ort.max_opset, hi))

    def lint(self, model_path: Path, inputs: list[InputSpec], dims: dict[str, int]) -> list[LintIssue]:
        import onnx

        issues = super().lint(model_path, inputs, dims)
        if any(i.severity == "error" for i in issues):
            return issues
        return issues + lint_ops(onnx.load(str(model_path), load_external_data=False), self.options.prepared_for)

    def compile(self, model_path: Path, out_dir: Path, inputs: list[InputSpec], dims: dict[str, int]) -> Artifact:
        """The ONNX the engine is compiled from, and engine-settings.json; the engine is built by build_engine."""
        import onnx

        out_dir.mkdir(parents=True, exist_ok=True)
        copy_onnx(model_path, out_dir / ARTIFACT_FILE)
        header = onnx.load(str(out_dir / ARTIFACT_FILE), load_external_data=False)
        errors = [i for i in lint_ops(header, self.options.prepared_for) if i.severity == "error"]
        if errors:  # the precision step may have added what the source did not have (custom ops, asymmetric Q/DQ)
            raise BadInput(f"lint of the model to compile: {errors[0].line()}", fix=errors[0].fix)
        o = self.options
        settings = {
            "schema": SETTINGS_SCHEMA,
            "flavour": o.flavour,
            "prepared_for": o.prepared_for,
            "strongly_typed": True,
            "profile": optimization_profile(header, inputs, dims, o),
            "builder": {
                "optimization_level": o.optimization_level,
                "workspace_mb": o.workspace_mb,
                "tf32": o.tf32,
                "sparse_weights": o.sparse_weights,
                "version_compatible": o.version_compatible,
                "hardware_compatibility": o.hardware_compatibility,
            },
            "expect": onnx_precisions(header),
        }
        (out_dir / SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n")
        return Artifact(
            self.name,
            out_dir,
            ARTIFACT_FILE,
            meta={
                "engine": "compiled on the device at the first `tapeout check`, cached in engines/",
                "flavour": o.flavour,
                "prepared_for": f"{o.flavour} {o.prepared_for}",
                "optimization_profile": settings["profile"],
                "precisions_in_onnx": settings["expect"],
                "qdq_pairs": sum(n.op_type == "QuantizeLinear" for n in header.graph.node),
            },
        )

    # ------------------------------------------------------------ device side

    def _settings(self, artifact: Artifact) -> EngineSettings:
        from tapeout.targets import engine_cache

        return engine_cache.read_settings(artifact.directory, EngineSettings, SETTINGS_SCHEMA)

    def _device(self, artifact: Artifact):
        """(tensorrt module, GPU, settings, cache entry) for this device: the key names everything an engine is
        tied to, so another GPU, TensorRT, driver, ONNX or setting is another entry."""
        from tapeout.core.hashing import sha256_file
        from tapeout.targets import cuda_rt, engine_cache

        trt = self._trt()
        cuda_rt.set_device(self.options.device_id)
        gpu = cuda_rt.gpu(self.options.device_id)
        settings = self._settings(artifact)
        key = {
            "gpu": gpu.name,
            "compute_capability": f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}",
            "toolchain": f"{self.options.flavour} {getattr(trt, '__version__', 'unknown')}",
            "driver": f"CUDA {gpu.driver}",
            "onnx_sha256": sha256_file(artifact.path),
            "settings_sha256": engine_cache.settings_hash(settings.model_dump(by_alias=True)),
        }
        return trt, gpu, settings, engine_cache.entry(artifact.directory, key, ".engine"), key

    def build_engine(self, artifact: Artifact, progress: Callable[[str], None]) -> EngineBuild:
        from tapeout.targets import engine_cache, tensorrt_engine

        trt, gpu, settings, entry, key = self._device(artifact)
        record = engine_cache.cached(entry)
        if record is not None:
            return EngineBuild(
                "reused",
                f"built {record.get('built', '?')} for this GPU, toolchain, driver, ONNX and settings",
                entry.relative,
                key,
                0.0,
                record.get("layers", []),
                record.get("summary", {}),
            )
        reason = engine_cache.why_build(entry.engine.parent, key, f"{settings.flavour} {settings.prepared_for}")
        if "FP8" in settings.expect and gpu.compute_capability < (8, 9):
            raise TargetUnavailable(
                f"the ONNX holds FP8 Q/DQ, and this GPU ({gpu.name}, {gpu.sm}) has no FP8 tensor "
                "cores (Ada sm_89, Hopper sm_90 and newer)",
                fix="build with the tensorrt-int8 or tensorrt-fp16 profile for this GPU",
            )
        progress(f"building the TensorRT engine for {gpu.name} ({gpu.sm}), {key['toolchain']}: {reason}")
        t0 = time.perf_counter()
        plan, timing, skipped = tensorrt_engine.build(
            trt, artifact.path, settings, entry.engine.parent, gpu, self.options.timing_cache, progress
        )
        seconds = time.perf_counter() - t0
        layers, summary = tensorrt_engine.inspect(trt, plan, settings)
        summary.update(build_seconds=round(seconds, 3), timing_cache=timing, engine_bytes=len(plan))
        if skipped:
            summary["not_in_this_tensorrt"] = skipped
        engine_cache.store(entry, plan, key, seconds=seconds, layers=layers, summary=summary)
        return EngineBuild("built", reason, entry.relative, key, seconds, layers, summary)

    def _engine(self, artifact: Artifact):
        from tapeout.targets import engine_cache, tensorrt_engine

        trt, _, settings, entry, _ = self._device(artifact)
        plan, record = engine_cache.load(entry)  # verified against the record tapeout wrote: an engine is GPU code
        return trt, tensorrt_engine.deserialize(trt, plan, bool(settings.builder.get("version_compatible"))), record

    def session(self, artifact: Artifact) -> Session:
        from tapeout.targets.tensorrt_engine import TrtSession

        trt, engine, _ = self._engine(artifact)
        return TrtSession(trt, engine, self.options.cuda_graph)

    def op_profile(
        self, artifact: Artifact, feeds: dict[str, np.ndarray], iterations: int, pace_s: float | None = None
    ) -> OpProfile:
        """Per-layer GPU times from IProfiler (layers after fusion; their types from the inspector)."""
        from tapeout.targets.tensorrt_engine import profile_layers

        trt, engine, record = self._engine(artifact)
        kinds = {layer["name"]: layer.get("type", "") for layer in record.get("layers", [])}
        return profile_layers(trt, engine, feeds, iterations, kinds)
