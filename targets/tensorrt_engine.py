"""TensorRT's Python API, device side: build an engine from the ONNX and engine-settings.json, read the
engine inspector's layers, and run an execution context on device buffers. Only imported where
TensorRT is (`tapeout check` on the device); the calls follow TensorRT 10.12+/11 (strongly typed
networks, no precision flags, no calibrators; research nvidia.md §1), and run on TensorRT for RTX
where its API has the same names.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tapeout.core.errors import BadInput, TapeoutError
from tapeout.core.files import write_bytes
from tapeout.targets.base import Session

_HW_COMPAT = {"none": "NONE", "ampere_plus": "AMPERE_PLUS", "same_compute_capability": "SAME_COMPUTE_CAPABILITY"}
_NUMPY = {
    "FLOAT": np.float32,
    "HALF": np.float16,
    "INT8": np.int8,
    "INT32": np.int32,
    "INT64": np.int64,
    "BOOL": np.bool_,
    "UINT8": np.uint8,
}


def build(
    trt, onnx_path: Path, settings, folder: Path, gpu, timing_cache: bool, progress: Callable[[str], None]
) -> tuple[bytes, str, list[str]]:
    """Parse the ONNX into a strongly typed network, configure the builder from engine-settings.json, build
    with the timing cache of this GPU and TensorRT version; returns the serialized engine, what happened to the
    timing cache, and the settings this TensorRT does not have."""
    logger = _logger(trt)
    builder = trt.Builder(logger)
    strongly = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)  # always on in TRT 11 / RTX
    network = builder.create_network(0 if strongly is None else 1 << int(strongly))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [parser.get_error(i) for i in range(parser.num_errors)]
        first = errors[0] if errors else None
        where = (
            f"node {first.node_name()} ({first.node_operator()}): " if first is not None and first.node_name() else ""
        )
        raise BadInput(
            f"TensorRT's ONNX parser refused the model: {where}{first.desc() if first else logger.last_error()}"
            + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""),
            fix="run `tapeout lint -p <profile>` on the host; keep the node float or rewrite it",
        )
    config = builder.create_builder_config()
    b = settings.builder
    skipped: list[str] = []  # what this TensorRT lacks (TensorRT for RTX has fewer builder knobs): said, not hidden

    def setting(name: str, value) -> None:
        if hasattr(config, name):
            setattr(config, name, value)
        else:
            skipped.append(name)

    def flag(name: str, on: bool) -> None:
        member = getattr(trt.BuilderFlag, name, None)
        if member is None:
            skipped.append(f"BuilderFlag.{name}")
        elif on:
            config.set_flag(member)
        else:
            config.clear_flag(member)

    setting("builder_optimization_level", int(b.get("optimization_level") or 3))
    if b.get("workspace_mb"):
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(b["workspace_mb"]) << 20)
    flag("TF32", bool(b.get("tf32")))
    if b.get("sparse_weights"):
        flag("SPARSE_WEIGHTS", True)
    if b.get("version_compatible"):
        flag("VERSION_COMPATIBLE", True)
    portability = str(b.get("hardware_compatibility") or "none")
    if portability != "none":
        levels = getattr(trt, "HardwareCompatibilityLevel", None)
        setting("hardware_compatibility_level", getattr(levels, _HW_COMPAT[portability], None))
    setting("profiling_verbosity", trt.ProfilingVerbosity.DETAILED)  # the inspector's per-layer precision and tactic
    asked = [k for k in skipped if any(w in k for w in ("SPARSE", "VERSION_COMPATIBLE", "hardware_compatibility"))]
    if asked:  # a portability or sparsity the profile asks for and this TensorRT cannot give: never silently without
        raise TapeoutError(
            f"this TensorRT ({getattr(trt, '__version__', '?')}) has no {', '.join(asked)}, which the profile asks for",
            fix='set [options] sparse_weights / version_compatible = false, hardware_compatibility = "none" for it',
        )
    profile = builder.create_optimization_profile()
    for name, shapes in settings.profile.items():
        profile.set_shape(name, shapes.min, shapes.opt, shapes.max)
    config.add_optimization_profile(profile)
    monitor = _progress_monitor(trt, progress)
    if monitor is not None:
        config.progress_monitor = monitor
    timing = "off"
    cache_file = folder / f"timing-{_slug(gpu.name)}-{gpu.sm}-{_slug(str(getattr(trt, '__version__', '')))}.cache"
    if timing_cache and hasattr(config, "create_timing_cache"):
        cache = config.create_timing_cache(cache_file.read_bytes() if cache_file.is_file() else b"")
        config.set_timing_cache(cache, False)
        timing = f"reused {cache_file.name}" if cache_file.is_file() else f"new {cache_file.name}"
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise TapeoutError(
            f"TensorRT could not build the engine: {logger.last_error() or 'no message'}",
            fix="lower [options] optimization_level, raise workspace_mb, or keep the failing "
            "layer float; `tapeout check -v` prints TensorRT's log",
        )
    if timing != "off":
        folder.mkdir(parents=True, exist_ok=True)
        write_bytes(cache_file, bytes(config.get_timing_cache().serialize()))
    return bytes(plan), timing, skipped


def inspect(trt, plan: bytes, settings) -> tuple[list[dict], dict]:
    """The engine inspector's layers (fused layers, tactic, precision), checked against the ONNX's precisions:
    a "FP16" build that came out FP32 fails here, never silently (research nvidia.md §1.4)."""
    engine = deserialize(trt, plan, bool(settings.builder.get("version_compatible")))
    inspector = engine.create_engine_inspector()
    info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON) or "{}")
    layers = parse_layers(info)
    counts: dict[str, int] = {}
    for layer in layers:
        counts[layer["precision"]] = counts.get(layer["precision"], 0) + 1
    missing = [p for p in settings.expect if p != "FP32" and p not in counts]
    if layers and missing:
        raise TapeoutError(
            f"the engine has no {', '.join(missing)} layer although the ONNX asks for it "
            f"(layers by precision: {counts}): TensorRT ran the graph in another precision",
            fix="report this with the TensorRT version; use the fp32 profile meanwhile",
        )
    summary = {
        "layers": len(layers),
        "precisions": counts,
        "device_memory_bytes": getattr(engine, "device_memory_size_v2", None),
    }
    if settings.builder.get("sparse_weights"):
        summary["sparse_weights"] = True
        summary["sparse_layers"] = [layer["name"] for layer in layers if layer.get("sparse")]
    return layers, summary


def deserialize(trt, plan: bytes, host_code: bool):
    runtime = trt.Runtime(_logger(trt))
    if host_code:  # version-compatible engines carry the lean runtime's code
        runtime.engine_host_code_allowed = True
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise TapeoutError(
            "TensorRT could not deserialize the engine", fix="delete the build dir's engines/ and rerun check"
        )
    return engine


def profile_layers(trt, engine, feeds: dict[str, np.ndarray], iterations: int, kinds: dict[str, str]):
    """Per-layer GPU times through IProfiler, each run synchronous (a separate pass, never the timed one)."""
    from tapeout.targets.base import OpProfile, OpTime

    sess = TrtSession(trt, engine, cuda_graph=False)
    times: dict[str, list[float]] = {}

    class Profiler(trt.IProfiler):
        def __init__(self) -> None:
            trt.IProfiler.__init__(self)

        def report_layer_time(self, layer_name: str, ms: float) -> None:
            times.setdefault(layer_name, []).append(ms)

    run = sess.bind(feeds)  # shapes set and buffers filled before the profiler is attached
    sess.context.profiler = Profiler()
    t0 = time.perf_counter()
    for _ in range(iterations):
        run()
        sess.synchronize()
    total_us = (time.perf_counter() - t0) * 1e6
    ops = [OpTime(name, kinds.get(name, ""), "TensorRT", len(ms), sum(ms) * 1e3) for name, ms in times.items()]
    return OpProfile(
        iterations,
        total_us,
        ops,
        method="TensorRT IProfiler: per-layer GPU time of the fused engine layers, each run synchronous",
    )


class TrtSession(Session):
    """An execution context with device buffers; inputs are copied in, outputs back (run), or kept (bind)."""

    def __init__(self, trt, engine, cuda_graph: bool):
        from tapeout.targets import cuda_rt

        self.trt, self.engine, self.cuda_graph = trt, engine, cuda_graph
        self.context = engine.create_execution_context()
        self.stream = cuda_rt.Stream()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.input_names = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self.buffers: dict = {}  # name -> device Buffer, grown as shapes need
        self.staged: dict = {}  # name -> the host input being copied in

    def _dtype(self, name: str):
        kind = self.engine.get_tensor_dtype(name).name
        if kind not in _NUMPY:
            raise BadInput(
                f"engine tensor '{name}' is {kind}, which numpy cannot hold",
                fix="keep graph inputs and outputs FP32/FP16 (the precision step does)",
            )
        return np.dtype(_NUMPY[kind])

    def _prepare(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Set input shapes and addresses, allocate outputs; returns the host output arrays."""
        from tapeout.targets import cuda_rt

        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise BadInput(f"missing input(s) {', '.join(missing)}", fix="feed every engine input")
        for name in self.input_names:
            array = np.ascontiguousarray(feeds[name], dtype=self._dtype(name))
            if not self.context.set_input_shape(name, tuple(array.shape)):
                low, _opt, high = self.engine.get_tensor_profile_shape(name, 0)
                raise BadInput(
                    f"input '{name}' shape {list(array.shape)} is outside the engine's optimization "
                    f"profile (min {list(low)}, max {list(high)})",
                    fix="widen [options] dims_min / dims_max in the profile and rebuild",
                )
            buf = self._buffer(name, array.nbytes)
            self.stream.copy(buf.address, array.ctypes.data, array.nbytes, cuda_rt.H2D)
            self.context.set_tensor_address(name, buf.address)
            self.staged[name] = array  # the host array stays alive until the asynchronous copy has run
        outputs = {}
        for name in self.output_names:
            shape = tuple(self.context.get_tensor_shape(name))
            host = np.empty(shape, dtype=self._dtype(name))
            buf = self._buffer(name, host.nbytes)
            self.context.set_tensor_address(name, buf.address)
            outputs[name] = host
        return outputs

    def _buffer(self, name: str, nbytes: int):
        from tapeout.targets import cuda_rt

        buf = self.buffers.get(name)
        if buf is None or buf.nbytes < nbytes:
            buf = self.buffers[name] = cuda_rt.Buffer(nbytes)
        return buf

    def _enqueue(self) -> None:
        if not self.context.execute_async_v3(self.stream.address):
            raise TapeoutError("TensorRT's execute_async_v3 failed", fix="`tapeout check -v` prints TensorRT's log")

    def _fetch(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from tapeout.targets import cuda_rt

        for name, host in outputs.items():
            self.stream.copy(host.ctypes.data, self.buffers[name].address, host.nbytes, cuda_rt.D2H)
        self.stream.synchronize()
        return outputs

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = self._prepare(feeds)
        self._enqueue()
        return self._fetch(outputs)

    def bind(self, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
        self._prepare(feeds)
        self._enqueue()  # TensorRT sets up its shapes on the first enqueue: never inside a capture
        self.stream.synchronize()
        if self.cuda_graph:
            self.stream.capture(self._enqueue)
            return self.stream.replay
        return self._enqueue

    def bind_with_copies(self, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
        return lambda: self._run(feeds)

    def synchronize(self) -> None:
        self.stream.synchronize()


def parse_layers(info: dict) -> list[dict]:
    """The inspector's JSON (TensorRT 10 and 11 schemas) → name, type, precision, tactic, sparse per layer."""
    layers = []
    for raw in info.get("Layers", []):
        if isinstance(raw, str):  # LAYER_NAMES_ONLY verbosity: names alone
            layers.append({"name": raw, "type": "", "precision": "unknown", "tactic": ""})
            continue
        tensors = [t for t in raw.get("Inputs", []) + raw.get("Outputs", []) if isinstance(t, dict)]
        kinds = [str(t.get("DataType") or t.get("Format/Datatype") or "") for t in tensors]
        tactic = str(raw.get("TacticName") or raw.get("Tactic") or raw.get("TacticValue") or "")
        layers.append(
            {
                "name": str(raw.get("Name", "")),
                "type": str(raw.get("LayerType", "")),
                "precision": _precision_of(kinds),
                "tactic": tactic,
                "sparse": "sparse" in tactic.lower(),
            }
        )
    return layers


def _precision_of(kinds: list[str]) -> str:
    """The lowest precision among a layer's tensors: a fused INT8 conv reads INT8 and may write FP16."""
    text = " ".join(kinds).lower()
    for name, needles in (
        ("FP8", ("fp8", "e4m3")),
        ("INT8", ("int8",)),
        ("FP16", ("half", "fp16")),
        ("BF16", ("bf16",)),
        ("FP32", ("float", "fp32")),
        ("INT32", ("int32",)),
        ("INT64", ("int64",)),
    ):
        if any(n in text for n in needles):
            return name
    return "unknown"


def _logger(trt):
    class Logger(trt.ILogger):
        """TensorRT reports build failures through the logger, not the return value: keep the errors."""

        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity, msg) -> None:
            if severity in (trt.ILogger.ERROR, trt.ILogger.INTERNAL_ERROR):
                self.errors.append(str(msg))

        def last_error(self) -> str:
            return self.errors[-1] if self.errors else ""

    return Logger()


def _progress_monitor(trt, progress: Callable[[str], None]):
    """Build phases as progress lines (IProgressMonitor exists from TensorRT 10)."""
    base = getattr(trt, "IProgressMonitor", None)
    if base is None:
        return None

    class Monitor(base):
        def __init__(self) -> None:
            base.__init__(self)
            self.last = 0.0

        def phase_start(self, phase_name, parent_phase, num_steps) -> None:
            progress(f"engine build: {phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name, step) -> bool:
            now = time.perf_counter()
            if now - self.last > 2.0:  # a line every 2 s at most
                self.last = now
                progress(f"engine build: {phase_name}, step {step + 1}")
            return True  # False would cancel the build

        def phase_finish(self, phase_name) -> None:
            return None

    return Monitor()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")[:40] or "unknown"
