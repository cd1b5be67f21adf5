"""Mean cosine between the model's mean-pooled sentence embeddings and the FP32 reference embeddings.

Scored on the 236 held-out sentences (the 64 before them calibrate the quantizer and recover a pruned
model). The reference (data/reference.npy, every sentence) is the FP32 torch model's output, written by
make_data.py; the build evaluates the torch model too, so a stale reference shows as a reference metric
below 1.
"""

from pathlib import Path

import numpy as np
from text import CALIBRATION, encode, held_out, mean_pool

REFERENCE = Path(__file__).with_name("data") / "reference.npy"


def embed(predict, texts) -> np.ndarray:
    rows = []
    for feeds in encode(texts):
        hidden = predict(feeds)["last_hidden_state"]
        rows.append(mean_pool(hidden, feeds["attention_mask"])[0])
    return np.stack(rows)


def mean_cosine(predict) -> float:
    reference = np.load(REFERENCE, allow_pickle=False).astype(np.float64)[CALIBRATION:]
    emb = embed(predict, held_out())
    cos = (emb * reference).sum(1) / (np.linalg.norm(emb, axis=1) * np.linalg.norm(reference, axis=1))
    return float(cos.mean())
