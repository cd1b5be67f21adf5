"""Train DigitsCNN on scikit-learn's digits; write weights.npz and the data files. Deterministic (seed 0).

python samples/digits-cnn/train.py
"""

from pathlib import Path

import numpy as np
import torch
from model import WEIGHTS, DigitsCNN
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

HERE = Path(__file__).parent


def main() -> None:
    torch.manual_seed(0)
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # pixel values 0..16 → [0, 1]
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(images, labels, test_size=0.2, random_state=0, stratify=labels)

    model = DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    for epoch in range(40):
        model.train()
        order = torch.randperm(len(xt))
        for start in range(0, len(xt), 64):
            idx = order[start : start + 64]
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(xt[idx]), yt[idx])
            loss.backward()
            optimizer.step()
        if epoch % 10 == 9:
            model.eval()
            with torch.no_grad():
                acc = (model(torch.from_numpy(x_test)).argmax(1).numpy() == y_test).mean()
            print(f"epoch {epoch + 1}: loss {loss.item():.4f}, held-out top-1 {acc:.4f}")

    np.savez(WEIGHTS, **{k: v.detach().numpy() for k, v in model.state_dict().items()})
    # Calibration / golden inputs come from the training split; the metric uses the held-out split only.
    # .npz feeds: one array per input, shape (samples, *input shape) = (64, 1, 1, 8, 8).
    np.savez_compressed(HERE / "data" / "calibration.npz", image=x_train[:64, None])
    np.savez_compressed(HERE / "data" / "heldout.npz", image=x_test, label=y_test)
    print(f"wrote {WEIGHTS.name} ({WEIGHTS.stat().st_size / 1024:.0f} KiB) and data/*.npz")


if __name__ == "__main__":
    main()
