"""The target contract (DESIGN.md §5): one explicit base class, template methods with defaults,
and capabilities as data on the registry entry.

A backend is one module under `targets/` with one `Target` subclass. It must implement `probe`,
`session`, and `compile` (or `compile_program`, where its capabilities say it compiles from the
torch.export program); every other hook has a default here. The pipeline, `check`, the precision
step and the rules read `Capabilities`, never a target's name. Public methods a subclass defines
must be hooks of this class: a misspelt hook is a TypeError when the module is imported, not a
default that silently runs instead.

Heavy runtimes are imported inside the hooks, never at module import.
"""

from __future__ import annotations

import difflib
import platform
import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np

from tapeout.core.artifact import Artifact
from tapeout.core.capabilities import Capabilities
from tapeout.core.decoding import CacheLayout
from tapeout.core.errors import BadInput, TapeoutError, TargetUnavailable, first_line, runtime_detail
from tapeout.core.schemas import InputSpec

# A folder of the artifact that holds what only its op profile loads (an instrumented build of the same program):
# hashed and verified with the artifact, not counted in its size, not deployed
PROFILING_DIR = "profiling"

if TYPE_CHECKING:
    from pydantic import BaseModel

    from tapeout.core.speech import SpeechLayout
    from tapeout.core.workload import Workload


@dataclass(frozen=True)
class Probe:
    available: bool
    version: str | None = None
    reason: str = ""
    install_hint: str = ""
    details: dict = field(default_factory=dict)

    def require(self, target: str) -> None:
        if not self.available:
            raise TargetUnavailable(
                f"target '{target}' is not available here: {self.reason}", fix=self.install_hint or None
            )


@dataclass(frozen=True)
class RuntimeLimits:
    max_ir_version: int
    max_opset: int


@dataclass(frozen=True)
class LintIssue:
    severity: Literal["error", "warning"]
    problem: str
    fix: str
    node: str | None = None

    def line(self) -> str:
        where = f"[{self.node}] " if self.node else ""
        return f"{self.severity}: {where}{self.problem} — {self.fix}"


@dataclass(frozen=True)
class OpTime:
    node: str
    op_type: str
    provider: str
    calls: int
    total_us: float
    # what the profiler says the op touched, where it says (ONNX Runtime does): the bottleneck view's input
    flops: int | None = None  # None: not countable from what the profiler records (prepacked weights)
    in_bytes: int | None = None
    out_bytes: int | None = None
    precision: str = ""
    in_shapes: tuple = ()
    out_shapes: tuple = ()


@dataclass(frozen=True)
class OpProfile:
    """Per-node times from an instrumented pass (never the pass budgets are judged on)."""

    runs: int
    run_total_us: float
    ops: list[OpTime]
    method: str = ""  # what the times are: kernel time, or host-side time with synchronous launches, ...
    median_run_us: float | None = None  # the pass's median run, where the profiler timed each run

    def by_op_type(self) -> list[dict]:
        totals: dict[tuple[str, str], list[float]] = {}
        for op in self.ops:
            entry = totals.setdefault((op.op_type, op.provider), [0, 0.0])
            entry[0] += op.calls
            entry[1] += op.total_us
        kernel_total = sum(v[1] for v in totals.values()) or 1.0
        rows = [
            {"op_type": k[0], "provider": k[1], "calls": v[0], "total_us": v[1], "share": v[1] / kernel_total}
            for k, v in totals.items()
        ]
        return sorted(rows, key=lambda r: -r["total_us"])

    def to_json(self, top: int = 30) -> dict:
        kernel_total = sum(op.total_us for op in self.ops)
        ops = sorted(self.ops, key=lambda o: -o.total_us)
        return {
            "runs": self.runs,
            "method": self.method,
            "mean_run_us": self.run_total_us / self.runs if self.runs else None,
            "median_run_us": self.median_run_us,
            "mean_kernel_us": kernel_total / self.runs if self.runs else None,
            "overhead_share": max(0.0, 1 - kernel_total / self.run_total_us) if self.run_total_us else None,
            "op_types": self.by_op_type(),
            "top_ops": [
                {
                    "node": o.node,
                    "op_type": o.op_type,
                    "provider": o.provider,
                    "calls": o.calls,
                    "mean_us": o.total_us / max(o.calls, 1),
                    "share": o.total_us / kernel_total if kernel_total else 0,
                }
                for o in ops[:top]
            ],
            # every op in execution order, with what it touched: the bottleneck view reads these
            "ops": [
                {
                    "node": o.node,
                    "op_type": o.op_type,
                    "calls": o.calls,
                    "total_us": o.total_us,
                    "flops": o.flops,
                    "in_bytes": o.in_bytes,
                    "out_bytes": o.out_bytes,
                    "precision": o.precision,
                    "in_shapes": [list(s) for s in o.in_shapes],
                    "out_shapes": [list(s) for s in o.out_shapes],
                }
                for o in self.ops
            ],
            "node_count": len(self.ops),
        }


