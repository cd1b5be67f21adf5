"""Synthetic 16 kHz audio with speech-like and non-speech stretches, and its per-chunk labels.

Speech here is voiced sound: a harmonic series on a wandering pitch (90-260 Hz) shaped by two moving formant
resonances and a syllable-rate envelope (3-6 Hz), over background noise at a random SNR. Non-speech is the same
backgrounds alone: white, pink or brown noise, mains hum, and steady tones (a beep is not speech). Everything is
seeded: the training, held-out and golden streams are different seeds of the same generator.
"""

from __future__ import annotations

import numpy as np

RATE = 16_000
CHUNK = 512  # 32 ms at 16 kHz: one call of the model
HANGOVER = 8  # chunks (256 ms) still labelled speech after speech stops, as deployed VADs
# pad: a detector must remember what it heard, so its state matters
SECONDS_PER_SEGMENT = (0.4, 1.6)


def _background(rng: np.random.Generator, n: int) -> np.ndarray:
    kind = rng.integers(0, 5)
    white = rng.standard_normal(n)
    if kind == 1:  # pink-ish: integrated white noise, high-passed
        noise = np.cumsum(white)
        noise -= np.convolve(noise, np.ones(64) / 64, mode="same")
    elif kind == 2:  # brown
        noise = np.cumsum(white)
        noise -= noise.mean()
    elif kind == 3:  # mains hum and its harmonics
        t = np.arange(n) / RATE
        noise = sum(np.sin(2 * np.pi * 50 * k * t + rng.uniform(0, 6.3)) / k for k in range(1, 6)) + 0.1 * white
    elif kind == 4:  # a steady tone
        t = np.arange(n) / RATE
        noise = np.sin(2 * np.pi * rng.uniform(400, 3000) * t) + 0.05 * white
    else:
        noise = white
    return noise / (np.abs(noise).max() + 1e-9)


def _voiced(rng: np.random.Generator, n: int) -> np.ndarray:
    t = np.arange(n) / RATE
    f0 = rng.uniform(90, 260) * (1 + 0.1 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * t))
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    formants = [
        rng.uniform(300, 900) * (1 + 0.2 * np.sin(2 * np.pi * rng.uniform(1, 4) * t)),
        rng.uniform(900, 2500) * (1 + 0.15 * np.sin(2 * np.pi * rng.uniform(1, 4) * t)),
    ]
    wave = np.zeros(n)
    for k in range(1, 30):
        freq = k * f0
        gain = sum(np.exp(-(((freq - f) / 120.0) ** 2)) for f in formants) + 0.02
        wave += np.where(freq < RATE / 2, gain * np.sin(k * phase), 0.0)
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * rng.uniform(3, 6) * t + rng.uniform(0, 6.3))
    return wave * envelope / (np.abs(wave).max() + 1e-9)


def synthesize(seed: int, chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """`chunks` chunks of audio (float32, [chunks * CHUNK]) and each chunk's label: 1 where over half of it is
    speech, or speech ended less than HANGOVER chunks before it."""
    rng = np.random.default_rng(seed)
    n = chunks * CHUNK
    audio = _background(rng, n) * rng.uniform(0.005, 0.1)
    speech = np.zeros(n, dtype=bool)
    at = int(rng.uniform(0, 0.5) * RATE)
    while at < n:
        length = int(rng.uniform(*SECONDS_PER_SEGMENT) * RATE)
        if rng.random() < 0.5:
            end = min(n, at + length)
            level = rng.uniform(0.1, 0.8)
            audio[at:end] += level * _voiced(rng, end - at)
            speech[at:end] = True
        at += length
    audio *= rng.uniform(0.3, 1.0) / max(1.0, np.abs(audio).max())
    voiced = speech.reshape(chunks, CHUNK).mean(axis=1) > 0.5
    labels = voiced.copy()
    for lag in range(1, HANGOVER + 1):
        labels[lag:] |= voiced[:-lag]
    return audio.astype(np.float32), labels.astype(np.float32)


def golden() -> np.ndarray:
    """The golden stream a build replays (100 chunks, 3.2 s): outputs against torch are compared over it. Its seed
    gives speech, silence and speech again (55 % speech), so the hangover after speech, where the state decides, is
    in it."""
    return synthesize(seed=20_261_130, chunks=100)[0]


HELDOUT_SEEDS = range(9_000, 9_006)
HELDOUT_CHUNKS = 100
