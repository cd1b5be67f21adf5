"""OpenVINO: Intel CPU, GPU and NPU through one runtime.

compile = read the ONNX model, pin its symbolic dims to the project's values where the device
needs static shapes (NPU) or the profile asks for it, check every op is supported on the device
(`query_model`), and save OpenVINO IR (model.xml + model.bin) as the artifact. The compiled blob
is a cache beside the artifact, not the artifact: it is tied to the OpenVINO version and the
device, and OpenVINO rebuilds it when either differs.

A generate workload decodes over OpenVINO's stateful model. On the NPU, whose compiler takes static shapes only,
it runs the NPU plugin's own LLM pipeline (NPUW_LLM, what OpenVINO GenAI uses there): the plugin compiles a
prefill model padded to the workload's max_prompt and a one-token model over a cache of max_context, and masks
the padding, so the exported graph takes attention_mask and position_ids. `npuw_devices = "CPU"` runs that same
pipeline's subgraphs on the host's CPU through the NPU plugin, without an NPU or its driver: the static-shape
path verified before the device, with the CPU's timings (not judged).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tapeout.core.artifact import Artifact
from tapeout.core.decoding import ATTENTION_MASK, INPUT_IDS, CacheLayout
from tapeout.core.errors import BadInput, TargetUnavailable, first_line, runtime_detail
from tapeout.core.schemas import InputSpec
from tapeout.core.speech import SpeechLayout
from tapeout.targets import ov_attention, ov_profile
from tapeout.targets.base import CachedDecoder, LintIssue, OpProfile, OpTime, Probe, Session, SpeechDecoder, Target
from tapeout.targets.ov_attention import BEAM_INDEX

ARTIFACT_FILE = "model.xml"
CACHE_DIR = "ov_cache"  # beside artifact/ in the build dir, so the artifact's hashes stay fixed
INSTALL = 'pip install "tapeout[openvino]"'


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    device: Literal["CPU", "GPU", "NPU"] = "CPU"
    performance_hint: Literal["LATENCY", "THROUGHPUT"] = "LATENCY"
    num_streams: int | None = Field(None, ge=1, le=1024, description="default: what the hint picks")
    threads: int = Field(
        0,
        ge=0,
        le=4096,
        description="CPU inference threads (INFERENCE_NUM_THREADS); 0 = the plugin's choice. CPU device only",
    )
    inference_precision: Literal["default", "f32", "f16", "bf16"] = "default"
    kv_cache_precision: Literal["default", "f32", "f16", "bf16", "u8"] = Field(
        "default",
        description="the KV cache's element type in a generate loop's fused attention (KV_CACHE_PRECISION); "
        "default: inference_precision where that is set (the CPU plugin's own default is u8, a quantized cache), "
        "else the plugin's",
    )
    pin_shapes: bool | None = Field(None, description="default: pinned for NPU, dynamic elsewhere")
    npuw_devices: Literal["NPU", "CPU"] = Field(
        "NPU",
        description="device NPU only: where the NPU plugin's "
        'partitioned pipeline (NPUW) runs its subgraphs; "CPU" runs the NPU\'s '
        "static-shape path on this host's CPU, with no NPU or driver (timings "
        "are the CPU's and not judged)",
    )

    @model_validator(mode="after")
    def _threads_on_cpu(self):
        if self.threads and self.device != "CPU":
            raise ValueError(
                f"threads is OpenVINO's CPU setting (INFERENCE_NUM_THREADS); device {self.device} takes "
                "none: leave threads at 0"
            )
        if self.npuw_devices != "NPU" and self.device != "NPU":
            raise ValueError(f"npuw_devices is the NPU plugin's setting; device {self.device} takes none: remove it")
        return self

    def on_host_cpu(self) -> bool:
        """The NPU's pipeline with its subgraphs on this host's CPU: no NPU needed."""
        return self.device == "NPU" and self.npuw_devices == "CPU"

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
        raise BadInput(
            f"OpenVINO could not read {model_path}: {first_line(exc)}",
            detail=runtime_detail(exc),
            fix="check the model with `tapeout lint`, or export it again",
        ) from None


def pin(model, inputs: list[InputSpec], dims: dict[str, int]) -> None:
    model.reshape({spec.name: list(spec.concrete_shape(dims)) for spec in inputs})


def compile_config(options: Options) -> dict:
    """The plugin's configuration for the profile's options, as a build compiles with it (and the estimator's
    reading of the kernels it runs)."""
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
    if options.on_host_cpu():
        config.update({"NPU_USE_NPUW": "YES", "NPUW_DEVICES": "CPU"})
    return config


def _npu_llm(config: dict, layout: CacheLayout) -> dict:
    """The NPU plugin's LLM pipeline: a prefill model padded to max_prompt and a one-token model over a cache of
    max_context (MAX_PROMPT_LEN + MIN_RESPONSE_LEN), both static, the padding masked by the plugin."""
    # NPUW_ONLINE_PIPELINE NONE: each model compiles whole. The plugin's online partitioning (repeated blocks folded
    # into function calls) leaves a cache input of the prefill model undeclared on the graph torch's exporter
    # writes (OpenVINO 2026.4.1: "Model references undeclared parameters"); whole models compile and decode right.
    # NPUW_DCOFF_SCALE NO: the weight scales stay in the model; unpacking them on the host asserts FP32 scales, and
    # NNCF writes FP16 ones ("Assertion scale_elem_type == f32").
    prompt, cache = npu_static_sizes(layout)
    return {
        **config,
        "NPU_USE_NPUW": "YES",
        "NPUW_LLM": "YES",
        "NPUW_LLM_MAX_PROMPT_LEN": prompt,
        "NPUW_LLM_MIN_RESPONSE_LEN": cache - prompt,
        "NPUW_ONLINE_PIPELINE": "NONE",
        "NPUW_DCOFF_SCALE": "NO",
    }


def npu_static_sizes(layout: CacheLayout) -> tuple[int, int]:
    """The NPU pipeline's static prefill length and cache size: the plugin rounds both parts up to 64 tokens, and its
    cache holds one token fewer than its size (the one-token model's new entry), so max_context takes one more."""
    prompt = -(-layout.max_prompt // 64) * 64
    return prompt, prompt + -(-(layout.max_context + 1 - layout.max_prompt) // 64) * 64


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

    def _compile(self, model, config: dict | None = None):
        try:
            return self._core.compile_model(model, self._device, config or self._config)
        except Exception as exc:
            raise BadInput(
                f"OpenVINO could not compile {self._path} for {self._device}: {first_line(exc)}",
                detail=runtime_detail(exc),
                fix="rebuild the artifact with this OpenVINO version",
            ) from None

    def _plain(self, feeds: dict[str, np.ndarray]):
        if self._compiled is None:
            if self._device == "NPU" and any(i.get_partial_shape().is_dynamic for i in self._model.inputs):
                # a generate build's cache graph stays dynamic for the NPU's LLM pipeline (it pins its own
                # shapes); a single call on the NPU compiler needs static ones: the first call's
                model = _read(self._core, self._path)
                model.reshape({name: list(np.shape(feeds[name])) for name in self.input_names})
                self._compiled = self._compile(model)
            else:
                self._compiled = self._compile(str(self._path))  # by path: the blob cache (CACHE_DIR) applies
            self._request = self._compiled.create_infer_request()
        return self._compiled, self._request

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        compiled, request = self._plain(feeds)
        results = request.infer(feeds)
        return {name: np.array(results[port]) for name, port in zip(self.output_names, compiled.outputs, strict=True)}

    def bind(self, feeds: dict[str, np.ndarray]):
        _, request = self._plain(feeds)
        return lambda: request.infer(feeds, share_inputs=True, share_outputs=True)

    def speech_decoder(self, layout: SpeechLayout) -> SpeechDecoder:
        """The decoder step fed its caches without a copy (the plain call copies every input: the cross cache is
        tens of MB a step); its outputs are copied out, since the next call's inputs are this one's presents."""

        def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            compiled, request = self._plain(feeds)
            results = request.infer(feeds, share_inputs=True)
            return {n: np.array(results[port]) for n, port in zip(self.output_names, compiled.outputs, strict=True)}

        decoder = SpeechDecoder(run, layout)
        decoder.description = "both caches in host arrays shared with the plugin (not copied in); presents copied out"
        return decoder

    def decoder(self, layout: CacheLayout) -> CachedDecoder:
        if self._device == "NPU":
            if not layout.masked:
                raise BadInput(
                    f"{self._path} is a cache graph without attention_mask and position_ids, which the NPU's "
                    "static-shape pipeline feeds",
                    fix="build it again with this version of tapeout",
                )
            if self._stateful is None:
                self._stateful = self._compile(npu_stateful(self._model, layout), _npu_llm(self._config, layout))
            return OvNpuDecoder(self._stateful, layout)
        if self._stateful is None:  # the model read for the names, made stateful in place (the plain one compiles
            model, fused = stateful(self._model, layout)  # from the path), once per session
            self._stateful, self._fused = self._compile(model), fused
        return OvStatefulDecoder(self._stateful, layout, self._fused)


def npu_stateful(model, layout: CacheLayout):
    """The masked cache graph as the stateful model the NPU plugin's LLM pipeline takes: the cache in state
    variables named as it finds them (past_key_values.N.key → present.N.key), read through beam_idx."""
    from openvino._offline_transformations import apply_make_stateful_transformation

    _cache_shape_from_mask(model, layout)
    _mask_fill_for_f16(model)
    pairs = {}
    for past, present in zip(layout.past(), layout.present(), strict=True):
        kind, layer = past.split("_")[1:]
        pairs[f"past_key_values.{layer}.{kind}"] = f"present.{layer}.{kind}"
        model.input(past).get_tensor().set_names({f"past_key_values.{layer}.{kind}"})
        model.output(present).get_tensor().set_names({f"present.{layer}.{kind}"})
    apply_make_stateful_transformation(model, pairs)
    _zero_initial_state(model, layout)
    ov_attention.with_beam_index(model)
    return model


def _mask_fill_for_f16(model) -> None:
    """The masked scores take float32's lowest value (torch's masked_fill); the NPU computes in FP16, where that is
    -inf, and a padded query row the plugin adds in front of the prompt has every key masked: -inf everywhere, a NaN
    softmax, and NaN keys and values that the real rows then read. FP16's lowest (-65504) masks as well and keeps
    such a row finite (uniform weights over nothing that is read)."""
    from openvino import opset13 as ops

    lowest = float(np.finfo(np.float32).min)
    for op in model.get_ops():
        value = op.get_data() if op.get_type_name() == "Constant" else None
        if value is None or value.dtype != np.float32 or value.size != 1 or float(value.ravel()[0]) > lowest / 2:
            continue
        fill = ops.constant(np.full(value.shape, np.finfo(np.float16).min, np.float32))
        for target in list(op.output(0).get_target_inputs()):
            target.replace_source_output(fill.output(0))
    model.validate_nodes_and_infer_types()


def _cache_shape_from_mask(model, layout: CacheLayout) -> None:
    """torch's exporter reads the batch and the cache length off whichever cache input it traced them from (a ShapeOf
    of past_value_1, say); the NPU plugin rebuilds each cache input for its static models and expects nothing but
    the Concat to read it. The same shape follows from the other inputs: [batch of input_ids, kv_heads, mask length
    - input length, head_dim] (the masked signature's contract, core/decoding.py)."""
    from openvino import opset13 as ops

    ids = ops.shape_of(model.input(INPUT_IDS), output_type="i64")
    mask = ops.shape_of(model.input(ATTENTION_MASK), output_type="i64")
    at = [ops.constant(np.array([i], np.int64)) for i in (0, 1)]
    axis = ops.constant(np.int64(0))
    batch = ops.gather(ids, at[0], axis)
    length = ops.subtract(ops.gather(mask, at[1], axis), ops.gather(ids, at[1], axis))
    heads, width = (ops.constant(np.array([n], np.int64)) for n in (layout.kv_heads, layout.head_dim))
    shape = ops.concat([batch, heads, length, width], 0)
    for name in layout.past():
        for target in list(model.input(name).get_target_inputs()):
            node = target.get_node()
            if node.get_type_name() == "ShapeOf":
                wanted = node.get_output_element_type(0)
                same = shape if wanted.get_type_name() == "i64" else ops.convert(shape, wanted)
                for user in list(node.output(0).get_target_inputs()):
                    user.replace_source_output(same.output(0))
    model.validate_nodes_and_infer_types()


def _zero_initial_state(model, layout: CacheLayout) -> None:
    """Each state starts as zeros of [batch of input_ids, kv_heads, 0, head_dim] after a reset (OpenVINO's default
    initial value would take batch 0 from the variable's dynamic shape)."""
    from openvino import opset13 as ops

    shape = ops.shape_of(model.input(INPUT_IDS), output_type="i64")
    batch = ops.gather(shape, ops.constant(np.array([0], np.int64)), ops.constant(np.int64(0)))
    empty = [ops.constant(np.array([n], np.int64)) for n in (layout.kv_heads, 0, layout.head_dim)]
    for op in model.get_ops():
        if op.get_type_name() == "ReadValue":
            zeros = ops.broadcast(ops.constant(np.zeros((), np.dtype(layout.dtype))), ops.concat([batch, *empty], 0))
            op.set_arguments([zeros])
    model.validate_nodes_and_infer_types()


def stateful(model, layout: CacheLayout):
    """The cache graph as OpenVINO's stateful model: each past/present pair becomes one state variable the plugin
    keeps between calls (ReadValue/Assign), so only the token ids go in and the logits come out, each state
    starting as zeros after a reset. Attention over the state becomes the plugin's fused kernel
    where the chain matches (targets/ov_attention.py); returns the model and how many layers were fused."""
    from openvino._offline_transformations import apply_make_stateful_transformation

    apply_make_stateful_transformation(model, dict(zip(layout.past(), layout.outputs()[1:], strict=True)))
    _zero_initial_state(model, layout)
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
        self.description = (
            f"OpenVINO stateful model; attention fused over the state in {fused} of "
            f"{layout.layers} layers ({in_place} fused attention kernels compiled)"
        )

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


class OvNpuDecoder(CachedDecoder):
    """The NPU plugin's LLM pipeline (NPUW_LLM): the prompt goes in whole and the plugin pads it to max_prompt for its
    static prefill model; each step feeds one token with the mask over every position so far and its position. The
    cache stays in the plugin, which copies the prefill's cache into the one-token model's static buffers."""

    def __init__(self, compiled, layout: CacheLayout):
        super().__init__(lambda feeds: {}, layout)
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        self._length = 0
        prompt, cache = npu_static_sizes(layout)
        self.description = (
            f"OpenVINO NPU LLM pipeline (NPUW_LLM): prompts padded to a static prefill of {prompt} "
            f"tokens, decode over a static {cache}-token cache"
        )

    def _infer(self, ids: np.ndarray) -> np.ndarray:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        feeds = {INPUT_IDS: ids, **self.layout.positions(ids.shape[0], self._length, ids.shape[1])}
        self._request.infer(feeds)
        self._length += ids.shape[1]
        return self._request.get_output_tensor(0).data[:, -1].copy()

    def prefill(self, ids: np.ndarray) -> np.ndarray:
        from openvino import Tensor

        if ids.shape[1] > self.layout.max_prompt:
            raise BadInput(
                f"a prompt of {ids.shape[1]} tokens is longer than the NPU pipeline's static prefill "
                f"({self.layout.max_prompt} tokens)",
                fix="raise [workload] max_prompt and build again",
            )
        if ids.shape[1] == 1:
            # the pipeline prefills prompts of 2+ tokens; one token is a decode step, which would continue the last
            # sequence: a fresh request starts it over an empty cache
            self._request = self._compiled.create_infer_request()
        else:
            self._request.reset_state()
        self._length = 0
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

    def static_decode(self) -> bool:
        return self.options.device == "NPU"

    def scorer(self) -> OpenVino | None:
        """The NPU's pipeline decodes only as a whole loop: candidates are scored on this host's CPU plugin, same IR and
        inference precision, shapes dynamic."""
        if self.options.device != "NPU":
            return None
        return OpenVino(
            self.name, self.capabilities, Options(device="CPU", inference_precision=self.options.inference_precision)
        )

    def emulated(self) -> str | None:
        if self.options.on_host_cpu():
            return (
                "the NPU plugin's pipeline with its subgraphs on this host's CPU (npuw_devices = \"CPU\"): "
                "timings are the CPU's, not the NPU's"
            )
        return None

    def _require_device(self):
        core, device = _core(), self.options.device
        if self.options.on_host_cpu():
            try:  # the plugin itself, without the driver an NPU needs
                core.get_property("NPU", "SUPPORTED_PROPERTIES")
            except Exception as exc:
                raise TargetUnavailable(
                    f"OpenVINO's NPU plugin cannot be loaded here ({first_line(exc)})", fix=INSTALL
                ) from None
            return core
        if device not in core.available_devices:
            hint = (
                "the Intel NPU driver (intel-npu-driver / the Windows NPU driver) must be installed on the device"
                if device == "NPU"
                else f"{device} plugin or driver missing"
            )
            raise TargetUnavailable(
                f"OpenVINO device {device} is not available here (have: {', '.join(core.available_devices)})", fix=hint
            )
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
            issues.append(
                LintIssue(
                    "error",
                    f"inputs {', '.join(dynamic)} have dynamic dims; the NPU compiler needs static shapes",
                    "leave [options] pin_shapes unset (pinned to [dims]) or set it to true",
                )
            )
        if options.pins():
            pin(model, inputs, dims)
        # the NPU's pipeline on this host's CPU runs every subgraph on the CPU plugin, and the NPU compiler that
        # would answer for the NPU ships with its driver
        device = "CPU" if options.on_host_cpu() else options.device
        supported = core.query_model(model, device)
        for op in model.get_ops():
            name = op.get_friendly_name()
            if op.get_type_name() in ("Parameter", "Result", "Constant") or name in supported:
                continue
            issues.append(
                LintIssue(
                    "error",
                    f"{op.get_type_name()} is not supported on OpenVINO {device}",
                    "replace the op in the model, or target another device",
                    node=name,
                )
            )
        return issues

    def compile(self, model_path: Path, out_dir: Path, inputs: list[InputSpec], dims: dict[str, int]) -> Artifact:
        import openvino as ov

        options = self.options
        core = self._require_device()
        model = _read(core, model_path)
        # a masked cache graph stays dynamic: the NPU's LLM pipeline compiles its prefill and decode shapes itself
        pins = options.pins() and not any(spec.name == ATTENTION_MASK for spec in inputs)
        if pins:
            pin(model, inputs, dims)
        out_dir.mkdir(parents=True, exist_ok=True)
        ov.save_model(model, str(out_dir / ARTIFACT_FILE), compress_to_fp16=False)
        # Compile once here: it proves the device accepts the model, and fills the blob cache
        # (build_dir/ov_cache) that sessions on this machine then load instead of compiling.
        compiled_from = str(out_dir / ARTIFACT_FILE)
        if options.device == "NPU" and not pins:  # the NPU compiler takes the one decode step the per-call
            pin(model, inputs, dims)  # figures time, as OvSession._plain does
            compiled_from = model
        compiled = core.compile_model(
            compiled_from, options.device, {**compile_config(options), "CACHE_DIR": str(out_dir.parent / CACHE_DIR)}
        )
        return Artifact(
            self.name,
            out_dir,
            ARTIFACT_FILE,
            meta={
                "device": options.device,
                "pinned_shapes": pins,
                "execution_devices": list(compiled.get_property("EXECUTION_DEVICES")),
                # the NPU plugin answers this through its compiler, which ships with the driver
                "inference_precision": (
                    options.inference_precision
                    if options.on_host_cpu()
                    else compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
                ),
                **({"npuw_devices": options.npuw_devices} if options.device == "NPU" else {}),
                **(
                    {
                        "kv_cache_precision": compiled.get_property("KV_CACHE_PRECISION").to_string(),
                        "dynamic_quantization_group_size": int(
                            compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE")
                        ),
                    }
                    if options.device == "CPU"
                    else {}
                ),
                **(
                    {"inference_threads": int(compiled.get_property("INFERENCE_NUM_THREADS"))}
                    if options.device == "CPU"
                    else {}
                ),
            },
        )

    def session(self, artifact: Artifact) -> OvSession:
        return self._session(artifact)

    def _session(self, artifact: Artifact, profile: bool = False) -> OvSession:
        core = self._require_device()
        config = {**compile_config(self.options), "CACHE_DIR": str(artifact.directory.parent / CACHE_DIR)}
        if profile:
            config["PERF_COUNT"] = "YES"
        return OvSession(core, artifact.path, self.options.device, config)

    def op_profile(
        self, artifact: Artifact, feeds: dict[str, np.ndarray], iterations: int, pace_s: float | None = None
    ) -> OpProfile:
        """Per-node times from OpenVINO's counters (PERF_COUNT) over a window of at least `iterations` runs after a
        warm-up: each node's mean over the window from its running totals (ov_profile.py). Where the caller timed
        the model already (`pace_s`), the warm-up and the window keep to that pace."""
        sess = self._session(artifact, profile=True)
        call = sess.bind(feeds)
        window = ov_profile.paced_window(call, lambda: ov_profile.executed_nodes(sess._request), iterations, pace_s)
        ops = [
            OpTime(name, node_type, f"{self.options.device}:{exec_type}", window.runs, total_us)
            for name, (node_type, exec_type, total_us) in window.nodes.items()
        ]
        return OpProfile(
            window.runs,
            window.run_total_us,
            ops,
            method=self.capabilities.op_profiler or "",
            median_run_us=window.median_s * 1e6,
        )
