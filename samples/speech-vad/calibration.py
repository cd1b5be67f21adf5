"""Calibration feeds as the deployed stream sees them: chunks of training-like audio (seeds apart from the held-out
and golden streams) with the state the FP32 model carries into each, so the state inputs are calibrated on real
state, not on random values."""

import audio
import torch
from model import CONTEXT, HIDDEN, build

SEEDS, CHUNKS = range(5_000, 5_004), 16


def feeds():
    model = build()
    for seed in SEEDS:
        signal, _ = audio.synthesize(seed, CHUNKS)
        context, h = torch.zeros(1, CONTEXT), torch.zeros(1, 1, HIDDEN)
        for t in range(CHUNKS):
            chunk = torch.from_numpy(signal[None, t * audio.CHUNK : (t + 1) * audio.CHUNK])
            yield {"audio": chunk.numpy(), "context": context.numpy(), "h": h.numpy()}
            with torch.inference_mode():
                _, context, h = model(chunk, context, h)
