"""Write data/sentences.txt (300 real English sentences) and data/reference.npy (FP32 embeddings).

The sentences come from the Python documentation that ships with CPython (pydoc_data.topics):
real prose, available offline. Run once; both files are committed.

    python samples/minilm/make_data.py
"""

import re
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
    main()
