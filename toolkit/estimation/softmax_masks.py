"""How much of each Softmax's input a mask holds, read from a reference run of the FP32 model on the build's own
inputs, as the `masked` shape feature of its kernel (predictor.SHAPE_FEATURES).

On an Intel Xeon with AMX, ONNX Runtime's Softmax over [1, 12, 128, 128] ran ~100 µs on N(0, 1) logits and ~550 µs
with a causal mask's upper triangle at float32's lowest (or -inf, or -1e4): its time follows the masked share, about
0.5 ns an element plus ~4 per masked one there. The share is the data's as much as the graph's: MiniLM's golden
input is a padded batch (82 % of its Softmax inputs masked), tiny-lm's causal mask holds 49.6 %, a decode step's
none. So it is measured on the inputs, not read from the graph's constants.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

# a logit this far under its row's largest is a mask's (a model's own logits span tens): exp() of it is 0 either way
MASKED_BELOW = -1e4
UNMASKED = 1  # the feature of a Softmax with nothing masked, and of every other reduce kernel: 1 + the percent masked


def feature(percent: float) -> int:
    """The `masked` shape feature of a Softmax with `percent` of its input masked (1-101: a feature is a log)."""
    return UNMASKED + round(min(max(percent, 0.0), 100.0))


def masked_percent(logits: np.ndarray) -> float:
    """The percent of a Softmax's input (over its last axis) that sits MASKED_BELOW its row's largest."""
    if logits.size == 0:
        return 0.0
    below = logits - logits.max(axis=-1, keepdims=True) < MASKED_BELOW
    return float(below.mean() * 100)


def measured(model: Path, feeds: dict[str, np.ndarray]) -> dict[str, float] | None:
    """Each Softmax node's masked percent in one run of `model` (ONNX, FP32, on this host's ONNX Runtime CPU EP,
    unoptimized so each Softmax's input is the graph's own) on `feeds`; {} where the model has no Softmax, None where
    it cannot be loaded or run (its kernels are then priced as unmasked, as before this was measured)."""
    return measured_each(model, [feeds])[0]


def measured_each(model: Path, runs: list[dict[str, np.ndarray]]) -> list[dict[str, float] | None]:
    """`measured` for each of `runs` (one call's feeds each), the model loaded and its session made once."""
    import onnx
    import onnxruntime as ort
    from google.protobuf.message import DecodeError

    try:
        proto = onnx.load(str(model))
    except (OSError, ValueError, DecodeError):
        return [None] * len(runs)
    softmaxes = [n for n in proto.graph.node if n.op_type == "Softmax" and n.input and n.input[0]]
    if not softmaxes:
        return [{} for _ in runs]
    outputs = {o.name for o in proto.graph.output}
    wanted = list(dict.fromkeys(n.input[0] for n in softmaxes))
    proto.graph.output.extend(onnx.ValueInfoProto(name=t) for t in wanted if t not in outputs)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:  # ONNX Runtime's errors derive from Exception alone: the feature is then left out
        return [None] * len(runs)
    names = {i.name for i in session.get_inputs()}
    found: list[dict[str, float] | None] = []
    for feeds in runs:
        try:
            values = session.run(wanted, {k: v for k, v in feeds.items() if k in names})
        except Exception:  # (as above) a run on feeds the graph refuses
            found.append(None)
            continue
        by_tensor = {t: masked_percent(np.asarray(v, dtype=np.float32)) for t, v in zip(wanted, values, strict=True)}
        found.append({n.name: by_tensor[n.input[0]] for n in softmaxes})
    return found


def with_masks(kernels: list, percents: dict[str, float] | None) -> list:
    """`kernels` with each Softmax kernel (led by a node `percents` names) given its `masked` feature."""
    percents = percents or {}
    return [replace(k, shape=tuple({**dict(k.shape), "masked": feature(percents[k.lead])}.items()))
            if k.cls == "reduce" and k.lead in percents else k for k in kernels]


def phase_feeds(layout, seq: int, past: int, batch: int = 1) -> dict[str, np.ndarray]:
    """One call of a cache graph at a generation phase's shapes (`layout`: core/decoding.CacheLayout): `seq` token
    ids after a cache of `past` zero positions. The ids' values do not move a causal mask's share (nor the cache's:
    its logits are zeros, never a mask's), so any serve."""
    ids = (np.arange(batch * seq) % layout.vocab).reshape(batch, seq)
    cache = {name: np.zeros((batch, layout.kv_heads, past, layout.head_dim), layout.dtype) for name in layout.past()}
    return layout.feeds(ids, cache)


def masked_phases(model: Path, phases: list, layout, own: list) -> list:
    """A generate build's `phases` (estimation/generation.Phase) with each Softmax's masked share measured in one
    run of `model` at that phase's shapes: a prefill's causal mask holds about half its scores (tiny-lm at 64
    tokens: 49 %), a growing cache's decode step none. The phase whose kernels are `own` (the build's, masked on
    its golden input already) is kept as it is. The model is loaded once for all of them."""
    others = [p for p in phases if p.kernels is not own]
    percents = iter(measured_each(model, [phase_feeds(layout, p.seq, p.past) for p in others]))
    return [p if p.kernels is own else replace(p, kernels=with_masks(p.kernels, next(percents))) for p in phases]
