"""Qualcomm Hexagon NPU through ONNX Runtime's QNN execution provider (plugin EP, `onnxruntime-qnn` 2.x).

compile = pin every dim to the build's value (the HTP compiles static graphs only), then let the QNN
EP prepare the graph for the profile's SoC (`htp_arch`, `soc_model`) and write an EPContext model:
`model_ctx.onnx` holding one EPContext node, beside the context binary `model_ctx_qnn.bin`. CPU
fallback is off unless the profile allows it; the EP's op trace says which nodes run where, and why.

On x86 the HTP backend is an emulator: parity and placement are real, timings are not the device's
(research rocm-npu §2.1: about 25× slower than the CPU EP). `emulated()` says so, and the build
never judges latency, memory or power budgets against emulator timings.
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import Field

from tapeout.core.artifact import Artifact
from tapeout.core.errors import BadInput, TargetUnavailable, first_line, runtime_detail
from tapeout.core.schemas import InputSpec
from tapeout.targets import onnx_lint
from tapeout.targets.base import LintIssue, Probe
from tapeout.targets.native_output import native_output_captured
from tapeout.targets.ort_ep import OrtOptions, OrtSession, OrtTarget

ARTIFACT_FILE = "model_ctx.onnx"
PREFILL_FILE = "prefill_ctx.onnx"  # a generate workload's prompt graph (Options.prefill_chunk), beside the decode graph


class Options(OrtOptions):
    htp_arch: int = Field(ge=68, le=99, description="Hexagon architecture: 68, 69, 73, 75, 79, 81")
    soc_model: int = Field(ge=0, le=65535, description="QNN SoC id (e.g. 57 = SM8650, 60 = Snapdragon X Elite)")
    allow_cpu_fallback: bool = Field(False, description="let unsupported nodes run on the CPU EP (placement budget)")
    htp_performance_mode: Literal[
        "burst",
        "sustained_high_performance",
        "high_performance",
        "balanced",
        "default",
        "power_saver",
        "low_power_saver",
        "high_power_saver",
        "low_balanced",
        "extreme_power_saver",
    ] = "burst"
    enable_htp_fp16_precision: bool = Field(True, description="float (unquantized) nodes run in FP16 on the HTP")
    context_embed: bool = Field(False, description="embed the context binary in the .onnx instead of a sidecar .bin")
    prefill_chunk: int = Field(
        32,
        ge=0,
        le=4096,
        description="a generate workload's prompts go through a second "
        "context binary, the cache graph pinned to this many new tokens (Genie's AR-N graphs), "
        "the first length mod chunk tokens one per call; 0: every prompt token through the "
        "one-token decode graph",
    )


@functools.cache
def _register() -> None:
    import onnxruntime as ort
    import onnxruntime_qnn

    # Once per process: a second registration under the same name is an error in ORT.
    with native_output_captured():
        ort.register_execution_provider_library(Qnn.EP, onnxruntime_qnn.get_library_path())


def _devices() -> list:
    import onnxruntime as ort

    return [d for d in ort.get_ep_devices() if d.ep_name == Qnn.EP]


def _read_trace(folder: Path) -> dict:
    files = sorted(folder.rglob("*.json"))
    if not files:
        raise TargetUnavailable("the QNN EP wrote no op trace", fix="use onnxruntime-qnn >= 2.4")
    return json.loads(files[0].read_text())


def placement(trace: dict) -> dict:
    """Share of nodes on the HTP and the nodes that are not, with the EP's reason (its op trace format:
    `summary.{total_onnx_nodes, supported_nodes, qnn_subgraphs}`, `unsupported_nodes[] {node_name,
    op_type, reason}`)."""
    summary = trace.get("summary", {})
    off = [
        {"node": n.get("node_name"), "op_type": n.get("op_type"), "reason": n.get("reason", "")}
        for n in trace.get("unsupported_nodes", [])
    ]
    total = int(summary.get("total_onnx_nodes", 0))
    supported = int(summary.get("supported_nodes", total - len(off)))
    return {
        "accelerator": "HTP",
        "total_nodes": total,
        "on_accelerator": supported,
        "off_share": (total - supported) / total if total else 0.0,
        "off": off,
        "subgraphs": summary.get("qnn_subgraphs"),
        "source": "the QNN EP's op trace at compile",
    }


def pin_shapes(
    model_path: Path, out_path: Path, inputs: list[InputSpec], dims: dict[str, int], repin: bool = False
) -> tuple[Path, list[str]]:
    """The model with every input dim fixed to the build's value, and what was pinned. A copy is written to
    `out_path` only when a dim was symbolic; an already static model is returned as it is. `repin`: every input
    dim set from `dims`, pinned or not (a pinned cache graph pinned again to another number of new tokens)."""
    import onnx

    model = onnx.load(str(model_path))
    specs = {s.name: s for s in inputs}
    pinned = []
    for graph_input in model.graph.input:
        spec = specs.get(graph_input.name)
        if spec is None:
            continue
        for axis, (dim, value) in enumerate(
            zip(graph_input.type.tensor_type.shape.dim, spec.concrete_shape(dims), strict=False)
        ):
            if not dim.HasField("dim_value") or (repin and dim.dim_value != value):
                pinned.append(f"{graph_input.name}[{axis}] {dim.dim_param or '?'} = {value}")
                dim.ClearField("dim_param")
                dim.dim_value = value
    if not pinned:
        return model_path, pinned
    del model.graph.value_info[:]  # symbolic intermediate shapes would contradict the pins
    onnx.save(model, str(out_path))
    return out_path, pinned


_COMPUTE = {"Conv", "MatMul", "Gemm", "ConvTranspose", "Softmax", "LayerNormalization", "Gelu", "Add", "Mul"}


def _float_compute_nodes(model) -> list[str]:
    produced_by = {o: n.op_type for n in model.graph.node for o in n.output}
    return [
        n.name
        for n in model.graph.node
        if n.op_type in _COMPUTE and not any(produced_by.get(t) == "DequantizeLinear" for t in n.input)
    ]


class Qnn(OrtTarget):
    EP = "QNNExecutionProvider"
    INSTALL = 'pip install "tapeout[qnn]"  (onnxruntime-qnn, x86-64 Linux / Windows on Snapdragon)'
    Options = Options

    @classmethod
    def probe(cls) -> Probe:
        import platform

        try:
            import onnxruntime as ort
            import onnxruntime_qnn
        except ImportError as exc:
            return Probe(False, reason=f"onnxruntime-qnn cannot be imported ({exc})", install_hint=cls.INSTALL)
        try:
            _register()
        except Exception as exc:
            return Probe(
                False, reason=f"the QNN plugin EP did not register: {first_line(exc)}", install_hint=cls.INSTALL
            )
        if not _devices():
            return Probe(
                False,
                ort.__version__,
                reason="the QNN plugin registered but offers no device",
                install_hint=cls.INSTALL,
            )
        version = getattr(onnxruntime_qnn, "__version__", "?")
        return Probe(
            True, f"onnxruntime-qnn {version} (onnxruntime {ort.__version__})", details={"machine": platform.machine()}
        )

    def _configure(
        self, so, *, trace_dir: Path | None = None, context_path: Path | None = None, fallback: bool | None = None
    ) -> None:
        import onnxruntime_qnn

        _register()
        opts = self.options
        provider = {
            "backend_path": onnxruntime_qnn.get_qnn_htp_path(),
            "htp_arch": str(opts.htp_arch),
            "soc_model": str(opts.soc_model),
            "htp_performance_mode": opts.htp_performance_mode,
            "enable_htp_fp16_precision": "1" if opts.enable_htp_fp16_precision else "0",
            # The graph-input Quantize and graph-output Dequantize run on the HTP too (the EP's default
            # hands them to the CPU EP, which strict placement forbids and which costs a round trip).
            "offload_graph_io_quantization": "0",
        }
        if trace_dir is not None:
            provider.update({"enable_framework_op_trace": "1", "framework_op_trace_dir": str(trace_dir)})
        so.add_provider_for_devices(_devices(), provider)
        allow = opts.allow_cpu_fallback if fallback is None else fallback
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "0" if allow else "1")
        if context_path is not None:
            so.add_session_config_entry("ep.context_enable", "1")
            so.add_session_config_entry("ep.context_file_path", str(context_path))
            so.add_session_config_entry("ep.context_embed_mode", "1" if opts.context_embed else "0")

    def _new_session(self, model: str | bytes, so):
        import onnxruntime as ort

        try:
            return ort.InferenceSession(model, so)
        except Exception as exc:
            text = first_line(exc)
            strict = so.get_session_config_entry("session.disable_cpu_ep_fallback") == "1"
            if strict and any(word in text.lower() for word in ("fallback", "not supported", "unsupported")):
                raise BadInput(
                    f"the HTP cannot run every node of {Path(str(model)).name} and CPU fallback is off: {text}",
                    detail=runtime_detail(exc),
                    fix="run `tapeout lint` for the nodes and why; or set allow_cpu_fallback = true with a "
                    "placement budget",
                ) from None
            raise

    def _op_trace(self, model: Path) -> dict:
        """Which nodes the HTP takes and why not, from the EP's own trace (fallback allowed, so it sees all)."""
        with tempfile.TemporaryDirectory(prefix="tapeout-qnn-trace-") as tmp:
            self._load(model, self._session_options(trace_dir=Path(tmp), fallback=True), model.name)
            return _read_trace(Path(tmp))

    def static_decode(self) -> bool:
        """The HTP compiles static graphs: a generate workload's cache graph is pinned to one decode step over a cache
        of fixed size, with the mask marking the slots filled (targets/base.StaticCachedDecoder)."""
        return True

    def prepare(self, model_path: Path, inputs: list[InputSpec], dims: dict[str, int]) -> Path:
        """The HTP compiles static graphs: pin every dim once, before quantization and compile."""
        return pin_shapes(model_path, model_path.with_name(model_path.stem + ".static.onnx"), inputs, dims)[0]

    def lint(self, model_path: Path, inputs: list[InputSpec], dims: dict[str, int]) -> list[LintIssue]:
        """ORT's checks, then the HTP's: dims to pin, 64-bit and bool I/O, and every node the EP would not take."""
        import onnx

        issues = super().lint(model_path, inputs, dims)
        if any(i.severity == "error" for i in issues):
            return issues
        model = onnx_lint.read_header(model_path)
        initializers = {i.name for i in model.graph.initializer}
        specs = {s.name: s for s in inputs}
        for graph_input in (i for i in model.graph.input if i.name not in initializers):
            spec = specs.get(graph_input.name)
            tensor = graph_input.type.tensor_type
            for axis, dim in enumerate(tensor.shape.dim):
                if not dim.HasField("dim_value") and spec is not None:
                    value = spec.concrete_shape(dims)[axis]
                    issues.append(
                        LintIssue(
                            "warning",
                            f"input '{graph_input.name}' axis {axis} is dynamic ('{dim.dim_param}'): "
                            "the HTP compiles static graphs only",
                            f"pinned to {value} at compile (from the project's [dims]); a device build for "
                            "other shapes needs its own profile or dims",
                            node=graph_input.name,
                        )
                    )
            if tensor.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.BOOL, onnx.TensorProto.DOUBLE):
                kind = onnx.TensorProto.DataType.Name(tensor.elem_type).lower()
                issues.append(
                    LintIssue(
                        "warning",
                        f"input '{graph_input.name}' is {kind}: the HTP has no {kind} tensors, so the "
                        "EP converts it on the CPU at the graph boundary",
                        "export it as int32 (or float) to keep the boundary on the NPU",
                        node=graph_input.name,
                    )
                )
        for graph_output in model.graph.output:
            if graph_output.type.tensor_type.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.BOOL):
                issues.append(
                    LintIssue(
                        "warning",
                        f"output '{graph_output.name}' is 64-bit/bool: converted on the CPU",
                        "return int32 or float",
                        node=graph_output.name,
                    )
                )
        with tempfile.TemporaryDirectory(prefix="tapeout-qnn-lint-") as tmp:
            static, _ = pin_shapes(model_path, Path(tmp) / "static.onnx", inputs, dims)
            place = placement(self._op_trace(static))
        severity = "warning" if self.options.allow_cpu_fallback else "error"
        for node in place["off"]:
            issues.append(
                LintIssue(
                    severity,
                    f"{node['op_type']} node does not run on the HTP: {node['reason'] or 'no reason given'}",
                    "allow_cpu_fallback = true with a placement budget, or replace the op"
                    if severity == "error"
                    else "runs on the CPU EP; the placement budget judges the share",
                    node=node["node"],
                )
            )
        float_nodes = _float_compute_nodes(model)
        if float_nodes:
            issues.append(
                LintIssue(
                    "warning",
                    f"{len(float_nodes)} compute node(s) have no Q/DQ around them (e.g. "
                    f"{', '.join(float_nodes[:3])}): the HTP runs them in FP16, slower than INT8",
                    'build with precision = "int8" (full-integer QDQ) to quantize them',
                )
            )
        return issues

    def compile(self, model_path: Path, out_dir: Path, inputs: list[InputSpec], dims: dict[str, int]) -> Artifact:
        """Pin shapes, prepare the graph for the SoC, write the EPContext model and its context binary; for a
        generate workload's cache graph, a second one pinned to `prefill_chunk` new tokens (`prefill_ctx.onnx`)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="tapeout-qnn-") as tmp:
            static, pinned = pin_shapes(model_path, Path(tmp) / "model.onnx", inputs, dims)
            place = self._context(static, out_dir, ARTIFACT_FILE, Path(tmp))
            prefill = self._prefill_context(model_path, out_dir, inputs, dims, Path(tmp))
        return Artifact(
            self.name,
            out_dir,
            ARTIFACT_FILE,
            meta={
                "htp_arch": self.options.htp_arch,
                "soc_model": self.options.soc_model,
                "pinned": pinned,
                "placement": place,
                "emulated": self.emulated(),
                **({"prefill": prefill} if prefill else {}),
                "context_files": sorted(p.name for p in out_dir.iterdir()),
            },
        )

    def _context(self, static: Path, out_dir: Path, name: str, tmp: Path) -> dict:
        """One static model prepared for the SoC into `out_dir/name` and its context binary; its placement.

        One session does it all: the op trace (placement) and the context come from the same graph
        preparation. It runs with fallback allowed so the trace sees every node; the context is kept
        only if the placement is what the profile allows (with no node off the HTP, the context is the
        one a strict session writes)."""
        work = tmp / name.removesuffix(".onnx")
        context = work / "context"
        context.mkdir(parents=True)
        so = self._session_options(trace_dir=work / "trace", context_path=context / name, fallback=True)
        self._load(static, so, static.name)
        place = placement(_read_trace(work / "trace"))
        if place["off"] and not self.options.allow_cpu_fallback:
            first = place["off"][0]
            raise BadInput(
                f"{len(place['off'])} node(s) of {name} cannot run on the HTP and CPU fallback is off; "
                f"first: {first['node']} ({first['op_type']}): {first['reason']}",
                fix="see `tapeout lint --profile` for every node; or allow_cpu_fallback = true with a placement budget",
            )
        if not (context / name).is_file():
            raise BadInput("the QNN EP wrote no EPContext model", fix="check the profile's htp_arch and soc_model")
        for file in context.iterdir():  # the .onnx names its .bin by file name: they move together
            shutil.move(str(file), out_dir / file.name)
        return place

    def _prefill_context(
        self, model_path: Path, out_dir: Path, inputs: list[InputSpec], dims: dict[str, int], tmp: Path
    ) -> dict | None:
        """A cache graph's prompt graph: the same model pinned to `prefill_chunk` new tokens over the same cache
        (input_ids and position_ids [batch, chunk], attention_mask [batch, past + chunk]), its own context binary.
        None for a forward model, or where the option is 0 or the chunk does not fit the cache."""
        from tapeout.core.decoding import ATTENTION_MASK

        chunk = self.options.prefill_chunk
        if (
            not chunk
            or not any(s.name == ATTENTION_MASK for s in inputs)
            or not {"seq", "past", "context"} <= set(dims)
        ):
            return None
        if chunk > dims["past"]:
            return {
                "chunk": 0,
                "why_none": f"prefill_chunk = {chunk} is more than the cache's {dims['past']} slots: "
                "prompts go one token per call",
            }
        static, _ = pin_shapes(
            model_path,
            tmp / "prefill.onnx",
            inputs,
            {**dims, "seq": chunk, "context": dims["past"] + chunk},
            repin=True,
        )
        place = self._context(static, out_dir, PREFILL_FILE, tmp)
        return {
            "chunk": chunk,
            "file": PREFILL_FILE,
            "on_accelerator": place["on_accelerator"],
            "total_nodes": place["total_nodes"],
        }

    def session(self, artifact: Artifact) -> OrtSession:
        """The decode graph's session; with a prompt graph beside it, that one too, loaded for the first decoder."""
        session = super().session(artifact)
        prefill = artifact.directory / PREFILL_FILE
        if prefill.is_file():
            session.prefill_loader = lambda: self._prefill_graph(prefill)
        return session

    def _prefill_graph(self, path: Path) -> tuple:
        from tapeout.core.decoding import INPUT_IDS

        sess = self._load(path, self._session_options(), f"artifact {path}")
        chunk = next(i.shape[1] for i in sess.get_inputs() if i.name == INPUT_IDS)  # [batch, chunk], pinned
        return OrtSession(sess).run, int(chunk)