@dataclass(frozen=True)
class EngineBuild:
    """What a device-compiled target did to have an engine for this device: built it (and why) or reused
    its cache; where the engine is; the key it is cached under; and what the engine is made of."""

    action: Literal["built", "reused"]
    reason: str  # why it was built, or which cached engine was reused
    file: str  # the engine, relative to the build dir
    key: dict  # device, compute capability, toolchain version, driver, model hash, settings
    seconds: float  # build time; 0 when reused
    layers: list[dict] = field(default_factory=list)  # per layer: name, type, precision, tactic, sparse, ...
    summary: dict = field(default_factory=dict)  # layers per precision, sparse layers, memory, ...

    def line(self) -> str:
        return (
            f"{self.action} engine {self.file} in {self.seconds:.1f} s: {self.reason}"
            if self.action == "built"
            else f"reused cached engine {self.file}: {self.reason}"
        )

    def to_json(self) -> dict:
        return {
            "action": self.action,
            "reason": self.reason,
            "file": self.file,
            "key": self.key,
            "seconds": self.seconds,
            "summary": self.summary,
            "layers": self.layers,
        }


def warm_up(call: Callable[[], object], min_iters: int, min_s: float, max_s: float) -> int:
    """Run until the median of the last 10 runs moves less than 2% from the 10 before, within the time cap."""
    times: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - start
        if elapsed >= max_s:
            return len(times)
        if len(times) >= max(min_iters, 20) and elapsed >= min_s:
            recent, before = statistics.median(times[-10:]), statistics.median(times[-20:-10])
            if abs(recent - before) <= 0.02 * before:
                return len(times)


def rejected_inputs(exc: Exception) -> BadInput:
    """A runtime's complaint about the inputs a call was given, as the user's one line (exit 2)."""
    return BadInput(
        f"the model rejected its inputs: {first_line(exc)}",
        detail=runtime_detail(exc),
        fix="make the project's [[inputs]] shapes and dtypes match the model (`tapeout lint`)",
    )


class Session(ABC):
    """One loaded artifact. `run` is the checked call; `bind` is what the latency loop times."""

    input_names: list[str]
    output_names: list[str]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once on host arrays and return host arrays; a runtime's complaint about the inputs is the
        user's to fix (shapes, dtypes), so it becomes one line with exit 2, never a traceback."""
        try:
            return self._run(feeds)
        except TapeoutError:
            raise
        except Exception as exc:  # runtimes raise their own types (pybind, OpenVINO's RuntimeError, ...)
            raise rejected_inputs(exc) from None

    @abstractmethod
    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def bind(self, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
        """The cheapest call that runs the model once on `feeds`, inputs and outputs kept where the runtime
        wants them (device memory on a GPU). Default: the unchecked host call."""
        return lambda: self._run(feeds)

    def bind_with_copies(self, feeds: dict[str, np.ndarray]) -> Callable[[], object] | None:
        """The same run including the host→device input and device→host output copies, or None when
        inputs already live in host memory (then `bind` is already end to end)."""
        return None

    def synchronize(self) -> None:
        """Wait for the device: what a timed run needs when `Capabilities.timing_sync` is "device"."""
        return None  # host runtimes return when the run is done

    def decoder(self, layout: CacheLayout) -> CachedDecoder:
        """Prefill and decode over the KV cache (`[workload] kind = "generate"`). Default: host arrays, each call's
        present handed to the next as its past without a copy on our side; a runtime that can keep the cache in
        its own buffers (ONNX Runtime's IOBinding) overrides this."""
        return CachedDecoder(self._run, layout)

    def speech_decoder(self, layout: SpeechLayout) -> SpeechDecoder:
        """A clip decoded over the self and cross caches (`[workload] kind = "transcribe"`). Default: host arrays
        through the unchecked call; a runtime that copies its inputs by default overrides this with one that does
        not (the cross cache is the same arrays every step)."""
        return SpeechDecoder(self._run, layout)

    def carrier(self, state: Mapping[str, str]) -> StateCarrier:
        """Chunks with their state carried (`[workload] kind = "stream"`). Default: host arrays through `run`'s
        checks; a runtime that can keep the state in device memory (ONNX Runtime's IOBinding) overrides this."""
        return StateCarrier(self.run, state)


class CachedDecoder:
    """One sequence batch decoded over the KV cache: `prefill(ids)` then `step(token)`, each returning the last
    position's logits [batch, vocab] on the host (what choosing the next token needs). `description`, where a
    runtime sets it, says how its loop runs (the report's notes carry it)."""

    description = "KV cache in host arrays, each call's present fed back as the next call's past"

    def __init__(self, run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], layout: CacheLayout):
        self._run, self.layout = run, layout
        self._past: dict[str, np.ndarray] = {}

    def prefill(self, ids: np.ndarray) -> np.ndarray:
        return self._call(ids, self.layout.empty_past(ids.shape[0]))

    def step(self, ids: np.ndarray) -> np.ndarray:
        return self._call(ids, self._past)

    def _call(self, ids: np.ndarray, past: dict[str, np.ndarray]) -> np.ndarray:
        from tapeout.core.decoding import LOGITS, feed_back

        out = self._run(self.layout.feeds(ids, past))
        self._past = feed_back(self.layout, out)
        return out[LOGITS][:, -1]


