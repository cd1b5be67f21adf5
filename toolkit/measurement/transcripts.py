"""A transcribe project's transcripts as words: what is said in each golden clip ([workload] transcripts, checked
before any work) and the model directory's tokenizer that turns greedy tokens into text, for the word error rate
(measurement/transcription.word_errors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tapeout.core.errors import BadInput
from tapeout.core.schemas import Project


class Texts:
    """Greedy token rows as text, by the model directory's tokenizer (loaded on first use): each row up to its end
    token, special tokens left out."""

    def __init__(self, directory: Path):
        self.directory, self._tokenizer = directory, None

    def __call__(self, rows: np.ndarray, eos: int) -> list[str]:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.directory))
        out = []
        for row in np.asarray(rows):
            ends = np.flatnonzero(row == eos)
            kept = row[: ends[0]] if ends.size else row
            out.append(self._tokenizer.decode(kept.tolist(), skip_special_tokens=True).strip())
        return out


def read(project: Project, count: int) -> list[str]:
    """What is said in the first `count` golden clips, from [workload] transcripts, checked."""
    from tapeout.core.user_code import resolve_callable, user_code

    ref = project.workload.transcripts
    source = resolve_callable(ref, project.root, "[workload] transcripts")
    with user_code(f"[workload] transcripts {ref}", project.root):
        said = list(source())[:count]
    bad = next((i for i, t in enumerate(said) if not isinstance(t, str)), None)
    if bad is not None:
        raise BadInput(
            f"[workload] transcripts {ref}: item {bad} is {type(said[bad]).__name__}, not a string",
            fix="return what is said in each golden clip as a string",
        )
    if said and not any(t.split() for t in said):
        raise BadInput(
            f"[workload] transcripts {ref} hold no words: a word error rate counts errors over the words said",
            fix="return what is said in each golden clip",
        )
    if len(said) < count:
        raise BadInput(
            f"[workload] transcripts {ref} gave {len(said)} texts for {count} golden clips",
            fix=f"return one string a clip, at least {count} (agreement_clips), in the order of clips",
        )
    return said


def tokenizer_directory(module: Any, ref: str) -> Path:
    """The Hugging Face directory whose tokenizer turns tokens into words; a module without one is refused."""
    directory = getattr(module, "directory", None)
    if directory is None or not any(
        (Path(directory) / f).is_file() for f in ("tokenizer.json", "vocab.json", "tokenizer_config.json")
    ):
        raise BadInput(
            f"[workload] transcripts {ref} are compared as words, and the model has no tokenizer to turn its tokens "
            "into words",
            fix="point [model] source at a Hugging Face Whisper directory with its tokenizer files, or drop "
            "transcripts (greedy agreement needs none)",
        )
    return Path(directory)
