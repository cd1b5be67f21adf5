"""A `generate` workload measured: prefill and token-by-token decode over the KV cache, in fresh processes.

In the inference process (`loop`): the session is created and the first prompt's first token taken (cold
start); then per prompt length one untimed generation and `trials` timed ones: time to first token (prefill
plus choosing the token, logits on the host) and every decode step's time with its position; the golden
prompts decoded greedily (the first process only); last, one sequence filled to max_context, so that the
process's peak memory holds the whole KV cache. Profiler off throughout.

On the host (`summarize`): TTFT per prompt length and TPOT with order-statistic bounds over all processes,
tokens per second, TPOT against position, the memory split and greedy agreement with the reference.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tapeout.core.decoding import CacheLayout, agreement
from tapeout.core.errors import BadInput
from tapeout.core.schemas import GenerateWorkload
from tapeout.measurement import stats

POSITION_BINS = 8


def save_workload_data(
    path: Path, prompts: dict[int, np.ndarray], agreement_prompts: np.ndarray, reference_tokens: np.ndarray
) -> None:
    """workload.npz: the timing prompts per length, the golden prompts and the reference's greedy tokens."""
    arrays = {f"prompt.{length}": ids for length, ids in prompts.items()}
    arrays.update({"agreement.prompts": agreement_prompts, "agreement.reference": reference_tokens})
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def load_workload_data(
    path: Path, layout: CacheLayout, workload: GenerateWorkload
) -> tuple[dict[int, np.ndarray], np.ndarray, np.ndarray]:
    """workload.npz read back and its values checked against the workload it was made for: a verified hash proves
    the file is the one written, not that what is in it is sane (another tool, or a bug, re-hashed it)."""
    fix = "copy the build dir to the device as built, or rebuild with `tapeout build`"
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path} is not a readable workload file ({exc})", fix=fix) from None
    prompts = {}
    for key, value in arrays.items():
        if key.startswith("prompt.") and key[len("prompt.") :].isdigit():
            prompts[int(key[len("prompt.") :])] = value
    need = ("agreement.prompts", "agreement.reference")
    if (
        not prompts
        or any(k not in arrays for k in need)
        or any(
            a.ndim != 2 or not np.issubdtype(a.dtype, np.integer)
            for a in (*prompts.values(), *(arrays[k] for k in need))
        )
    ):
        raise BadInput(f"{path} lacks the prompts or reference tokens a generate workload replays", fix=fix)
    golden, reference = arrays["agreement.prompts"], arrays["agreement.reference"]
    problems = []
    if sorted(prompts) != sorted(workload.prompt_lengths):
        problems.append(f"prompt lengths {sorted(prompts)}, the workload's {sorted(workload.prompt_lengths)}")
    problems += [
        f"prompt.{n} is {list(a.shape)}, not [rows, {n}]" for n, a in prompts.items() if a.shape[1] != n or not len(a)
    ]
    if 0 in golden.shape:
        problems.append(f"the golden prompts are {list(golden.shape)}: at least one prompt of at least one token")
    if reference.shape != (len(golden), workload.compared_tokens):
        problems.append(
            f"the reference tokens are {list(reference.shape)}, not [{len(golden)}, {workload.compared_tokens}] "
            "(a row per golden prompt, the tokens compared)"
        )
    for name, a in (
        *((f"prompt.{n}", a) for n, a in prompts.items()),
        ("agreement.prompts", golden),
        ("agreement.reference", reference),
    ):
        if a.size and (a.min() < 0 or a.max() >= layout.vocab):
            problems.append(f"{name} holds token ids outside [0, {layout.vocab})")
    if golden.shape[1] + workload.compared_tokens > layout.max_context:
        problems.append(
            f"a golden prompt of {golden.shape[1]} tokens leaves no room in max_context {layout.max_context}"
        )
    if problems:
        raise BadInput(f"{path}: {'; '.join(problems)}", fix=fix)
    return dict(sorted(prompts.items())), golden, reference


# ---------------------------------------------------------------- in the inference process


