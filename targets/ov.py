"""OpenVINO: Intel CPU, GPU and NPU through one runtime.

compile = read the ONNX model, pin its symbolic dims to the project's values where the device
needs static shapes (NPU) or the profile asks for it, check every op is supported on the device
(`query_model`), and save OpenVINO IR (model.xml + model.bin) as the artifact. The compiled blob
is a cache beside the artifact, not the artifact: it is tied to the OpenVINO version and the
device, and OpenVINO rebuilds it when either differs.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tapeout.core.artifact import Artifact
from tapeout.core.decoding import INPUT_IDS, CacheLayout
from tapeout.core.errors import BadInput, TargetUnavailable, first_line, runtime_detail
from tapeout.core.schemas import InputSpec
from tapeout.targets import ov_attention
from tapeout.targets.base import CachedDecoder, LintIssue, OpProfile, OpTime, Probe, Session, Target
from tapeout.targets.ov_attention import BEAM_INDEX

ARTIFACT_FILE = "model.xml"
CACHE_DIR = "ov_cache"  # beside artifact/ in the build dir, so the artifact's hashes stay fixed
INSTALL = 'pip install "tapeout[openvino]"'


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    device: Literal["CPU", "GPU", "NPU"] = "CPU"
    performance_hint: Literal["LATENCY", "THROUGHPUT"] = "LATENCY"
    num_streams: int | None = Field(None, ge=1, le=1024, description="default: what the hint picks")
    threads: int = Field(0, ge=0, le=4096, description="CPU inference threads (INFERENCE_NUM_THREADS); 0 = the "
                         "plugin's choice. CPU device only")
    inference_precision: Literal["default", "f32", "f16", "bf16"] = "default"
    kv_cache_precision: Literal["default", "f32", "f16", "bf16", "u8"] = Field(
        "default", description="the KV cache's element type in a generate loop's fused attention (KV_CACHE_PRECISION); "
        "default: inference_precision where that is set (the CPU plugin's own default is u8, a quantized cache), "
        "else the plugin's")
    pin_shapes: bool | None = Field(None, description="default: pinned for NPU, dynamic elsewhere")

    @model_validator(mode="after")
    def _threads_on_cpu(self):
        if self.threads and self.device != "CPU":
            raise ValueError(f"threads is OpenVINO's CPU setting (INFERENCE_NUM_THREADS); device {self.device} takes "
                             "none: leave threads at 0")
        return self

    def pins(self) -> bool:
        return self.pin_shapes if self.pin_shapes is not None else self.device == "NPU"


@functools.cache
def _core():
    """One Core per process: it loads the device plugins, which every later call shares."""
    import openvino as ov

    return ov.Core()


def _read(core, model_path: Path):
    try:
        return core.read_model(str(model_path))
    except Exception as exc:
        raise BadInput(f"OpenVINO could not read {model_path}: {first_line(exc)}",
                       detail=runtime_detail(exc), fix="check the model with `tapeout lint`, or export it again") from None


def _pin(model, inputs: list[InputSpec], dims: dict[str, int]) -> None:
    model.reshape({spec.name: list(spec.concrete_shape(dims)) for spec in inputs})


def _config(options: Options) -> dict:
    config = {"PERFORMANCE_HINT": options.performance_hint}
    if options.num_streams is not None:
        config["NUM_STREAMS"] = str(options.num_streams)
    if options.threads:
        config["INFERENCE_NUM_THREADS"] = options.threads
    if options.inference_precision != "default":
        config["INFERENCE_PRECISION_HINT"] = options.inference_precision
    kv_cache = options.kv_cache_precision if options.kv_cache_precision != "default" else options.inference_precision
    if kv_cache != "default" and options.device == "CPU":
        config["KV_CACHE_PRECISION"] = kv_cache
    return config


class OvSession(Session):
    """The artifact, compiled on first use: the plain model for single calls, or, for a generate workload, the
    stateful one (`decoder`), so a generating process compiles only what it runs."""

    def __init__(self, core, path: Path, device: str, config: dict):
        self._core, self._path, self._device, self._config = core, path, device, config
        self._model = _read(core, path)
        self.input_names = [i.get_any_name() for i in self._model.inputs]
        self.output_names = [o.get_any_name() for o in self._model.outputs]
        self._compiled = self._request = self._stateful = None
        self._fused = 0

    def _compile(self, model):
        try:
            return self._core.compile_model(model, self._device, self._config)
        except Exception as exc:
            raise BadInput(f"OpenVINO could not compile {self._path} for {self._device}: {first_line(exc)}",
                           detail=runtime_detail(exc), fix="rebuild the artifact with this OpenVINO version") from None

    def _plain(self):
        if self._compiled is None:
            self._compiled = self._compile(str(self._path))  # by path: the blob cache (CACHE_DIR) applies
            self._request = self._compiled.create_infer_request()
        return self._compiled, self._request

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        compiled, request = self._plain()
        results = request.infer(feeds)
        return {name: np.array(results[port]) for name, port in zip(self.output_names, compiled.outputs, strict=True)}

    def bind(self, feeds: dict[str, np.ndarray]):
        _, request = self._plain()
        return lambda: request.infer(feeds, share_inputs=True, share_outputs=True)

    def decoder(self, layout: CacheLayout) -> CachedDecoder:
        if self._stateful is None:  # the model read for the names, made stateful in place (the plain one compiles
            model, fused = stateful(self._model, layout)  # from the path), once per session
            self._stateful, self._fused = self._compile(model), fused
        return OvStatefulDecoder(self._stateful, layout, self._fused)


def stateful(model, layout: CacheLayout):
    """The cache graph as OpenVINO's stateful model: each past/present pair becomes one state variable the plugin
    keeps between calls (ReadValue/Assign), so only the token ids go in and the logits come out. A state starts as
    zeros of [batch of input_ids, kv_heads, 0, head_dim] after each reset (OpenVINO's default initial value would
    take batch 0 from the variable's dynamic shape). Attention over the state becomes the plugin's fused kernel
    where the chain matches (targets/ov_attention.py); returns the model and how many layers were fused."""
    from openvino import opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    apply_make_stateful_transformation(model, dict(zip(layout.past(), layout.outputs()[1:], strict=True)))
    shape = ops.shape_of(model.input(INPUT_IDS), output_type="i64")
    batch = ops.gather(shape, ops.constant(np.array([0], np.int64)), ops.constant(np.int64(0)))
    empty = [ops.constant(np.array([n], np.int64)) for n in (layout.kv_heads, 0, layout.head_dim)]
    for op in model.get_ops():
        if op.get_type_name() == "ReadValue":
            zeros = ops.broadcast(ops.constant(np.zeros((), np.dtype(layout.dtype))), ops.concat([batch, *empty], 0))
            op.set_arguments([zeros])
    model.validate_nodes_and_infer_types()
    fused = ov_attention.fuse(model)
    ov_attention.with_beam_index(model)
    return model, fused


class OvStatefulDecoder(CachedDecoder):
    """The KV cache in OpenVINO's own state (the stateful model): prefill resets it, each step appends to it
    inside the plugin; nothing of the cache crosses to the host. A step writes its token into an input tensor
    bound once and reads the logits from the request's own output tensor: building the feed dict and the result
    dict each call cost ~0.1 ms of a 1.9 ms llama-40m INT4 step."""

    def __init__(self, compiled, layout: CacheLayout, fused: int = 0):
        super().__init__(lambda feeds: {}, layout)
        self._request = compiled.create_infer_request()
        self._ids = None
        kernels = [op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ops()]
        in_place = kernels.count("ScaledDotProductAttention")
        self.description = (f"OpenVINO stateful model; attention fused over the state in {fused} of "
                            f"{layout.layers} layers ({in_place} fused attention kernels compiled)")

    def _infer(self, ids: np.ndarray) -> np.ndarray:
        if self._ids is None or self._ids.shape != ids.shape:
            from openvino import Tensor

            self._ids = Tensor(np.zeros(ids.shape, np.int64))
            self._request.set_tensor(INPUT_IDS, self._ids)
        self._ids.data[...] = ids
        self._request.infer()
        return self._request.get_output_tensor(0).data[:, -1].copy()  # the request reuses its buffer next call

    def prefill(self, ids: np.ndarray) -> np.ndarray:
        from openvino import Tensor

        self._request.reset_state()  # greedy: each row continues its own cache
        self._request.set_tensor(BEAM_INDEX, Tensor(np.arange(ids.shape[0], dtype=np.int32)))
        return self._infer(ids)

    def step(self, ids: np.ndarray) -> np.ndarray:
        return self._infer(ids)


class OpenVino(Target):
    Options = Options

    @classmethod
    def probe(cls) -> Probe:
        try:
            import openvino as ov
        except ImportError as exc:
            return Probe(False, reason=f"openvino cannot be imported ({exc})", install_hint=INSTALL)
        return Probe(True, ov.__version__, details={"devices": _core().available_devices})

    def preflight(self) -> None:
        """Before any work: the profile's device must exist here (exit 4 with the driver to install)."""
        self._require_device()

    def _require_device(self):
        core, device = _core(), self.options.device
        if device not in core.available_devices:
            hint = ("the Intel NPU driver (intel-npu-driver / the Windows NPU driver) must be installed on the device"
                    if device == "NPU" else f"{device} plugin or driver missing")
            raise TargetUnavailable(f"OpenVINO device {device} is not available here "
                                    f"(have: {', '.join(core.available_devices)})", fix=hint)
        return core

    def lint(self, model_path: Path, inputs: list[InputSpec], dims: dict[str, int]) -> list[LintIssue]:
        """The ONNX checks, then the ops the device does not support, each by name."""
        options = self.options
        issues = super().lint(model_path, inputs, dims)
        if any(i.severity == "error" for i in issues):
            return issues
        core = self._require_device()
        model = _read(core, model_path)
        dynamic = [i.get_any_name() for i in model.inputs if i.get_partial_shape().is_dynamic]
        if dynamic and options.device == "NPU" and options.pin_shapes is False:
            issues.append(LintIssue("error", f"inputs {', '.join(dynamic)} have dynamic dims; the NPU compiler needs static "
                                    "shapes", "leave [options] pin_shapes unset (pinned to [dims]) or set it to true"))
        if options.pins():
            _pin(model, inputs, dims)
        supported = core.query_model(model, options.device)
        for op in model.get_ops():
            name = op.get_friendly_name()
            if op.get_type_name() in ("Parameter", "Result", "Constant") or name in supported:
                continue
            issues.append(LintIssue("error", f"{op.get_type_name()} is not supported on OpenVINO {options.device}",
                                    "replace the op in the model, or target another device", node=name))
        return issues

    def compile(self, model_path: Path, out_dir: Path, inputs: list[InputSpec], dims: dict[str, int]) -> Artifact:
        import openvino as ov

        options = self.options
        core = self._require_device()
        model = _read(core, model_path)
        if options.pins():
            _pin(model, inputs, dims)
        out_dir.mkdir(parents=True, exist_ok=True)
        ov.save_model(model, str(out_dir / ARTIFACT_FILE), compress_to_fp16=False)
        # Compile once here: it proves the device accepts the model, and fills the blob cache
        # (build_dir/ov_cache) that sessions on this machine then load instead of compiling.
        compiled = core.compile_model(str(out_dir / ARTIFACT_FILE), options.device,
                                      {**_config(options), "CACHE_DIR": str(out_dir.parent / CACHE_DIR)})
        return Artifact(self.name, out_dir, ARTIFACT_FILE, meta={
            "device": options.device, "pinned_shapes": options.pins(),
            "execution_devices": list(compiled.get_property("EXECUTION_DEVICES")),
            "inference_precision": compiled.get_property("INFERENCE_PRECISION_HINT").to_string(),
            **({"kv_cache_precision": compiled.get_property("KV_CACHE_PRECISION").to_string(),
                "dynamic_quantization_group_size": int(compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE"))}
               if options.device == "CPU" else {}),
            **({"inference_threads": int(compiled.get_property("INFERENCE_NUM_THREADS"))}
               if options.device == "CPU" else {}),
        })

    def session(self, artifact: Artifact) -> OvSession:
        return self._session(artifact)

    def _session(self, artifact: Artifact, profile: bool = False) -> OvSession:
        core = self._require_device()
        config = {**_config(self.options), "CACHE_DIR": str(artifact.directory.parent / CACHE_DIR)}
        if profile:
            config["PERF_COUNT"] = "YES"
        return OvSession(core, artifact.path, self.options.device, config)

    def op_profile(self, artifact: Artifact, feeds: dict[str, np.ndarray], iterations: int) -> OpProfile:
        """Per-node times from OpenVINO's counters (PERF_COUNT) over `iterations` runs after a warm-up.

        The CPU plugin's counter is not the last run's time: it is the running mean, in whole µs, of every
        run since compile (PerfCount::avg(), total / count), so summing it per run counts the first run's
        one-time costs again and again (a toy ResNet's last FullyConnected read 60 µs after the warm-up
        and 18 µs twelve runs later, settling at ~3). Each node's mean over the timed runs is taken from
        its running totals instead: (count · mean after them - count · mean before them) / runs."""
        sess = self._session(artifact, profile=True)
        call = sess.bind(feeds)
        warmup = 3
        for _ in range(warmup):
            call()
        before = _executed(sess)
        run_total = 0.0
        for _ in range(iterations):
            start = time.perf_counter()
            call()
            run_total += (time.perf_counter() - start) * 1e6
        after = _executed(sess)
        ops = [OpTime(name, node_type, f"{self.options.device}:{exec_type}", iterations,
                      timed_total_us(before[name][2] if name in before else None, mean_after, warmup, iterations))
               for name, (node_type, exec_type, mean_after) in after.items()]
        return OpProfile(iterations, run_total, ops,
                         method=self.capabilities.op_profiler or "")


def timed_total_us(mean_before: float | None, mean_after: float, warmup: int, iterations: int) -> float:
    """A node's total µs over the timed runs, from its running mean (whole µs, floored) after the `warmup`
    runs and after the timed ones: the difference of the running totals. Floored, each mean stands for the
    middle of its µs. A node the last warm-up run did not execute has no total before."""
    before = warmup * (mean_before + 0.5) if mean_before is not None else 0.0
    return max((warmup + iterations) * (mean_after + 0.5) - before, 0.0)


def _executed(sess) -> dict[str, tuple[str, str, float]]:
    """node -> (type, kernel, running mean µs) for the nodes the last run executed."""
    return {info.node_name: (info.node_type, info.exec_type, info.real_time.total_seconds() * 1e6)
            for info in sess._request.get_profiling_info() if str(info.status) == "Status.EXECUTED"}
