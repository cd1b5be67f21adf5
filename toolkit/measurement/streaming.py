"""A `stream` workload measured: chunk after chunk with the state carried, in fresh processes.

`carry` is the loop itself, the same on the host (the FP32 reference over the golden stream) and in the inference
process (`loop`): each chunk is fed with the state the previous chunk's outputs carry, the first with the initial
state. In the inference process the golden stream runs once untimed (its outputs are what drift is judged on), then
`trials` timed times; a chunk's time is one call of the runtime, profiler off.

On the host (`summarize`): per-chunk latency p50/p90/p99 with order-statistic bounds over all processes, the real-time
factor of every timed stream (compute time over chunks × deadline_ms), deadline misses, cold start, memory, and the
streamed outputs against the reference chunk by chunk, so that state drift across the stream shows.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tapeout.core.errors import BadInput
from tapeout.core.schemas import Project, StreamWorkload
from tapeout.measurement import stats
from tapeout.targets.base import StateCarrier

DRIFT_BINS = 8

Feeds = dict[str, np.ndarray]


@dataclass
class StreamData:
    """workload.npz of a stream build: the golden stream per streamed input [chunks, *shape], the constant inputs,
    the initial state, and the reference's outputs over the stream [chunks, *shape]."""

    chunks: dict[str, np.ndarray]
    constants: Feeds
    initial: Feeds
    reference: dict[str, np.ndarray]

    @property
    def length(self) -> int:
        return len(next(iter(self.chunks.values())))

    def save(self, path: Path) -> None:
        arrays = {
            f"{group}.{name}": value
            for group, named in (
                ("chunk", self.chunks),
                ("constant", self.constants),
                ("initial", self.initial),
                ("reference", self.reference),
            )
            for name, value in named.items()
        }
        with open(path, "wb") as fh:
            np.savez(fh, **arrays)

    def check_fits(self, workload: StreamWorkload, path: Path) -> None:
        """What `check` replays matches the workload the build recorded: as many chunks, an initial value for each
        state input, a reference for each state output (a re-hashed file of another workload is one line)."""
        problems = []
        if self.length != workload.chunks:
            problems.append(f"{self.length} chunks, the workload's {workload.chunks}")
        if set(self.initial) != set(workload.state):
            problems.append(f"initial state for {sorted(self.initial)}, the workload's {sorted(workload.state)}")
        missing = sorted(set(workload.state.values()) - set(self.reference))
        if missing:
            problems.append(f"no reference for the state output(s) {missing}")
        if problems:
            raise BadInput(
                f"{path}: {'; '.join(problems)}",
                fix="copy the build dir to the device as built, or rebuild with `tapeout build`",
            )

    @classmethod
    def load(cls, path: Path) -> StreamData:
        fix = "copy the build dir to the device as built, or rebuild with `tapeout build`"
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
        except (OSError, ValueError) as exc:
            raise BadInput(f"{path} is not a readable workload file ({exc})", fix=fix) from None
        groups: dict[str, dict[str, np.ndarray]] = {g: {} for g in ("chunk", "constant", "initial", "reference")}
        for key, value in arrays.items():
            group, _, name = key.partition(".")
            if group not in groups or not name:
                raise BadInput(f"{path} has an entry {key!r} a stream workload does not write", fix=fix)
            groups[group][name] = value
        lengths = {len(v) for v in (*groups["chunk"].values(), *groups["reference"].values()) if v.ndim}
        if not groups["chunk"] or not groups["initial"] or not groups["reference"] or len(lengths) != 1:
            raise BadInput(
                f"{path} lacks the chunks, initial state or reference outputs a stream workload replays "
                "(or their lengths differ)",
                fix=fix,
            )
        for key, value in arrays.items():  # a re-hashed file's values: numbers, and finite ones
            if value.dtype.kind not in "biuf" or (value.dtype.kind == "f" and not np.isfinite(value).all()):
                raise BadInput(
                    f"{path}: {key} holds {'NaN or infinity' if value.dtype.kind == 'f' else value.dtype}, where a "
                    "stream workload writes finite numbers",
                    fix=fix,
                )
        return cls(groups["chunk"], groups["constant"], groups["initial"], groups["reference"])


