"""Log-mel features of synthetic speech, as Whisper's own feature extractor computes them (transformers'
WhisperFeatureExtractor: 16 kHz audio, 25 ms windows every 10 ms, 80 mel bins, log10 clipped 8 below the clip's
peak, scaled), for clips of 4 to 12 s. Speech here is voiced sound: syllables on a wandering pitch shaped by two
moving formants, with pauses between words, over quiet noise. Seeded: the same clips every time."""

from __future__ import annotations

import numpy as np

RATE = 16_000


def _syllable(rng: np.random.Generator, n: int) -> np.ndarray:
    t = np.arange(n) / RATE
    f0 = rng.uniform(95, 240) * (1 + 0.08 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * t))
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    formants = [rng.uniform(300, 900), rng.uniform(900, 2500)]
    wave = np.zeros(n)
    for k in range(1, 30):
        freq = k * f0
        gain = sum(np.exp(-(((freq - f) / 120.0) ** 2)) for f in formants) + 0.02
        wave += np.where(freq < RATE / 2, gain * np.sin(k * phase), 0.0)
    return wave * np.hanning(n) / (np.abs(wave).max() + 1e-9)


def speech(seed: int, seconds: float) -> np.ndarray:
    """`seconds` of words (2 to 5 syllables of 120 to 280 ms) and pauses, at 16 kHz."""
    rng = np.random.default_rng(seed)
    total = int(seconds * RATE)
    audio = 0.003 * rng.standard_normal(total)
    at = int(rng.uniform(0.1, 0.4) * RATE)
    while at < total:
        for _ in range(rng.integers(2, 6)):
            n = int(rng.uniform(0.12, 0.28) * RATE)
            if at + n > total:
                break
            audio[at : at + n] += 0.3 * _syllable(rng, n)
            at += n
        at += int(rng.uniform(0.15, 0.6) * RATE)
    return audio.astype(np.float32)


def features(audio: np.ndarray) -> np.ndarray:
    """Whisper's log-mel features [80, frames] of the audio, not padded: 100 frames a second, and the frame whose
    window straddles the audio's end."""
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(feature_size=80, sampling_rate=RATE)
    frames = len(audio) // extractor.hop_length + 1
    out = extractor(audio, sampling_rate=RATE, return_tensors="np", padding="max_length")
    return out["input_features"][0, :, :frames].astype(np.float32)


def clips():
    """The golden clips: speech of 4 to 12 s, one after another (tapeout pads each to 30 s with its floor)."""
    for seed in range(1000):
        seconds = float(np.random.default_rng(seed).uniform(4, 12))
        yield features(speech(seed, seconds))