class SpeechDecoder:
    """One clip decoded over two caches: `start(cross)` feeds the start ids over an empty self cache, `step(token)`
    one token; each returns the last position's logits [vocab] on the host. The cross cache is fed unchanged every
    call; each call's present self cache is the next call's past, host arrays handed on without a copy on our side.
    `description` says how the runtime's loop runs (the report's notes carry it)."""

    description = "both caches in host arrays: the cross cache fed unchanged every step, each present fed back as past"

    def __init__(self, run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], layout: SpeechLayout):
        self._run, self.layout = run, layout
        self._cross: dict[str, np.ndarray] = {}
        self._past: dict[str, np.ndarray] = {}

    def start(self, cross: list[np.ndarray]) -> np.ndarray:
        layout = self.layout
        self._cross = dict(zip(layout.cross(), cross, strict=True))
        empty = np.zeros((1, layout.heads, 0, layout.head_dim), np.float32)
        self._past = dict.fromkeys(layout.past(), empty)
        return self._call(np.asarray([layout.start_ids], np.int64))

    def step(self, token: int) -> np.ndarray:
        return self._call(np.asarray([[token]], np.int64))

    def _call(self, ids: np.ndarray) -> np.ndarray:
        from tapeout.core.decoding import INPUT_IDS, LOGITS

        out = self._run({INPUT_IDS: ids, **self._past, **self._cross})
        self._past = {p: out[q] for p, q in zip(self.layout.past(), self.layout.present(), strict=True)}
        return out[LOGITS][0, -1]


class StaticCachedDecoder(CachedDecoder):
    """A cache of fixed size for a cache graph pinned to one decode step (seq 1, past = max_context - 1 slots): each
    call feeds the whole buffer with the mask marking the slots filled so far and the new token, and writes the
    token's key and value into its slot, in place (the rest of the graph's present output is not read). A prompt
    goes through `prefill`, a second graph of the same cache pinned to `chunk` tokens (the AR-N graphs of Qualcomm's
    Genie), where the runtime has one: the first `length mod chunk` tokens one per call, then whole chunks, so the
    last chunk ends on the prompt's last token and no token is padding. Without it, one token per call."""

    def __init__(
        self,
        run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
        layout: CacheLayout,
        prefill: tuple[Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], int] | None = None,
    ):
        super().__init__(run, layout)
        self._prefill_run, self._chunk = prefill if prefill is not None else (None, 0)
        self._cache: dict[str, np.ndarray] = {}
        self._mask = np.zeros((0, 0), np.int64)
        self._length = 0
        self.description = (
            f"static cache of {layout.max_context - 1} slots plus the new token, each token's key and "
            "value written into its slot; "
            + (
                f"prompts through a second graph of {self._chunk} tokens, their first length mod "
                f"{self._chunk} tokens one per call"
                if self._chunk
                else "prompts fed one token per call (no prefill graph)"
            )
        )

    def prefill(self, ids: np.ndarray) -> np.ndarray:
        layout, batch = self.layout, ids.shape[0]
        self._cache = {
            name: np.zeros((batch, layout.kv_heads, layout.max_context - 1, layout.head_dim), layout.dtype)
            for name in layout.past()
        }
        self._mask = np.zeros((batch, layout.max_context), np.int64)
        self._mask[:, -1] = 1  # the new token's own slot, after the cache
        self._length = 0
        head = ids.shape[1] % self._chunk if self._chunk else ids.shape[1]
        for t in range(head):
            logits = self.step(ids[:, t : t + 1])
        for start in range(head, ids.shape[1], self._chunk or 1):  # (none where head is the whole prompt)
            logits = self._call(self._prefill_run, ids[:, start : start + self._chunk])
        return logits

    def step(self, ids: np.ndarray) -> np.ndarray:
        return self._call(self._run, ids)

    def _call(self, run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], ids: np.ndarray) -> np.ndarray:
        """`ids` [batch, n] after the cache's filled slots: the mask is the filled slots then n ones (causal among
        the new tokens: the graph's own), their keys and values written into the next n slots."""
        from tapeout.core.decoding import ATTENTION_MASK, INPUT_IDS, LOGITS, POSITION_IDS

        n, new, layout = self._length, ids.shape[1], self.layout
        if n + new > layout.max_context:
            raise BadInput(
                f"the static cache holds {layout.max_context} tokens and a call asked for {n + new}",
                fix="raise [workload] max_context and build again",
            )
        mask = (
            self._mask
            if new == 1
            else np.concatenate([self._mask[:, :-1], np.ones((ids.shape[0], new), np.int64)], axis=1)
        )
        positions = layout.positions(ids.shape[0], n, new)[POSITION_IDS]
        out = run(
            {
                INPUT_IDS: np.ascontiguousarray(ids, dtype=np.int64),
                ATTENTION_MASK: mask,
                POSITION_IDS: positions,
                **self._cache,
            }
        )
        kept = min(n + new, layout.max_context - 1) - n  # the last slot's key and value are never read
        if kept > 0:
            for past, present in zip(layout.past(), layout.present(), strict=True):
                self._cache[past][:, :, n : n + kept] = out[present][:, :, layout.max_context - 1 :][:, :, :kept]
            self._mask[:, n : n + kept] = 1
        self._length = n + new
        return out[LOGITS][:, -1]