def carry(
    carrier: StateCarrier, data: StreamData, timed: np.ndarray | None = None, with_state: bool = True
) -> Iterator[Feeds]:
    """Every chunk's outputs, each chunk fed the state its predecessor's outputs carry (the carrier keeps it, on the
    host or in device memory). With `timed`, each call's time in ns is written to it (the feeds are made outside the
    timed region); without `with_state`, a carrier that keeps the state on a device leaves it there."""
    carrier.start(data.initial)
    clock = time.perf_counter_ns
    for t in range(data.length):
        feeds = {**data.constants, **{name: chunk[t] for name, chunk in data.chunks.items()}}
        t0 = clock()
        out = carrier.chunk(feeds, with_state)
        if timed is not None:
            timed[t] = clock() - t0
        yield out


def stacked(outputs: list[Feeds]) -> dict[str, np.ndarray]:
    return {name: np.stack([o[name] for o in outputs]) for name in outputs[0]}


def check_state_shapes(project: Project, outputs: dict[str, np.ndarray]) -> None:
    """Every state output has its state input's shape: else the second chunk would fail, or broadcast silently."""
    workload: StreamWorkload = project.workload
    specs = {s.name: s for s in project.inputs}
    for name, output in workload.state.items():
        want = specs[name].concrete_shape(project.dims)
        got = outputs[output].shape
        if tuple(got) != tuple(want):
            raise BadInput(
                f'[workload] state {{{name} = "{output}"}}: output {output!r} is {list(got)} and input '
                f"{name!r} is {list(want)}, so the state cannot be fed back",
                fix="map each state input to the output that carries it, or correct the input's shape",
            )


# ---------------------------------------------------------------- in the inference process


def loop(carrier: StateCarrier, workload: dict, data: StreamData) -> tuple[dict, dict[str, np.ndarray]]:
    """The golden stream once untimed (its outputs returned, state outputs included, for drift), then `trials` timed
    streams: each chunk's time in ms, per stream (the state stays where the carrier keeps it)."""
    outputs = stacked(list(carry(carrier, data)))
    streams = []
    for _ in range(workload["trials"]):
        times = np.empty(data.length, dtype=np.float64)
        for _ in carry(carrier, data, timed=times, with_state=False):
            pass
        streams.append((times / 1e6).tolist())
    return {"chunk_ms": streams}, outputs


def first_chunk(carrier: StateCarrier, data: StreamData) -> float:
    """The first chunk from the initial state: the cold start's second half."""
    feeds = {**data.constants, **{n: c[0] for n, c in data.chunks.items()}}
    carrier.start(data.initial)
    t0 = time.perf_counter()
    carrier.chunk(feeds, with_state=False)
    return (time.perf_counter() - t0) * 1e3


# ---------------------------------------------------------------- on the host


