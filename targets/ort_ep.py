"""What every ONNX Runtime execution provider target shares: session options, session creation that
refuses a silent fallback to the CPU, input-error wrapping, IOBinding for device memory, and the
ORT profiler pass. The CPU EP, QNN and CUDA (and later MIGraphX and TensorRT EPs) build on it.
"""

from __future__ import annotations

import functools
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tapeout.core.artifact import Artifact
from tapeout.core.decoding import INPUT_IDS, LOGITS, PAST_LENGTH, CacheLayout
from tapeout.core.errors import BadInput, TapeoutError, TargetUnavailable, first_line, runtime_detail
from tapeout.targets.base import (
    CachedDecoder,
    OpProfile,
    Probe,
    Session,
    StateCarrier,
    StaticCachedDecoder,
    Target,
    rejected_inputs,
)
from tapeout.targets.native_output import native_output_captured

_LEVELS = ("disable", "basic", "extended", "all")


class OrtOptions(BaseModel):
    """Session options every ORT target takes (the CPU-side thread pools serve nodes left on the CPU EP)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # bounded: ORT takes them as C ints (a fuzzed 4.6e18 reached the runtime as an overflow)
    threads: int = Field(0, ge=0, le=4096, description="intra-op threads; 0 = one per physical core")
    inter_op_threads: int = Field(1, ge=1, le=4096)
    graph_optimization: Literal["disable", "basic", "extended", "all"] = "all"
    execution_mode: Literal["sequential", "parallel"] = "sequential"
    allow_spinning: bool = True
    memory_arena: bool = True


_LOG_PREFIX = re.compile(r"^.*?\[[EW]:onnxruntime:[^\]]*\]\s*")


def ort_complaint(said: list[str]) -> str:
    """ORT's error and warning lines in the native output, as sentences: no colour codes, timestamps,
    source locations, error-code prefixes or directories (a missing library is named by its file)."""
    found = []
    for line in said:
        text = re.sub(r"\x1b\[[0-9;]*m", "", line)
        if not _LOG_PREFIX.match(text):
            continue
        text = _LOG_PREFIX.sub("", text).rsplit("[ONNXRuntimeError] : ", 1)[-1]
        text = re.sub(r"^\d+ : [A-Z_]+ : ", "", text)
        text = re.sub(r"(?<=\s)/\S*/", "", text).strip()
        if text:
            found.append(text[:240])
    return " | ".join(found)


class OrtSession(Session):
    """An ORT InferenceSession. With `device` ("cuda", id) inputs and outputs are bound in device
    memory (IOBinding): timed runs neither copy nor allocate, and CUDA graphs can replay them.
    `fixed_shapes`: the session replays a captured graph, so its buffers' shapes may never change."""

    def __init__(self, sess, device: tuple[str, int] | None = None, fixed_shapes: bool = False):
        self._sess = sess
        self._device = device
        self._fixed_shapes = fixed_shapes
        # a static-shape cache graph's prompt graph, loaded when a decoder is first asked for (a process timing
        # single calls never loads it): () -> (its checked run, the tokens it takes). The QNN HTP's
        self.prefill_loader: Callable[[], tuple[Callable, int]] | None = None
        self._prefill: tuple[Callable, int] | None = None
        self._binding = None
        self._inputs: dict = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._kept: object = None  # what a bound call's buffers are made from, alive as long as the call
        # a graph whose cache is one buffer appended in place (quantize/passes/share_kv_buffer.py): its positions.
        # Every caller still sees the cache graph's interface; past_length is fed here, never by a caller
        self._buffer = _buffer_length(sess.get_inputs())
        self.input_names = [i.name for i in sess.get_inputs() if i.name != PAST_LENGTH]
        self.output_names = [o.name for o in sess.get_outputs()]

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._buffer is not None:
            shared, total = self._in_buffer(feeds)
            out = dict(zip(self.output_names, self._sess.run(self.output_names, shared), strict=True))
            return {name: value[:, :, :total] if name.startswith("present_") else value for name, value in out.items()}
        if self._device is None:
            return dict(zip(self.output_names, self._sess.run(self.output_names, feeds), strict=True))
        self._bind(feeds)
        return self._bound_run()

    def _in_buffer(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        """A call of the cache graph's interface (each past P positions long) as the shared-buffer graph takes it:
        each past copied into the head of a buffer of the graph's length, P as past_length; and P + the new tokens."""
        past = [name for name in self.input_names if name.startswith("past_")]
        held, new = np.shape(feeds[past[0]])[2], np.shape(feeds[INPUT_IDS])[1]
        if held + new > self._buffer:
            raise _past_the_cache(self._buffer, held + new)
        shared = dict(feeds)
        for name in past:
            value = np.asarray(feeds[name])
            shared[name] = np.zeros((*value.shape[:2], self._buffer, *value.shape[3:]), value.dtype)
            shared[name][:, :, :held] = value
        shared[PAST_LENGTH] = np.array(held, np.int64)
        return shared, held + new

    def bind(self, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
        if self._buffer is not None:
            shared, _ = self._in_buffer(feeds)
            if self._device is not None:
                return functools.partial(self._sess.run, self.output_names, shared)
            # as the decoder runs it: each past bound as its own present, so the kernel appends in place (every
            # timed call writes the same positions: the call is the same each time)
            import onnxruntime as ort

            binding = self._sess.io_binding()
            values = {}
            for name, value in shared.items():
                if name.startswith("past_") and name != PAST_LENGTH:
                    values[name] = ort.OrtValue.ortvalue_from_numpy(value)
                    binding.bind_ortvalue_input(name, values[name])
                    binding.bind_ortvalue_output(_present(name), values[name])
                else:
                    binding.bind_cpu_input(name, np.ascontiguousarray(value))
            for name in self.output_names:
                if not name.startswith("present_"):
                    binding.bind_output(name, "cpu")
            self._kept = (shared, values)
            return functools.partial(self._sess.run_with_iobinding, binding)
        if self._device is None:  # partial, not a lambda: no Python frame inside the timed call
            return functools.partial(self._sess.run, self.output_names, feeds)
        self._bind(feeds)
        return functools.partial(self._sess.run_with_iobinding, self._binding)

    def bind_with_copies(self, feeds: dict[str, np.ndarray]) -> Callable[[], object] | None:
        if self._device is None:
            return None
        self._bind(feeds)

        def call():
            self._put(feeds)
            return self._bound_run()

        return call

    def synchronize(self) -> None:
        if self._binding is not None:
            self._binding.synchronize_outputs()

    def decoder(self, layout: CacheLayout) -> CachedDecoder:
        if self._buffer is not None:
            return SharedBufferDecoder(self._sess, layout, self._buffer)
        if layout.masked:  # a graph pinned to one decode step (the QNN HTP's): the cache is a fixed buffer
            if self._prefill is None and self.prefill_loader is not None:
                self._prefill = self.prefill_loader()
            return StaticCachedDecoder(self.run, layout, self._prefill)
        if self._device is None:  # host memory: each present handed back as the next past, as a stream's state is.
            # ONNX Runtime's buffers gain nothing there and cost a call more: binding 18 tensors and wrapping 9
            # outputs took tiny-lm's prefill of 16 from 698 to 746 µs and its decode step from 439 to 455 (one thread)
            return super().decoder(layout)
        return OrtCachedDecoder(self._sess, layout, self._device)

    def carrier(self, state: Mapping[str, str]) -> StateCarrier:
        if self._device is None:  # host memory: the state arrays are handed back as they are
            return super().carrier(state)
        return OrtStateCarrier(self, state, self._device)

    def _put(self, feeds: dict[str, np.ndarray]) -> None:
        for name, value in self._inputs.items():
            value.update_inplace(np.ascontiguousarray(feeds[name]))  # same device address: CUDA graphs stay valid

    def _bound_run(self) -> dict[str, np.ndarray]:
        self._sess.run_with_iobinding(self._binding)
        return dict(zip(self.output_names, self._binding.copy_outputs_to_cpu(), strict=True))

    def _bind(self, feeds: dict[str, np.ndarray]) -> None:
        """The feeds in device buffers: copied into the bound ones when the shapes are unchanged, else new
        buffers, inputs copied once and outputs at fixed addresses (learned from one run in which ORT
        allocates them; ORT's CUDA EP captures a graph only after regular runs)."""
        import onnxruntime as ort

        shapes = {name: tuple(np.shape(feeds[name])) for name in self.input_names}
        if self._binding is not None and shapes == self._shapes:
            self._put(feeds)
            return
        if self._binding is not None and self._fixed_shapes:
            raise BadInput(
                f"input shapes changed from {self._shapes} to {shapes}, but a captured CUDA graph replays one "
                "shape only",
                fix="pin the dims in the project's [dims], or set [options] cuda_graph = false",
            )
        kind, index = self._device
        binding = self._sess.io_binding()
        self._inputs = {
            name: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(feeds[name]), kind, index)
            for name in self.input_names
        }
        for name, value in self._inputs.items():
            binding.bind_ortvalue_input(name, value)
        for name in self.output_names:
            binding.bind_output(name, kind, index)
        # This run only learns the output shapes, into buffers ORT allocates and later frees. ORT 1.31's CUDA EP
        # captured its graph in this very run (on an H100: every replay wrote there, outputs off by up to 87),
        # so it runs with graph id -1: no capture, no replay.
        learn = ort.RunOptions()
        learn.add_run_config_entry("gpu_graph_id", "-1")
        self._sess.run_with_iobinding(binding, learn)
        learned = binding.get_outputs()
        binding.clear_binding_outputs()
        for name, value in zip(self.output_names, learned, strict=True):
            fixed = ort.OrtValue.ortvalue_from_shape_and_type(value.shape(), value.element_type(), kind, index)
            binding.bind_ortvalue_output(name, fixed)
        self._binding, self._shapes = binding, shapes


def _buffer_length(inputs) -> int | None:
    """The positions of a shared-buffer cache graph's buffer (its past inputs' length), or None for any other."""
    if not any(i.name == PAST_LENGTH for i in inputs):
        return None
    past = next(i for i in inputs if i.name.startswith("past_") and i.name != PAST_LENGTH)
    return int(past.shape[2])


def _present(past: str) -> str:
    return "present_" + past.removeprefix("past_")


def _past_the_cache(holds: int, asked: int) -> BadInput:
    return BadInput(
        f"the KV cache holds {holds} positions and a call asked for {asked}",
        fix="raise [workload] max_context and build again",
    )


class SharedBufferDecoder(CachedDecoder):
    """The KV cache as one buffer per layer that ONNX Runtime's GroupQueryAttention appends to in place: each past
    bound as its own present (IOBinding), so a step writes the new token's key and value and copies nothing else;
    only the token ids and past_length go in and the logits come out. The buffers are made at the first prompt and
    reused by every later one (the kernel reads only the positions past_length says are filled)."""

    def __init__(self, sess, layout: CacheLayout, length: int):
        super().__init__(lambda feeds: {}, layout)
        self._sess, self._length = sess, length
        self._binding = None
        self._buffers: list[np.ndarray] = []
        self._values: list = []
        self._held = 0
        self.description = (
            f"KV cache in one buffer of {length} positions per layer, appended in place by ONNX Runtime's "
            "GroupQueryAttention (past and present bound to the same memory)"
        )

    def prefill(self, ids: np.ndarray) -> np.ndarray:
        layout, batch = self.layout, ids.shape[0]
        if not self._buffers or self._buffers[0].shape[0] != batch:
            import onnxruntime as ort

            shape = (batch, layout.kv_heads, self._length, layout.head_dim)
            self._buffers = [np.zeros(shape, layout.dtype) for _ in layout.past()]
            self._values = [ort.OrtValue.ortvalue_from_numpy(buffer) for buffer in self._buffers]
            self._binding = self._sess.io_binding()
            self._binding.bind_output(LOGITS, "cpu")  # first: get_outputs()[0] is the logits
            for past, present, value in zip(layout.past(), layout.present(), self._values, strict=True):
                self._binding.bind_ortvalue_input(past, value)
                self._binding.bind_ortvalue_output(present, value)
        self._held = 0
        return self._decode(ids)

    def step(self, ids: np.ndarray) -> np.ndarray:
        return self._decode(ids)

    def _decode(self, ids: np.ndarray) -> np.ndarray:
        held, new = self._held, ids.shape[1]
        if held + new > self._length:
            raise _past_the_cache(self._length, held + new)
        self._binding.bind_cpu_input(INPUT_IDS, np.ascontiguousarray(ids, dtype=np.int64))
        self._binding.bind_cpu_input(PAST_LENGTH, np.array(held, np.int64))
        self._binding.bind_output(LOGITS, "cpu")  # a fresh array each call: the caller may keep the last one
        self._sess.run_with_iobinding(self._binding)
        self._held = held + new
        return self._binding.get_outputs()[0].numpy()[:, -1]


class OrtCachedDecoder(CachedDecoder):
    """The KV cache kept in ONNX Runtime's own buffers (IOBinding), for a session on a device (`ort-cuda`): each
    call's present OrtValues are bound as the next call's past, never copied to the host and back. Only the token
    ids go in (ORT copies them to the device) and the last position's logits come out, bound in host memory so that
    ORT copies them alone. (The graph's Concat still writes past + new into a fresh buffer per step: a cache updated in
    place needs a fused attention op with a shared buffer; and the growing cache changes shapes every step, so no
    CUDA graph can replay a step.)"""

    def __init__(self, sess, layout: CacheLayout, device: tuple[str, int]):
        import onnxruntime as ort

        super().__init__(lambda feeds: {}, layout)
        self._sess, self._device, self._ort = sess, device, ort
        self._binding = sess.io_binding()
        self._present: list = []
        self.description = "KV cache in ONNX Runtime's buffers (IOBinding)" + (
            f" resident in {device[0].upper()} memory, the logits alone copied to the host"
            if device[0] != "cpu"
            else ""
        )

    def prefill(self, ids: np.ndarray) -> np.ndarray:
        kind, index = self._device
        empty = self.layout.empty_past(ids.shape[0])
        return self._call(
            ids, [self._ort.OrtValue.ortvalue_from_numpy(empty[n], kind, index) for n in self.layout.past()]
        )

    def step(self, ids: np.ndarray) -> np.ndarray:
        return self._call(ids, self._present)

    def _call(self, ids: np.ndarray, past: list) -> np.ndarray:
        kind, index = self._device
        binding = self._binding
        binding.bind_cpu_input(INPUT_IDS, np.ascontiguousarray(ids, dtype=np.int64))
        for name, value in zip(self.layout.past(), past, strict=True):
            binding.bind_ortvalue_input(name, value)
        binding.bind_output(LOGITS, "cpu")
        for name in self.layout.present():  # fresh outputs each call: the previous present is this call's past
            binding.bind_output(name, kind, index)
        self._sess.run_with_iobinding(binding)
        logits, *self._present = binding.get_outputs()
        return logits.numpy()[:, -1]


class OrtStateCarrier(StateCarrier):
    """A stream's state kept in device memory (IOBinding): in a timed stream each chunk's state outputs are bound as
    the next chunk's state inputs, never copied to the host; the chunk's other inputs go in from host arrays and its
    other outputs come back bound in host memory, so ORT copies only those. (The untimed golden pass brings the
    state to the host too, where it is compared with the reference's.)"""

    def __init__(self, session: OrtSession, state: Mapping[str, str], device: tuple[str, int]):
        import onnxruntime as ort

        super().__init__(session.run, state)
        self._sess, self._device, self._ort = session._sess, device, ort
        self._outputs = session.output_names
        self._binding = self._sess.io_binding()
        self.description = (
            f"carried state resident in {device[0].upper()} memory (IOBinding), the other outputs copied to the host"
        )

    def start(self, initial: dict[str, np.ndarray]) -> None:
        kind, index = self._device
        self._carried = {
            name: self._ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(initial[name]), kind, index)
            for name in self.state
        }

    def chunk(self, feeds: dict[str, np.ndarray], with_state: bool = True) -> dict[str, np.ndarray]:
        kind, index = self._device
        binding, carried_out = self._binding, set(self.state.values())
        for name, value in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name, value in self._carried.items():
            binding.bind_ortvalue_input(name, value)
        for name in self._outputs:  # fresh state buffers each chunk: this chunk's input is the last one's output
            if name in carried_out and not with_state:
                binding.bind_output(name, kind, index)
            else:
                binding.bind_output(name, "cpu")
        try:
            self._sess.run_with_iobinding(binding)
        except Exception as exc:  # as Session.run says it: the carrier's chunks are the stream's checked calls
            raise rejected_inputs(exc) from None
        produced = dict(zip(self._outputs, binding.get_outputs(), strict=True))
        if with_state:  # the untimed golden pass: the state came to the host to be compared; it goes back as it was
            self._carried = {
                name: self._ort.OrtValue.ortvalue_from_numpy(produced[output].numpy(), kind, index)
                for name, output in self.state.items()
            }
        else:
            self._carried = {name: produced[output] for name, output in self.state.items()}
        return {name: value.numpy() for name, value in produced.items() if with_state or name not in carried_out}


