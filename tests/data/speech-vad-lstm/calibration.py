"""Calibration feeds as the deployed stream sees them, with the state (context, h, c) the FP32 model carries."""

import audio
import torch
from model import CONTEXT, HIDDEN, build

SEEDS, CHUNKS = range(5_000, 5_004), 16


def feeds():
    model = build()
    for seed in SEEDS:
        signal, _ = audio.synthesize(seed, CHUNKS)
        context, h, c = torch.zeros(1, CONTEXT), torch.zeros(1, 1, HIDDEN), torch.zeros(1, 1, HIDDEN)
        for t in range(CHUNKS):
            chunk = torch.from_numpy(signal[None, t * audio.CHUNK : (t + 1) * audio.CHUNK])
            yield {"audio": chunk.numpy(), "context": context.numpy(), "h": h.numpy(), "c": c.numpy()}
            with torch.inference_mode():
                _, context, h, c = model(chunk, context, h, c)