def loop(
    decoder,
    layout: CacheLayout,
    workload: dict,
    prompts: dict[int, np.ndarray],
    agreement_prompts: np.ndarray,
    want_tokens: bool,
) -> dict:
    """The timed generation loop of one process (`decoder`: the session's CachedDecoder, already created; the prompts
    from workload.npz)."""
    new_tokens, trials = workload["new_tokens"], workload["trials"]
    clock = time.perf_counter_ns
    ttft: dict[str, list[float]] = {}
    tpot: list[float] = []
    position: list[int] = []
    for length, ids in prompts.items():
        ttft[str(length)] = []
        for trial in range(trials + 1):  # the first is a warm-up at this length
            t0 = clock()
            token = decoder.prefill(ids).argmax(-1)[:, None]
            first = clock() - t0
            steps = np.empty(new_tokens - 1)
            for i in range(new_tokens - 1):
                t0 = clock()
                token = decoder.step(token).argmax(-1)[:, None]
                steps[i] = clock() - t0
            if trial:
                ttft[str(length)].append(first / 1e6)
                tpot += (steps / 1e6).tolist()
                position += list(range(length, length + new_tokens - 1))
    result: dict = {"ttft_ms": ttft, "tpot_ms": tpot, "tpot_position": position, "decoder": decoder.description}
    if want_tokens:
        compared = workload["compared_tokens"]
        tokens = []
        for row in agreement_prompts:
            token = decoder.prefill(row[None]).argmax(-1)[:, None]
            got = [token]
            for _ in range(compared - 1):
                token = decoder.step(token).argmax(-1)[:, None]
                got.append(token)
            tokens.append(np.concatenate(got, axis=1)[0])
        result["tokens"] = np.stack(tokens).tolist()
    # the whole cache resident once: the longest prompt, then decode up to max_context
    longest = max(prompts)
    token = decoder.prefill(prompts[longest]).argmax(-1)[:, None]
    for _ in range(layout.max_context - longest):
        token = decoder.step(token).argmax(-1)[:, None]
    return result


def first_token(decoder, prompts: dict[int, np.ndarray]) -> float:
    """Prefill of the shortest prompt and its first token: the cold start's second half."""
    t0 = time.perf_counter()
    decoder.prefill(prompts[min(prompts)]).argmax(-1)
    return (time.perf_counter() - t0) * 1e3


# ---------------------------------------------------------------- on the host


@dataclass
class GenerationMeasurement:
    workload: GenerateWorkload
    layout: CacheLayout
    ttft: dict[int, stats.LatencySummary]
    tpot: stats.LatencySummary
    tpot_by_position: list[dict]
    cold_start_ms: list[float]
    peak_rss_mb: list[float]
    rss_start_mb: list[float]
    rss_after_session_mb: list[float]
    weights_mb: float
    agreement: float | None
    first_divergence: list[int | None]
    device_memory: dict | None = None  # on a GPU target: its peak device memory split (stats.device_split)
    notes: list[str] = field(default_factory=list)

    @property
    def kv_cache_mb(self) -> float:
        return self.layout.kv_bytes(self.workload.max_context, self.workload.batch) / 2**20

    def decode_tokens_per_s(self) -> tuple[float, float, float]:
        """Point, lower and upper bound, from the median time per token and its bounds."""
        q = self.tpot.quantiles["p50"]
        per = 1e3 * self.workload.batch
        return (
            per / q.point,
            per / q.upper if np.isfinite(q.upper) else 0.0,
            per / q.lower if q.lower > 0 else float("inf"),
        )

    def memory(self) -> dict:
        split = stats.resident_split(
            self.peak_rss_mb,
            self.rss_start_mb,
            self.weights_mb,
            "kv_cache",
            self.kv_cache_mb,
            "with one sequence filled to max_context; kv_cache is keys and values of every layer at max_context; rest "
            "is the runtime, its arenas and activations",
        )
        if self.device_memory is not None:  # the weights and the cache live there, not in the resident set
            split["device"] = self.device_memory
        return split

    def to_json(self) -> dict:
        tok_s, tok_low, tok_high = self.decode_tokens_per_s()
        return {
            "kind": "generate",
            "settings": self.workload.model_dump(mode="json"),
            "layout": self.layout.to_json(),
            "ttft_ms": {str(n): s.to_json() for n, s in self.ttft.items()},
            "prefill_tokens_per_s": {
                str(n): self.workload.batch * n * 1e3 / s.quantiles["p50"].point for n, s in self.ttft.items()
            },
            "tpot_ms": self.tpot.to_json(),
            "decode_tokens_per_s": {"point": tok_s, "lower": tok_low, "upper": _finite(tok_high)},
            "tpot_by_position": self.tpot_by_position,
            "cold_start_ms": {
                "per_repeat": self.cold_start_ms,
                "median": float(np.median(self.cold_start_ms)),
                "max": max(self.cold_start_ms),
                "what": "session creation + the shortest prompt's first token, in a fresh process",
            },
            "memory_mb": self.memory(),
            "agreement": {
                "share": self.agreement,
                "first_divergence": self.first_divergence,
                "prompts": len(self.first_divergence),
                "tokens": self.workload.compared_tokens,
                "what": "share of the reference's greedy tokens reproduced before the first divergence",
            },
            "notes": self.notes,
        }


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def by_position(positions: np.ndarray, samples: np.ndarray, bins: int = POSITION_BINS) -> list[dict]:
    """Median and p90 time per token in equal-width bins of the position in the sequence."""
    if positions.size == 0:
        return []
    edges = np.linspace(positions.min(), positions.max() + 1, bins + 1).round().astype(int)
    rows = []
    for low, high in itertools.pairwise(edges):
        inside = samples[(positions >= low) & (positions < high)]
        if inside.size:
            rows.append(
                {
                    "from": int(low),
                    "to": int(high - 1),
                    "count": int(inside.size),
                    "p50_ms": float(np.median(inside)),
                    "p90_ms": float(np.quantile(inside, 0.9)),
                }
            )
    return rows


