"""The KV-cache graph a `generate` workload exports, as data: its names and shapes (CacheLayout), and the loops
that run any one-step callable over it (greedy decoding, teacher forcing). numpy only: the build, the
measuring process and `check` on a device all use it.

The graph (exporters/generation.py makes it):
    inputs   input_ids [batch, seq] int64, and per layer i: past_key_i, past_value_i [batch, kv_heads, past, head_dim]
    outputs  logits [batch, 1, vocab] (the last position: all that decoding reads), present_key_i, present_value_i
             [batch, kv_heads, past + seq, head_dim]
Positions are past .. past + seq - 1; one graph serves prefill (past = 0) and decode (seq = 1).

A masked graph (for a runtime that pads to static shapes and masks the padding itself: OpenVINO's NPU pipeline)
also takes attention_mask [batch, past + seq] int64 (1: a real token) and position_ids [batch, seq] int64, after
input_ids; the loops here feed them as ones and past .. past + seq - 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

Feeds = dict[str, np.ndarray]
Step = Callable[[Feeds], dict[str, np.ndarray]]

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
LOGITS = "logits"
# A graph whose cache is one buffer per layer of max_context positions appended in place (ONNX Runtime's
# share-kv-buffer pass) takes this too: the positions the buffer holds. The runtime's wrapper feeds it.
PAST_LENGTH = "past_length"


@dataclass(frozen=True)
class CacheLayout:
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_context: int
    dtype: str = "float32"
    masked: bool = False  # the graph takes attention_mask and position_ids (module docstring)
    max_prompt: int = 0  # the longest prompt a static-shape runtime is compiled for ([workload] max_prompt)

    def inputs(self) -> list[str]:
        return [INPUT_IDS, *((ATTENTION_MASK, POSITION_IDS) if self.masked else ()), *self.past()]

    def positions(self, batch: int, past: int, seq: int) -> Feeds:
        """A masked graph's attention_mask and position_ids for `seq` new tokens after `past` cached ones; none
        for the plain graph (it derives positions from the cache's length)."""
        if not self.masked:
            return {}
        return {
            ATTENTION_MASK: np.ones((batch, past + seq), np.int64),
            POSITION_IDS: np.repeat(np.arange(past, past + seq, dtype=np.int64)[None], batch, axis=0),
        }

    def feeds(self, ids: np.ndarray, past: Feeds) -> Feeds:
        """One call's inputs: the token ids, the positions where the graph takes them, and the cache."""
        ids = np.asarray(ids).astype(np.int64)
        length = past[self.past()[0]].shape[2]
        return {INPUT_IDS: ids, **self.positions(ids.shape[0], length, ids.shape[1]), **past}

    def past(self) -> list[str]:
        return [f"past_{kind}_{i}" for i in range(self.layers) for kind in ("key", "value")]

    def present(self) -> list[str]:
        return [f"present_{kind}_{i}" for i in range(self.layers) for kind in ("key", "value")]

    def outputs(self) -> list[str]:
        return [LOGITS, *self.present()]

    def empty_past(self, batch: int) -> Feeds:
        return {name: np.zeros((batch, self.kv_heads, 0, self.head_dim), self.dtype) for name in self.past()}

    def kv_bytes(self, tokens: int, batch: int = 1) -> int:
        """Keys and values of every layer for `tokens` positions."""
        return 2 * self.layers * batch * self.kv_heads * tokens * self.head_dim * np.dtype(self.dtype).itemsize

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> CacheLayout:
        masked, max_prompt = data.get("masked", False), data.get("max_prompt", 0)  # absent from older builds
        if not isinstance(masked, bool) or type(max_prompt) is not int or max_prompt < 0:
            raise TypeError(f"masked = {masked!r}, max_prompt = {max_prompt!r}: a bool and a whole number expected")
        return cls(
            **{k: data[k] for k in ("layers", "kv_heads", "head_dim", "vocab", "max_context", "dtype")},
            masked=masked,
            max_prompt=max_prompt,
        )


def graph_layout(inputs: list, workload) -> CacheLayout:
    """The layout of a cache graph read off its input specs (exporters/generation.graph_inputs made them), sized
    by the generate workload."""
    past = [s for s in inputs if s.name.startswith("past_")]
    ids = next(s for s in inputs if s.name == INPUT_IDS)
    return CacheLayout(
        layers=len(past) // 2,
        kv_heads=past[0].shape[1],
        head_dim=past[0].shape[3],
        vocab=int(ids.range[1]) + 1,
        max_context=workload.max_context,
        dtype=past[0].dtype,
        masked=any(s.name == ATTENTION_MASK for s in inputs),
        max_prompt=workload.longest_prompt,
    )


def feed_back(layout: CacheLayout, outputs: dict[str, np.ndarray]) -> Feeds:
    """This call's present keys and values, named as the next call's past."""
    return {past: outputs[present] for past, present in zip(layout.past(), layout.present(), strict=True)}


def greedy(step: Step, layout: CacheLayout, prompt: np.ndarray, new_tokens: int) -> np.ndarray:
    """Greedy continuation [batch, new_tokens] of `prompt` [batch, length]: prefill, then one token per call."""
    out = step(layout.feeds(prompt, layout.empty_past(prompt.shape[0])))
    tokens = []
    for i in range(new_tokens):
        token = out[LOGITS][:, -1].argmax(-1).astype(np.int64)[:, None]
        tokens.append(token)
        if i + 1 < new_tokens:
            out = step(layout.feeds(token, feed_back(layout, out)))
    return np.concatenate(tokens, axis=1)


def teacher_forced(step: Step, layout: CacheLayout) -> Callable[[Feeds], dict[str, np.ndarray]]:
    """A predict that returns logits for every position of `input_ids`, computed one token at a time through the
    cache, as decoding sees them: what a language-model metric (perplexity) scores the cache path with."""

    def predict(feeds: Feeds) -> dict[str, np.ndarray]:
        ids = np.asarray(feeds[INPUT_IDS]).astype(np.int64)
        past = layout.empty_past(ids.shape[0])
        logits = []
        for t in range(ids.shape[1]):
            out = step(layout.feeds(ids[:, t : t + 1], past))
            logits.append(out[LOGITS][:, -1])
            past = feed_back(layout, out)
        return {LOGITS: np.stack(logits, axis=1)}

    return predict


def teacher_forced_loop(decoder) -> Callable[[Feeds], dict[str, np.ndarray]]:
    """The same predict through a runtime's own decode loop (a targets.base.CachedDecoder): its first token
    prefilled, each next one a step. For a runtime that runs no single call of the cache graph on its own (OpenVINO's
    NPU pipeline compiles its prefill and decode shapes, nothing else)."""

    def predict(feeds: Feeds) -> dict[str, np.ndarray]:
        ids = np.asarray(feeds[INPUT_IDS]).astype(np.int64)
        rows = []
        for row in ids:
            logits = [decoder.prefill(row[None, :1])]
            logits += [decoder.step(row[None, t : t + 1]) for t in range(1, ids.shape[1])]
            rows.append(np.concatenate(logits, axis=0))
        return {LOGITS: np.stack(rows)}

    return predict


def agreement(reference: np.ndarray, candidate: np.ndarray) -> tuple[float, list[int | None]]:
    """The share of the reference's greedy tokens reproduced before the first divergence (mean over rows), and
    each row's first divergent position (None: none)."""
    firsts: list[int | None] = []
    shares = []
    for ref, got in zip(reference, candidate, strict=True):
        differ = np.flatnonzero(ref != got)
        first = int(differ[0]) if differ.size else None
        firsts.append(first)
        shares.append((len(ref) if first is None else first) / len(ref))
    return float(np.mean(shares)), firsts
