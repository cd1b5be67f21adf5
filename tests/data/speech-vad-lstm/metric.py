"""Chunk accuracy on six held-out streams, run as deployed: the state `predict` returns fed into the next call."""

import audio
import numpy as np
from model import CONTEXT, HIDDEN


def chunk_accuracy(predict) -> float:
    correct = total = 0
    for seed in audio.HELDOUT_SEEDS:
        signal, labels = audio.synthesize(seed, audio.HELDOUT_CHUNKS)
        context = np.zeros((1, CONTEXT), np.float32)
        h, c = np.zeros((1, 1, HIDDEN), np.float32), np.zeros((1, 1, HIDDEN), np.float32)
        for t, label in enumerate(labels):
            out = predict(
                {"audio": signal[None, t * audio.CHUNK : (t + 1) * audio.CHUNK], "context": context, "h": h, "c": c}
            )
            context, h, c = out["context_out"], out["h_out"], out["c_out"]
            correct += int((out["probability"].item() > 0.5) == bool(label))
            total += 1
    return correct / total
