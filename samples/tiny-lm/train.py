"""Train TinyLM on the Python documentation shipped with CPython; write weights.npz and data/*.txt.

The text is pydoc_data.topics (plain ASCII prose and code samples), split by topic: the held-out
topics are never trained on. Deterministic (seed 0); about 10 minutes on 2 CPU cores.

    python samples/tiny-lm/train.py
"""

import math
import time
from pathlib import Path

import numpy as np
import torch
from model import CONTEXT, WEIGHTS, TinyLM

HERE = Path(__file__).parent
STEPS = 1500
BATCH = 32


def split_text() -> tuple[bytes, bytes]:
    from pydoc_data.topics import topics

    keys = sorted(topics)
    held = set(keys[::10])  # every tenth topic is held out
    train = "\n".join(topics[k] for k in keys if k not in held).encode("ascii", "replace")
    heldout = "\n".join(topics[k] for k in keys if k in held).encode("ascii", "replace")
    return train, heldout


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    train, heldout = split_text()
    (HERE / "data").mkdir(exist_ok=True)
    (HERE / "data" / "heldout.txt").write_bytes(heldout[: 64 * CONTEXT])
    (HERE / "data" / "calibration.txt").write_bytes(train[: 64 * CONTEXT])
    data = torch.from_numpy(np.frombuffer(train, dtype=np.uint8).astype(np.int64))
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 100) * 0.5 * (1 + math.cos(math.pi * s / STEPS))
    )
    rng = np.random.default_rng(0)
    start = time.time()
    for step in range(STEPS):
        idx = torch.from_numpy(rng.integers(0, len(data) - CONTEXT - 1, BATCH))
        batch = torch.stack([data[i : i + CONTEXT + 1] for i in idx])
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 100 == 99:
            print(
                f"step {step + 1}: loss {loss.item():.3f} (ppl {math.exp(loss.item()):.2f}), {time.time() - start:.0f} s",
                flush=True,
            )
    model.eval()
    np.savez(WEIGHTS, **{k: v.detach().numpy().astype(np.float16) for k, v in model.state_dict().items()})
    print(f"wrote {WEIGHTS.name} ({WEIGHTS.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
