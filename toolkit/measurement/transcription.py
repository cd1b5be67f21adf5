"""A `transcribe` workload measured: the encoder once over a clip's features, then the decoder token by token over
its own cache and the cross cache the encoder's graph gave, in fresh processes.

In the inference process (`loop`): both graphs opened and one clip transcribed (cold start); then per clip length
one untimed transcription and `trials` timed ones, each decoding the tokens that length stands for (`tokens_per_s`):
the encoder's time, the time to first token (encoder, then the decoder's first call over the start ids, logits on the
host), every later step's time and the whole; the golden clips decoded greedily until the end token (the first
process only); last, one sequence decoded to max_target, so that the process's peak memory holds both caches whole.

On the host (`summarize`): the encoder, TTFT and TPOT with order-statistic bounds over all processes, each length's
total and real-time factor, the memory split (weights, the self cache at max_target, the cross cache, the rest) and
greedy agreement with the reference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tapeout.core.decoding import agreement
from tapeout.core.errors import BadInput
from tapeout.core.schemas import TranscribeWorkload
from tapeout.core.speech import INPUT_FEATURES, SpeechLayout, pad_tokens
from tapeout.measurement import stats
from tapeout.targets.base import SpeechDecoder

FIX = "copy the build dir to the device as built, or rebuild with `tapeout build`"


def save_workload_data(path: Path, timing: np.ndarray, golden: np.ndarray, reference: np.ndarray) -> None:
    """workload.npz: the features each clip length is timed on [lengths, mel_bins, frames], the golden clips'
    features [clips, mel_bins, frames] and the reference's greedy tokens [clips, tokens] (the end token repeated)."""
    with open(path, "wb") as fh:
        np.savez(fh, timing=timing, golden=golden, reference=reference)


