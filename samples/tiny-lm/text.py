"""The sample's text: bytes of the Python documentation, cut into 128-byte windows."""

from pathlib import Path

import numpy as np

DATA = Path(__file__).with_name("data")
CONTEXT = 128


def windows(name: str, count: int | None = None) -> np.ndarray:
    """Non-overlapping CONTEXT-byte windows of data/<name>.txt, shape (windows, CONTEXT), int64."""
    raw = np.frombuffer((DATA / f"{name}.txt").read_bytes(), dtype=np.uint8).astype(np.int64)
    rows = raw[: len(raw) // CONTEXT * CONTEXT].reshape(-1, CONTEXT)
    return rows if count is None else rows[:count]


def calibration():
    """Calibration / golden inputs: windows of text the model was trained on (never the held-out text)."""
    for row in windows("calibration"):
        yield {"input_ids": row[None]}


def prompts():
    """Golden prompts for greedy agreement: held-out text, never trained on."""
    return list(windows("heldout"))