def drift(reference: dict[str, np.ndarray], actual: dict[str, np.ndarray], bins: int = DRIFT_BINS) -> dict[str, dict]:
    """Per output: its largest absolute difference from the reference in each chunk, summarised over the stream
    (max, first chunk, last quarter) and in bins of the chunk index: an error that grows along the stream is state
    drift, one that does not is the precision's own."""
    result = {}
    for name, ref in reference.items():
        got = actual.get(name)
        if got is None or got.shape != ref.shape:
            raise BadInput(
                f"the streamed output {name!r} is {None if got is None else list(got.shape)}, the reference's "
                f"{list(ref.shape)}",
                fix="rebuild: the artifact and the workload file disagree",
            )
        err = np.abs(got.astype(np.float64) - ref.astype(np.float64)).reshape(len(ref), -1).max(axis=1)
        scale = float(np.abs(ref.astype(np.float64)).max()) if ref.size else 0.0
        quarter = max(1, len(err) // 4)
        edges = np.linspace(0, len(err), min(bins, len(err)) + 1).round().astype(int)
        result[name] = {
            "max_abs": float(err.max()),
            # the error as a share of the output's largest magnitude over the stream: a budget without units
            # (an output the reference holds at zero throughout: any error is all of it)
            "scale": scale,
            "max_rel": float(err.max()) / scale if scale > 0 else float(err.max() > 0),
            "first_chunk": float(err[0]),
            "first_quarter_max": float(err[:quarter].max()),
            "last_quarter_max": float(err[-quarter:].max()),
            "worst_chunk": int(err.argmax()),
            "by_chunk": [
                {"from": int(a), "to": int(b - 1), "max_abs": float(err[a:b].max())}
                for a, b in itertools.pairwise(edges)
                if b > a
            ],
        }
    return result


@dataclass
class StreamMeasurement:
    workload: StreamWorkload
    chunk: stats.LatencySummary
    stream_rtf: list[float]  # every timed stream's compute time over its real time
    misses: int
    chunks_timed: int
    cold_start_ms: list[float]
    peak_rss_mb: list[float]
    rss_start_mb: list[float]
    weights_mb: float
    state_bytes: int
    drift: dict[str, dict]
    device_memory: dict | None = None  # on a GPU target: its peak device memory split (stats.device_split)
    notes: list[str] = field(default_factory=list)

    @property
    def outputs_drift(self) -> dict[str, dict]:
        """The model's outputs that are not state: what stream_max_abs_error is judged on."""
        carried = set(self.workload.state.values())
        return {n: d for n, d in self.drift.items() if n not in carried}

    @property
    def max_abs_error(self) -> float:
        return max((d["max_abs"] for d in self.outputs_drift.values()), default=0.0)

    @property
    def max_rel_error(self) -> float:
        return max((d["max_rel"] for d in self.outputs_drift.values()), default=0.0)

    def rtf(self) -> tuple[float, float, float]:
        """Median over the timed streams, and the fastest and slowest stream's."""
        return float(np.median(self.stream_rtf)), min(self.stream_rtf), max(self.stream_rtf)

    def memory(self) -> dict:
        split = stats.resident_split(
            self.peak_rss_mb,
            self.rss_start_mb,
            self.weights_mb,
            "state",
            self.state_bytes / 2**20,
            "over the streams; state is the carried tensors; rest is the runtime, its arenas and activations",
        )
        if self.device_memory is not None:
            split["device"] = self.device_memory
        return split

    def to_json(self) -> dict:
        point, low, high = self.rtf()
        return {
            "kind": "stream",
            "settings": self.workload.model_dump(mode="json"),
            "chunk_ms": self.chunk.to_json(),
            "real_time_factor": {
                "median": point,
                "fastest": low,
                "slowest": high,
                "streams": len(self.stream_rtf),
                "what": "compute time of a whole stream over chunks × deadline_ms; under 1 keeps up",
            },
            "deadline": {
                "deadline_ms": self.workload.deadline_ms,
                "misses": self.misses,
                "chunks": self.chunks_timed,
                "share": self.misses / self.chunks_timed,
            },
            "cold_start_ms": {
                "per_repeat": self.cold_start_ms,
                "median": float(np.median(self.cold_start_ms)),
                "max": max(self.cold_start_ms),
                "what": "session creation + the first chunk from the initial state, in a fresh process",
            },
            "memory_mb": self.memory(),
            "drift": {
                "outputs": self.drift,
                "max_abs_error": self.max_abs_error,
                "max_rel_error": self.max_rel_error,
                "chunks": self.workload.chunks,
                "what": "largest absolute difference from the FP32 reference per chunk over the golden stream, "
                "state carried on both sides",
            },
            "notes": self.notes,
        }


def summarize(
    results: list[dict],
    outputs: dict[str, np.ndarray],
    data: StreamData,
    workload: StreamWorkload,
    weights_bytes: int,
    confidence: float,
) -> StreamMeasurement:
    per_process = [np.concatenate([np.asarray(s) for s in r["stream"]["chunk_ms"]]) for r in results]
    streams = [np.asarray(s) for r in results for s in r["stream"]["chunk_ms"]]
    real = workload.deadline_ms * data.length
    pooled = np.concatenate(per_process)
    rss = [r["meters"]["rss"] for r in results]
    m = StreamMeasurement(
        workload,
        stats.summarize(per_process, confidence),
        [float(s.sum() / real) for s in streams],
        misses=int((pooled > workload.deadline_ms).sum()),
        chunks_timed=int(pooled.size),
        cold_start_ms=[r["create_ms"] + r["first_ms"] for r in results],
        peak_rss_mb=[x["peak_rss_mb"] for x in rss],
        rss_start_mb=[x["rss_start_mb"] for x in rss],
        weights_mb=weights_bytes / 2**20,
        state_bytes=sum(v.nbytes for v in data.initial.values()),
        drift=drift(data.reference, outputs),
        device_memory=stats.device_split(
            results, weights_bytes / 2**20, "state", sum(v.nbytes for v in data.initial.values()) / 2**20
        ),
    )
    described = results[0]["stream"].get("carrier")
    if described:
        m.notes.append(f"the loop: {described}")
    if m.chunk.cv_between_repeats > 0.05:
        m.notes.append(
            f"run-to-run spread of the chunk time is high (CV of per-process medians "
            f"{m.chunk.cv_between_repeats:.1%}): the machine is noisy; bounds are widened to cover it"
        )
    return m


def request_fields(workload: StreamWorkload, data_path: Path) -> dict:
    return {"mode": workload.kind, "workload": workload.model_dump(mode="json"), "workload_data": str(data_path)}
