"""The sample's text set and tokenization: batch 1, padded/truncated to 128 tokens, as the build measures."""

from pathlib import Path

import numpy as np
from model import model_dir

SENTENCES = Path(__file__).with_name("data") / "sentences.txt"
RECOVERY = Path(__file__).with_name("data") / "recovery.txt"  # unlabelled, none of the metric's sentences in it
SEQUENCE = 128
CALIBRATION = 64  # the first 64 sentences calibrate (and recover a pruned model); the metric uses the rest


def sentences() -> list[str]:
    return [line for line in SENTENCES.read_text(encoding="utf-8").splitlines() if line.strip()]


def tokenizer():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.enable_truncation(SEQUENCE)
    tok.enable_padding(length=SEQUENCE)
    return tok


def encode(texts: list[str]) -> list[dict[str, np.ndarray]]:
    feeds = []
    for enc in tokenizer().encode_batch(texts):
        feeds.append(
            {
                "input_ids": np.asarray([enc.ids], dtype=np.int64),
                "attention_mask": np.asarray([enc.attention_mask], dtype=np.int64),
                "token_type_ids": np.asarray([enc.type_ids], dtype=np.int64),
            }
        )
    return feeds


def calibration():
    """Real tokenized sentences: calibration, golden inputs, pruning recovery. Never the metric's."""
    yield from encode(sentences()[:CALIBRATION])


def recovery():
    """What a pruned model is distilled on ([pruning] data): the calibration sentences, then 4000 lines of
    more Python documentation (make_data.py). Never the metric's sentences."""
    texts = sentences()[:CALIBRATION] + [t for t in RECOVERY.read_text(encoding="utf-8").splitlines() if t.strip()]
    yield from encode(texts)


def held_out() -> list[str]:
    """The sentences the metric scores: none of them is seen by calibration or recovery."""
    return sentences()[CALIBRATION:]


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask[..., None].astype(np.float64)
    return (hidden.astype(np.float64) * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