def load_workload_data(
    path: Path, layout: SpeechLayout, workload: TranscribeWorkload
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """workload.npz read back and its values checked against the layout and the workload it was made for: a verified
    hash proves the file is the one written, not that what is in it is sane."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path} is not a readable workload file ({exc})", fix=FIX) from None
    if any(k not in arrays for k in ("timing", "golden", "reference")):
        raise BadInput(f"{path} lacks the clips or reference tokens a transcribe workload replays", fix=FIX)
    timing, golden, reference = arrays["timing"], arrays["golden"], arrays["reference"]
    features = (layout.mel_bins, layout.frames)
    problems = []
    if timing.dtype != np.float32 or timing.shape != (len(workload.audio_s), *features):
        problems.append(
            f"the timed clips are {timing.dtype} {list(timing.shape)}, not float32 "
            f"[{len(workload.audio_s)}, {features[0]}, {features[1]}]"
        )
    if golden.dtype != np.float32 or golden.ndim != 3 or golden.shape[1:] != features or not len(golden):
        problems.append(
            f"the golden clips are {golden.dtype} {list(golden.shape)}, not float32 "
            f"[clips, {features[0]}, {features[1]}]"
        )
    if not np.issubdtype(reference.dtype, np.integer) or reference.shape != (len(golden), workload.agreement_tokens):
        problems.append(
            f"the reference tokens are {list(reference.shape)}, not [{len(golden)}, {workload.agreement_tokens}]"
        )
    elif reference.size and (reference.min() < 0 or reference.max() >= layout.vocab):
        problems.append(f"the reference holds token ids outside [0, {layout.vocab})")
    if not all(np.isfinite(a).all() for a in (timing, golden) if a.dtype == np.float32):
        problems.append("the clips hold values that are not finite")
    if problems:
        raise BadInput(f"{path}: {'; '.join(problems)}", fix=FIX)
    return timing, golden, reference


# ---------------------------------------------------------------- in the inference process


def encoder_call(run, layout: SpeechLayout):
    """The encoder's graph as a call: features [mel_bins, frames] in, the cross keys and values out."""
    names = layout.cross()

    def encode(features: np.ndarray) -> list[np.ndarray]:
        out = run({INPUT_FEATURES: features[None]})
        return [out[n] for n in names]

    return encode


def transcribe(encode, decoder: SpeechDecoder, features: np.ndarray, tokens: int, stop_at_end: bool) -> list[int]:
    """Greedy decoding of one clip: `tokens` at most (every one where not `stop_at_end`: a timed clip decodes what
    its length stands for, whatever the seeded model says)."""
    token = int(decoder.start(encode(features)).argmax())
    got = [token]
    while len(got) < tokens and not (stop_at_end and token == decoder.layout.eos):
        token = int(decoder.step(token).argmax())
        got.append(token)
    return got


def loop(encode, decoder: SpeechDecoder, workload: TranscribeWorkload, timing, golden, want_tokens: bool) -> dict:
    """The timed transcriptions of one process (`encode`, `decoder`: over the sessions already created)."""
    clock = time.perf_counter_ns
    layout = decoder.layout
    room = layout.max_target - len(layout.start_ids)
    result: dict = {"encoder_ms": [], "ttft_ms": [], "tpot_ms": [], "total_ms": {}, "decoder": decoder.description}
    for seconds, features in zip(workload.audio_s, timing, strict=True):
        tokens = min(workload.tokens(seconds), room)
        totals = result["total_ms"][str(seconds)] = []
        for trial in range(workload.trials + 1):  # the first is a warm-up at this length
            t0 = clock()
            cross = encode(features)
            t1 = clock()
            token = int(decoder.start(cross).argmax())
            t2 = clock()
            steps = np.empty(tokens - 1)
            for i in range(tokens - 1):
                ts = clock()
                token = int(decoder.step(token).argmax())
                steps[i] = clock() - ts
            end = clock()
            if trial:
                result["encoder_ms"].append((t1 - t0) / 1e6)
                result["ttft_ms"].append((t2 - t0) / 1e6)
                result["tpot_ms"] += (steps / 1e6).tolist()
                totals.append((end - t0) / 1e6)
    if want_tokens:
        result["tokens"] = [
            pad_tokens(
                transcribe(encode, decoder, clip, workload.agreement_tokens, True),
                workload.agreement_tokens,
                layout.eos,
            )
            for clip in golden
        ]
    transcribe(encode, decoder, timing[-1], room, False)  # both caches whole once: the peak memory holds them
    return result


def first_clip(encode, decoder: SpeechDecoder, timing: np.ndarray) -> float:
    """The first clip's encoder and first token: the cold start's second half."""
    t0 = time.perf_counter()
    decoder.start(encode(timing[0])).argmax()
    return (time.perf_counter() - t0) * 1e3


# ---------------------------------------------------------------- on the host


@dataclass
class TranscriptionMeasurement:
    workload: TranscribeWorkload
    layout: SpeechLayout
    encoder: stats.LatencySummary
    ttft: stats.LatencySummary
    tpot: stats.LatencySummary
    total: dict[float, stats.LatencySummary]  # per clip length, ms
    rtf: dict[float, stats.LatencySummary]  # per clip length: total over the clip's real time
    cold_start_ms: list[float]
    memory_mb: dict
    agreement: float | None
    first_divergence: list[int | None]
    notes: list[str] = field(default_factory=list)
    tokens: np.ndarray | None = None  # the artifact's greedy tokens on the golden clips (padded with the end token)
    wer: dict | None = None  # word_errors(): where the project gives transcripts, at build

    def worst_rtf(self) -> tuple[float, stats.QuantileEstimate]:
        """The clip length whose p90 real-time factor is highest (the shortest: the encoder's cost is the same for
        every clip), with that estimate."""
        seconds = max(self.rtf, key=lambda s: self.rtf[s].quantiles["p90"].point)
        return seconds, self.rtf[seconds].quantiles["p90"]

    def to_json(self) -> dict:
        return {
            "kind": "transcribe",
            "settings": self.workload.model_dump(mode="json"),
            "layout": self.layout.to_json(),
            "encoder_ms": self.encoder.to_json(),
            "ttft_ms": self.ttft.to_json(),
            "tpot_ms": self.tpot.to_json(),
            "total_ms": {f"{s:g}": v.to_json() for s, v in self.total.items()},
            "real_time_factor": {f"{s:g}": v.to_json() for s, v in self.rtf.items()},
            "tokens": {
                f"{s:g}": min(self.workload.tokens(s), self.layout.max_target - len(self.layout.start_ids))
                for s in self.workload.audio_s
            },
            "cold_start_ms": {
                "per_repeat": self.cold_start_ms,
                "median": float(np.median(self.cold_start_ms)),
                "max": max(self.cold_start_ms),
                "what": "both graphs opened + the first clip's encoder and first token, in a fresh process",
            },
            "memory_mb": self.memory_mb,
            "agreement": {
                "share": self.agreement,
                "first_divergence": self.first_divergence,
                "clips": len(self.first_divergence),
                "tokens": self.workload.agreement_tokens,
                "what": "share of the reference's greedy tokens reproduced before the first divergence, the end "
                "token included",
            },
            "wer": self.wer,
            "notes": self.notes,
        }


def summarize(
    results: list[dict],
    workload: TranscribeWorkload,
    layout: SpeechLayout,
    reference: np.ndarray,
    weights_bytes: int,
    confidence: float,
) -> TranscriptionMeasurement:
    def each(key):
        return [np.asarray(r["transcribe"][key]) for r in results]

    total = {
        s: stats.summarize(
            [np.asarray(r["transcribe"]["total_ms"][str(s)]) for r in results], confidence, quantiles=(0.5, 0.9)
        )
        for s in workload.audio_s
    }
    rtf = {
        s: stats.summarize(
            [np.asarray(r["transcribe"]["total_ms"][str(s)]) / (s * 1e3) for r in results],
            confidence,
            quantiles=(0.5, 0.9),
        )
        for s in workload.audio_s
    }
    tokens = next((np.asarray(r["transcribe"]["tokens"]) for r in results if "tokens" in r["transcribe"]), None)
    share, firsts = agreement(reference, tokens) if tokens is not None else (None, [])
    rss = [r["meters"]["rss"] for r in results]
    self_mb = layout.self_cache_bytes() / 2**20
    cross_mb = layout.cross_cache_bytes(layout.source) / 2**20
    memory = stats.resident_split(
        [x["peak_rss_mb"] for x in rss],
        [x["rss_start_mb"] for x in rss],
        weights_bytes / 2**20,
        "caches",
        self_mb + cross_mb,
        "with one clip decoded to max_target; caches is the self-attention cache at max_target and the "
        "cross-attention cache over the encoder's output; rest is the runtime, its arenas and activations",
    )
    memory.update(self_cache=self_mb, cross_cache=cross_mb)
    m = TranscriptionMeasurement(
        workload,
        layout,
        encoder=stats.summarize(each("encoder_ms"), confidence, quantiles=(0.5, 0.9)),
        ttft=stats.summarize(each("ttft_ms"), confidence, quantiles=(0.5, 0.9)),
        tpot=stats.summarize(each("tpot_ms"), confidence),
        total=total,
        rtf=rtf,
        cold_start_ms=[r["create_ms"] + r["first_ms"] for r in results],
        memory_mb=memory,
        agreement=share,
        first_divergence=firsts,
        tokens=tokens,
    )
    described = results[0]["transcribe"].get("decoder")
    if described:
        m.notes.append(f"the loop: {described}")
    if m.encoder.cv_between_repeats > 0.05:
        m.notes.append(
            f"run-to-run spread of the encoder's time is high (CV of per-process medians "
            f"{m.encoder.cv_between_repeats:.1%}): the machine is noisy; bounds are widened to cover it"
        )
    return m


def wer(said: list[str], heard: list[str]) -> float:
    """Word error rate by jiwer: substitutions, deletions and insertions over the words said, over all clips."""
    import jiwer

    return float(jiwer.wer(said, heard))


def word_errors(said: list[str], torch_text: list[str], artifact_text: list[str]) -> dict:
    """The word error rate of the artifact's transcripts and of torch's, each clip's three texts beside them."""
    return {
        "artifact": wer(said, artifact_text),
        "torch": wer(said, torch_text),
        "clips": [
            {"said": s, "torch": t, "artifact": a} for s, t, a in zip(said, torch_text, artifact_text, strict=True)
        ],
        "what": "word error rate of the greedy transcripts of the golden clips (up to agreement_tokens tokens each) "
        "against [workload] transcripts, by jiwer",
    }


def request_fields(workload: TranscribeWorkload, layout: SpeechLayout, data_path: Path, encoder: Path) -> dict:
    return {
        "mode": workload.kind,
        "workload": workload.model_dump(mode="json"),
        "layout": layout.to_json(),
        "workload_data": str(data_path),
        "encoder_file": str(encoder),
    }