def summarize(
    results: list[dict],
    workload: GenerateWorkload,
    layout: CacheLayout,
    reference: np.ndarray,
    weights_bytes: int,
    confidence: float,
) -> GenerationMeasurement:
    lengths = sorted(int(n) for n in results[0]["generate"]["ttft_ms"])
    ttft = {
        n: stats.summarize(
            [np.asarray(r["generate"]["ttft_ms"][str(n)]) for r in results], confidence, quantiles=(0.5, 0.9)
        )
        for n in lengths
    }
    tpot = stats.summarize([np.asarray(r["generate"]["tpot_ms"]) for r in results], confidence)
    positions = np.concatenate([np.asarray(r["generate"]["tpot_position"]) for r in results])
    pooled = np.concatenate([np.asarray(r["generate"]["tpot_ms"]) for r in results])
    tokens = next((np.asarray(r["generate"]["tokens"]) for r in results if "tokens" in r["generate"]), None)
    share, firsts = agreement(reference, tokens) if tokens is not None else (None, [])
    rss = [r["meters"]["rss"] for r in results]
    m = GenerationMeasurement(
        workload,
        layout,
        ttft,
        tpot,
        by_position(positions, pooled),
        cold_start_ms=[r["create_ms"] + r["first_ms"] for r in results],
        peak_rss_mb=[x["peak_rss_mb"] for x in rss],
        rss_start_mb=[x["rss_start_mb"] for x in rss],
        rss_after_session_mb=[x["rss_after_session_mb"] for x in rss],
        weights_mb=weights_bytes / 2**20,
        agreement=share,
        first_divergence=firsts,
        device_memory=stats.device_split(
            results, weights_bytes / 2**20, "kv_cache", layout.kv_bytes(workload.max_context, workload.batch) / 2**20
        ),
    )
    described = results[0]["generate"].get("decoder")
    if described:
        m.notes.append(f"the loop: {described}")
    if tpot.cv_between_repeats > 0.05:
        m.notes.append(
            f"run-to-run spread of the time per token is high (CV of per-process medians "
            f"{tpot.cv_between_repeats:.1%}): the machine is noisy; bounds are widened to cover it"
        )
    return m


def request_fields(workload: GenerateWorkload, layout: CacheLayout, data_path: Path) -> dict:
    return {
        "mode": workload.kind,
        "workload": {**workload.model_dump(mode="json"), "compared_tokens": workload.compared_tokens},
        "layout": layout.to_json(),
        "workload_data": str(data_path),
    }