class OrtTarget(Target):
    """An ONNX Runtime execution provider. Subclasses name their EP and may override the private hooks
    `_providers`, `_new_session`, `_configure` and `_io_device`."""

    EP: ClassVar[str] = "CPUExecutionProvider"
    INSTALL: ClassVar[str] = "pip install onnxruntime"

    @classmethod
    def probe(cls) -> Probe:
        """The EP is built into the installed onnxruntime. Subclasses add what "usable" needs beyond that."""
        try:
            import onnxruntime as ort
        except ImportError as exc:
            return Probe(False, reason=f"onnxruntime cannot be imported ({exc})", install_hint=cls.INSTALL)
        providers = ort.get_available_providers()
        if cls.EP not in providers:
            return Probe(
                False,
                ort.__version__,
                install_hint=cls.INSTALL,
                reason=f"this onnxruntime {ort.__version__} has no {cls.EP} (it offers {', '.join(providers)})",
            )
        return Probe(True, ort.__version__, details={"providers": providers})

    def _providers(self) -> list:
        return [self.EP]

    def _io_device(self) -> tuple[str, int] | None:
        """Where inputs and outputs live for timed runs; None: host memory."""
        return None

    def _replays_graph(self) -> bool:
        """A captured graph (CUDA graphs) replays fixed buffers: no shape may change after the first run."""
        return False

    def _configure(self, so, **extra) -> None:
        """Provider-specific session config entries (`extra`: per-call settings of a subclass)."""

    def _session_options(self, level: str | None = None, **extra):
        import onnxruntime as ort
        import psutil

        opts = self.options
        so = ort.SessionOptions()
        so.intra_op_num_threads = opts.threads or psutil.cpu_count(logical=False) or 1
        so.inter_op_num_threads = opts.inter_op_threads
        so.execution_mode = (
            ort.ExecutionMode.ORT_PARALLEL if opts.execution_mode == "parallel" else ort.ExecutionMode.ORT_SEQUENTIAL
        )
        so.enable_cpu_mem_arena = opts.memory_arena
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if opts.allow_spinning else "0")
        so.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[level or opts.graph_optimization]
        so.log_severity_level = 3  # errors only: ORT's warnings about unused initializers are noise here
        self._configure(so, **extra)
        return so

    def _new_session(self, model: str | bytes, so):
        import onnxruntime as ort

        return ort.InferenceSession(model, so, providers=self._providers())

    def _load(self, model: Path | bytes, so, what: str):
        """Create the session; its errors are the model's (exit 2), and an EP that did not load is the
        host's (exit 4): ORT would otherwise run everything on the CPU EP and say nothing."""
        try:
            with native_output_captured() as said:
                sess = self._new_session(model if isinstance(model, bytes) else str(model), so)
        except TapeoutError:  # a subclass's own, clearer message
            raise
        except Exception as exc:  # ORT raises its own pybind types (Fail, InvalidGraph, NoSuchFile, ...)
            raise BadInput(
                f"onnxruntime ({self.EP}) could not load {what}: {first_line(exc)}",
                detail=runtime_detail(exc),
                fix="check the model with `tapeout lint --profile`, or export it again",
            ) from None
        if self.EP not in sess.get_providers():
            raise TargetUnavailable(
                f"{self.EP} did not load; onnxruntime would run on {', '.join(sess.get_providers())} "
                f"instead: {ort_complaint(said) or 'no reason given'}",
                fix=self.INSTALL,
            )
        return sess

    def session(self, artifact: Artifact) -> OrtSession:
        return OrtSession(
            self._load(artifact.path, self._session_options(), f"artifact {artifact.path}"),
            device=self._io_device(),
            fixed_shapes=self._replays_graph(),
        )

    def _profiling_session(self, artifact: Artifact, folder: Path) -> OrtSession:
        so = self._session_options()
        so.enable_profiling = True
        so.profile_file_prefix = str(folder / "ort_profile")
        return OrtSession(self._load(artifact.path, so, f"artifact {artifact.path}"), device=self._io_device())

    def op_profile(
        self, artifact: Artifact, feeds: dict[str, np.ndarray], iterations: int, pace_s: float | None = None
    ) -> OpProfile:
        """A separate, instrumented pass: ORT's profiler slows runs down, so budgets never use it."""
        from tapeout.targets import ort_profile

        with tempfile.TemporaryDirectory(prefix="tapeout-prof-") as tmp:
            sess = self._profiling_session(artifact, Path(tmp))
            call = sess.bind(feeds)
            for _ in range(3 + iterations):  # the trace keeps the last `iterations` runs: the rest is warm-up
                call()
            sess.synchronize()
            trace = sess._sess.end_profiling()
            return ort_profile.parse(
                Path(trace), keep_last=iterations, method=self.capabilities.op_profiler or "ONNX Runtime profiler"
            )
