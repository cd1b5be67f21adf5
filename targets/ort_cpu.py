"""ONNX Runtime on the CPU execution provider: the embedded default target.

compile = let ORT apply its portable graph optimizations (basic, extended: constant folding,
fusions) once and save the result as the artifact. The "all" level adds layout optimizations
(NCHWc) whose weight blocking depends on the CPU's vector width: a model saved with them on an
AVX2 host computes garbage on an AVX-512 host (seen: cosine -0.11 on a Xeon for a model built on
an EPYC). So they are never saved; a session applies them at load, for the CPU it runs on.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tapeout.errors import BadInput, first_line
from tapeout.targets.base import LintIssue, OpProfile, Probe, RuntimeLimits
from tapeout.types import Artifact, InputSpec

NAME = "onnxruntime"
ARTIFACT_FILE = "model.onnx"
_ONNX_TO_NUMPY = {
    "tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
    "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8",
    "tensor(uint8)": "uint8", "tensor(bool)": "bool",
}


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    threads: int = Field(0, ge=0, description="intra-op threads; 0 = one per physical core")
    inter_op_threads: int = Field(1, ge=1)
    graph_optimization: Literal["disable", "basic", "extended", "all"] = "all"
    execution_mode: Literal["sequential", "parallel"] = "sequential"
    allow_spinning: bool = True
    memory_arena: bool = True


def probe() -> Probe:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return Probe(False, reason=f"onnxruntime cannot be imported ({exc})", install_hint="pip install onnxruntime")
    providers = ort.get_available_providers()
    if "CPUExecutionProvider" not in providers:
        return Probe(False, ort.__version__, reason=f"CPUExecutionProvider missing (have {providers})",
                     install_hint="pip install onnxruntime")
    return Probe(True, ort.__version__, details={"providers": providers})


@functools.cache
def limits() -> RuntimeLimits:
    """Newest IR version and default-domain opset this onnxruntime loads, found by trying tiny models."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def loads(ir_version: int, opset: int) -> bool:
        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])], "probe",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = ir_version
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception:
            return False
        return True

    ir = next(v for v in range(onnx.IR_VERSION, 3, -1) if loads(v, 13))
    opset = next(v for v in range(onnx.defs.onnx_opset_version(), 12, -1) if loads(ir, v))
    return RuntimeLimits(max_ir_version=ir, max_opset=opset)


_LEVEL_ORDER = ("disable", "basic", "extended", "all")
PORTABLE_LEVEL = "extended"  # the highest level whose saved output runs on any CPU


def _saved_level(options: Options) -> str:
    return min(options.graph_optimization, PORTABLE_LEVEL, key=_LEVEL_ORDER.index)


def _session_options(options: Options, *, level: str | None = None):
    import onnxruntime as ort
    import psutil

    so = ort.SessionOptions()
    so.intra_op_num_threads = options.threads or psutil.cpu_count(logical=False) or 1
    so.inter_op_num_threads = options.inter_op_threads
    so.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if options.execution_mode == "parallel" else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    so.enable_cpu_mem_arena = options.memory_arena
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if options.allow_spinning else "0")
    levels = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    so.graph_optimization_level = levels[level or options.graph_optimization]
    so.log_severity_level = 3  # errors only: ORT's warnings about unused initializers are noise here
    return so