class StateCarrier:
    """A stream's chunks run with their state carried from one call to the next (`state`: state input → the output
    that feeds it): `start(initial)`, then `chunk(feeds)` per chunk, the feeds without the state, returning the
    chunk's outputs on the host (`with_state`: the state outputs too, which the golden stream compares). Default:
    host arrays, each state output handed back as the next call's input without a copy on our side; a runtime that
    keeps the state in device memory overrides `Session.carrier`. `description`, where set, reaches the notes."""

    description = ""

    def __init__(self, run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], state: Mapping[str, str]):
        self._run, self.state = run, dict(state)
        self._carried: dict[str, np.ndarray] = {}

    def start(self, initial: dict[str, np.ndarray]) -> None:
        self._carried = dict(initial)

    def chunk(self, feeds: dict[str, np.ndarray], with_state: bool = True) -> dict[str, np.ndarray]:
        out = self._run({**feeds, **self._carried})
        self._carried = {name: out[output] for name, output in self.state.items()}
        return out


class Target(ABC):
    """One backend. Subclasses set `Options` (a frozen pydantic model of the profile's [options]) and
    implement `probe`, `session` and the compile hook their capabilities name; the other hooks have defaults."""

    Options: ClassVar[type[BaseModel]]

    def __init__(self, name: str, capabilities: Capabilities, options: BaseModel):
        self.name = name
        self.capabilities = capabilities
        self.options = options

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for attr, value in vars(cls).items():
            if attr.startswith("_") or attr == "Options" or attr.isupper():
                continue  # helpers, the options model, constants
            is_method = callable(value) or isinstance(value, (classmethod, staticmethod, property))
            if is_method and attr not in HOOKS:
                near = difflib.get_close_matches(attr, HOOKS, n=1)
                raise TypeError(
                    f"{cls.__module__}.{cls.__name__}.{attr} is not a hook of the target contract"
                    + (f" (did you mean '{near[0]}'?)" if near else "")
                    + f"; hooks: {', '.join(sorted(HOOKS))}; helpers must start with '_'"
                )

    # ---------------------------------------------------------------- must implement

    @classmethod
    @abstractmethod
    def probe(cls) -> Probe:
        """Available here, or the reason and the install hint. Never raises."""

    def compile(self, model_path: Path, out_dir: Path, inputs: list[InputSpec], dims: dict[str, int]) -> Artifact:
        """The artifact compiled from the ONNX model at `model_path`, written into `out_dir` (on the host;
        device-compiled targets write all but the engine). Every target that compiles from ONNX
        (`capabilities.compiles_from`, the default) implements it."""
        raise NotImplementedError(f"target '{self.name}' compiles from a torch.export program, not from ONNX")

    def compile_program(
        self, program, out_dir: Path, inputs: list[InputSpec], dims: dict[str, int], output_names: list[str]
    ) -> Artifact:
        """The artifact compiled from the torch.export ExportedProgram: what a target whose
        `capabilities.compiles_from` is "torch.export" implements instead of `compile`. `output_names` name the
        program's outputs in order, as the golden outputs and the ONNX export name them."""
        raise NotImplementedError(f"target '{self.name}' compiles from ONNX, not from a torch.export program")

    @abstractmethod
    def session(self, artifact: Artifact) -> Session:
        """A loaded artifact, ready to run."""

    # ---------------------------------------------------------------- defaults

    def limits(self) -> RuntimeLimits:
        """Newest IR version and opset the export may use. Default: ONNX Runtime's, because every export
        is verified on ONNX Runtime before it is compiled."""
        from tapeout.targets.onnx_lint import ort_limits

        return ort_limits()

    def preflight(self) -> None:
        """Before any work: raise TargetUnavailable if the profile's device is missing here."""
        return None  # most targets have nothing to check beyond probe()

    def workload_problem(self, workload: Workload) -> str | None:
        """Why this target, with its options, cannot run a workload its capabilities list (a core/workload.Workload:
        e.g. a captured graph that replays one shape, for a loop whose calls carry a cache that grows), or None.
        Asked before any work."""
        return None

    def static_decode(self) -> bool:
        """Whether this target, with its options, decodes through graphs of static shapes (OpenVINO's NPU pipeline pads
        each prompt; the QNN HTP's graph holds a cache of fixed size): then a generate workload's cache graph takes
        attention_mask and position_ids (core/decoding.py), which mask what is not a real token. Default: no,
        positions follow from the cache's length."""
        return False

    def scorer(self) -> Target | None:
        """Where the sensitivity loop scores a generate workload's candidates when this target's runtime runs no single
        call of the cache graph (OpenVINO's NPU pipeline runs only its own loop): another target on this host that
        runs the same artifact with dynamic shapes. The built artifact's metric still goes through this target's own
        loop. Default: none needed."""
        return None

    def lint(self, model_path: Path, inputs: list[InputSpec], dims: dict[str, int]) -> list[LintIssue]:
        """Problems this target would hit, naming nodes. Default: the ONNX checks every target needs."""
        from tapeout.targets import onnx_lint

        return onnx_lint.check(model_path, inputs, dims, self.limits())

    def prepare(self, model_path: Path, inputs: list[InputSpec], dims: dict[str, int]) -> Path:
        """Rewrite the FP32 model before quantization and compile (e.g. pin shapes). Default: unchanged."""
        return model_path

    def build_engine(self, artifact: Artifact, progress: Callable[[str], None]) -> EngineBuild | None:
        """Device-compiled targets (`capabilities.compile_on == "device"`): make sure an engine for this device
        and toolchain exists beside the artifact, building it once (progress through `progress`) or reusing
        the cached one. `build` calls it where the device is here, `check` always. Default: nothing to do."""
        return None

    def instrument(self, program, artifact: Artifact) -> Artifact:
        """For a target that compiles from torch.export and whose op profiler needs code of its own (a RecordFunction
        compiled around each kernel): that build, written into `artifact.directory / PROFILING_DIR`, for the
        artifact kept only (the compile step calls it once). Default: nothing to add."""
        return artifact

    def op_profile(
        self, artifact: Artifact, feeds: dict[str, np.ndarray], iterations: int, pace_s: float | None = None
    ) -> OpProfile:
        """Per-node times from a separate, instrumented pass; only called when `capabilities.op_profiler`. `pace_s`:
        the p50 of the same model's uninstrumented runs where the caller timed them first, for a profiler that
        reads running counters (OpenVINO's) to leave its warm-up and disturbed runs out; the others need not."""
        raise NotImplementedError(f"target '{self.name}' declares no op profiler")

    def emulated(self) -> str | None:
        """Why this host's timings are not the device's, or None."""
        return self.capabilities.emulated_on.get(platform.machine().lower())


HOOKS = frozenset(
    {
        "probe",
        "compile",
        "compile_program",
        "session",
        "limits",
        "preflight",
        "lint",
        "prepare",
        "build_engine",
        "instrument",
        "op_profile",
        "emulated",
        "workload_problem",
        "static_decode",
        "scorer",
    }
)

__all__ = [
    "HOOKS",
    "PROFILING_DIR",
    "CachedDecoder",
    "Capabilities",
    "EngineBuild",
    "LintIssue",
    "OpProfile",
    "OpTime",
    "Probe",
    "RuntimeLimits",
    "Session",
    "StateCarrier",
    "StaticCachedDecoder",
    "Target",
    "TargetUnavailable",
    "warm_up",
]
