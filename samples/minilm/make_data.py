"""Write data/sentences.txt (300 real English sentences), data/reference.npy (FP32 embeddings) and
data/recovery.txt (unlabelled text a pruned model is distilled on).

The sentences come from the Python documentation that ships with CPython (pydoc_data.topics):
real prose, available offline. The recovery text is more of the same documentation (the topics'
other sentences and the standard library's docstrings), with every sentence the metric scores left
out. Run once; the files are committed.

    python samples/minilm/make_data.py              # all three
    python samples/minilm/make_data.py --recovery   # data/recovery.txt only
"""

import importlib
import inspect
import re
import sys
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def extract_sentences(count: int = 300) -> list[str]:
    from pydoc_data.topics import topics

    seen, picked = set(), []
    for key in sorted(topics):
        text = re.sub(r"\s+", " ", topics[key])
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z])", text):
            sentence = sentence.strip()
            # prose only: no code, no reST markup, a sensible length
            if not 50 <= len(sentence) <= 220 or re.search(r"[*`_=<>{}\[\]|#\\]|::|\.\.\.|\(\)", sentence):
                continue
            if not sentence.endswith(".") or sentence.lower() in seen:
                continue
            seen.add(sentence.lower())
            picked.append(sentence)
    step = max(1, len(picked) // count)  # spread over all topics, not the first few
    return picked[::step][:count]


RECOVERY_LINES = 4000
# standard-library modules whose docstrings add prose in the sentences' register (fixed, so reruns agree)
DOCUMENTED = [
    "abc",
    "argparse",
    "array",
    "ast",
    "asyncio",
    "bisect",
    "calendar",
    "cmath",
    "codecs",
    "collections",
    "concurrent.futures",
    "configparser",
    "contextlib",
    "copy",
    "csv",
    "ctypes",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "dis",
    "doctest",
    "email",
    "enum",
    "fractions",
    "functools",
    "gc",
    "getopt",
    "gettext",
    "glob",
    "hashlib",
    "heapq",
    "hmac",
    "http.client",
    "importlib",
    "inspect",
    "io",
    "itertools",
    "json",
    "locale",
    "logging",
    "math",
    "mmap",
    "multiprocessing",
    "numbers",
    "optparse",
    "os",
    "pathlib",
    "pdb",
    "pickle",
    "queue",
    "random",
    "re",
    "sched",
    "secrets",
    "select",
    "selectors",
    "shutil",
    "signal",
    "socket",
    "sqlite3",
    "ssl",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "tokenize",
    "trace",
    "tracemalloc",
    "typing",
    "unittest",
    "urllib.request",
    "weakref",
    "xml.etree.ElementTree",
    "zipfile",
    "zipimport",
]


def extract_recovery(scored: list[str], count: int = RECOVERY_LINES) -> list[str]:
    """Unlabelled text for distillation: the topics' other sentences and docstring paragraphs, none of which
    contains, or is contained in, a sentence in `scored`."""
    from pydoc_data.topics import topics

    warnings.simplefilter("ignore")  # deprecated modules warn on import
    texts = []
    for key in sorted(topics):
        texts += re.split(r"(?<=[.!?])\s+(?=[A-Z])", re.sub(r"\s+", " ", topics[key]))
    for name in DOCUMENTED:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for obj in [module] + [getattr(module, n, None) for n in sorted(dir(module)) if not n.startswith("_")]:
            doc = inspect.getdoc(obj) if obj is not None else None
            texts += (doc or "").split("\n\n")
    held = [s.lower() for s in scored]
    seen, picked = set(), []
    for text in texts:
        text = re.sub(r"\s+", " ", text).strip()
        key = text.lower()
        if not 30 <= len(text) <= 500 or text.startswith(">>>") or key in seen:
            continue
        if any(h in key or key in h for h in held):
            continue
        seen.add(key)
        picked.append(text)
    step = max(1, len(picked) // count)
    return picked[::step][:count]


def write_recovery() -> None:
    scored = (HERE / "data" / "sentences.txt").read_text(encoding="utf-8").splitlines()
    lines = extract_recovery(scored)
    (HERE / "data" / "recovery.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(lines)} lines of recovery text")


def main() -> None:
    import torch
    from model import model_dir
    from text import encode, mean_pool
    from transformers import AutoModel

    texts = extract_sentences()
    (HERE / "data" / "sentences.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    model = AutoModel.from_pretrained(str(model_dir()), local_files_only=True).eval()
    rows = []
    with torch.inference_mode():
        for feeds in encode(texts):
            hidden = model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).last_hidden_state.numpy()
            rows.append(mean_pool(hidden, feeds["attention_mask"])[0])
    np.save(HERE / "data" / "reference.npy", np.stack(rows).astype(np.float32))
    print(f"{len(texts)} sentences, reference embeddings {np.stack(rows).shape}")


if __name__ == "__main__":
    if "--recovery" not in sys.argv[1:]:
        main()
    write_recovery()