def _create(model: Path | bytes, so, what: str):
    import onnxruntime as ort

    try:
        return ort.InferenceSession(model if isinstance(model, bytes) else str(model), so,
                                    providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own pybind types (Fail, InvalidGraph, NoSuchFile, ...)
        raise BadInput(f"onnxruntime could not load {what}: {first_line(exc)}",
                       fix="check the model with `tapeout lint`, or export it again") from None


def lint(model_path: Path, inputs: list[InputSpec], dims: dict[str, int], options: Options | None = None) -> list[LintIssue]:
    """Problems ORT CPU would hit: IR version or opset too new, inputs that do not match the project."""
    import onnx

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:
        raise BadInput(f"{model_path} is not a readable ONNX model ({type(exc).__name__}: {exc})",
                       fix="re-export it, or point the project at the right file") from None
    issues: list[LintIssue] = []
    lim = limits()
    if model.ir_version > lim.max_ir_version:
        issues.append(LintIssue("error", f"IR version {model.ir_version} is newer than this onnxruntime accepts "
                                f"({lim.max_ir_version})", f"save the model with ir_version = {lim.max_ir_version}"))
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx") and imp.version > lim.max_opset:
            issues.append(LintIssue("error", f"opset {imp.version} is newer than this onnxruntime supports "
                                    f"({lim.max_opset})", f"export with opset <= {lim.max_opset}"))
    initializers = {init.name for init in model.graph.initializer}
    graph_inputs = {i.name: i for i in model.graph.input if i.name not in initializers}
    declared = {spec.name: spec for spec in inputs}
    for name in graph_inputs.keys() - declared.keys():
        issues.append(LintIssue("error", f"model input '{name}' is not declared in the project's [[inputs]]",
                                f"add an [[inputs]] entry named '{name}'"))
    for name in declared.keys() - graph_inputs.keys():
        issues.append(LintIssue("error", f"project input '{name}' is not an input of the model "
                                f"(model inputs: {', '.join(graph_inputs) or 'none'})", "rename or remove that [[inputs]] entry"))
    for name in declared.keys() & graph_inputs.keys():
        issues.extend(_check_input(graph_inputs[name], declared[name], dims))
    return issues


def _check_input(graph_input, spec: InputSpec, dims: dict[str, int]) -> list[LintIssue]:
    from onnx import helper

    tensor = graph_input.type.tensor_type
    dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else None
    issues = []
    if dtype is not None and dtype != spec.dtype:
        issues.append(LintIssue("error", f"input '{spec.name}' is {dtype} in the model but {spec.dtype} in the project",
                                f"set dtype = \"{dtype}\" for '{spec.name}'"))
    model_dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]
    want = spec.concrete_shape(dims)
    if len(model_dims) != len(want):
        return [*issues, LintIssue("error", f"input '{spec.name}' has rank {len(model_dims)} in the model "
                                   f"{model_dims} but the project gives shape {list(spec.shape)}",
                                   f"give '{spec.name}' a shape of rank {len(model_dims)}")]
    for axis, (have, need) in enumerate(zip(model_dims, want, strict=True)):
        if isinstance(have, int) and have > 0 and have != need:
            issues.append(LintIssue("error", f"input '{spec.name}' axis {axis} is fixed to {have} in the model but the "
                                    f"project gives {need} (shape {list(spec.shape)})",
                                    f"set axis {axis} of '{spec.name}' to {have}"))
    return issues


def compile(model_path: Path, options: Options, out_dir: Path, inputs: list[InputSpec] | None = None,
            dims: dict[str, int] | None = None) -> Artifact:
    """Apply the portable optimizations once and save the result; that model is the artifact."""
    out_dir.mkdir(parents=True, exist_ok=True)
    saved = _saved_level(options)
    so = _session_options(options, level=saved)
    so.optimized_model_filepath = str(out_dir / ARTIFACT_FILE)
    _create(Path(model_path), so, f"{model_path}")
    return Artifact(NAME, out_dir, ARTIFACT_FILE,
                    meta={"saved_optimization": saved, "load_optimization": options.graph_optimization})


class OrtSession:
    def __init__(self, sess):
        self._sess = sess
        self.input_names = [i.name for i in sess.get_inputs()]
        self.output_names = [o.name for o in sess.get_outputs()]
        self.input_types = {i.name: _ONNX_TO_NUMPY.get(i.type, i.type) for i in sess.get_inputs()}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            outputs = self._sess.run(self.output_names, feeds)
        except Exception as exc:
            raise BadInput(f"the model rejected its inputs: {first_line(exc)}",
                           fix="make the project's [[inputs]] shapes and dtypes match the model (`tapeout lint`)") from None
        return dict(zip(self.output_names, outputs, strict=True))

    def run_raw(self, feeds: dict[str, np.ndarray]) -> object:
        return self._sess.run(self.output_names, feeds)


def session(artifact: Artifact, options: Options, *, profile_dir: Path | None = None) -> OrtSession:
    # The portable levels are already in the file; re-running them is idempotent and cheap, and
    # "all" adds the layout optimizations for this machine's CPU.
    so = _session_options(options)
    if profile_dir is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(profile_dir / "ort_profile")
    return OrtSession(_create(artifact.path, so, f"artifact {artifact.path}"))


def reference_session(model_path: Path) -> OrtSession:
    """An unoptimized FP32 session: the reference when the project's source is already ONNX."""
    return OrtSession(_create(Path(model_path), _session_options(Options(graph_optimization="basic")), f"{model_path}"))


def op_profile(artifact: Artifact, options: Options, feeds: dict[str, np.ndarray], iterations: int) -> OpProfile:
    """A separate, instrumented pass: ORT's profiler slows runs down, so budgets never use it."""
    from tapeout.targets import ort_profile

    with tempfile.TemporaryDirectory(prefix="tapeout-prof-") as tmp:
        sess = session(artifact, options, profile_dir=Path(tmp))
        warmup = 3
        for _ in range(warmup + iterations):
            sess.run_raw(feeds)
        trace = sess._sess.end_profiling()
        return ort_profile.parse(Path(trace), skip_runs=warmup)
