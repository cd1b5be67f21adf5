"""Perplexity (per byte) on held-out documentation text the model never saw in training."""

import numpy as np
from text import windows

EVAL_WINDOWS = 64


def perplexity(predict) -> float:
    nll, count = 0.0, 0
    for row in windows("heldout", EVAL_WINDOWS):
        logits = predict({"input_ids": row[None]})["logits"][0].astype(np.float64)  # (CONTEXT, VOCAB)
        logits -= logits.max(axis=-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
        nll -= logp[np.arange(len(row) - 1), row[1:]].sum()
        count += len(row) - 1
    return float(np.exp(nll / count))
