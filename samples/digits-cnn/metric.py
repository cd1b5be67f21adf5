"""Top-1 accuracy on the held-out split, one image at a time (the build's batch size)."""

from pathlib import Path

import numpy as np

HELDOUT = Path(__file__).with_name("data") / "heldout.npz"


def top1(predict) -> float:
    with np.load(HELDOUT, allow_pickle=False) as data:
        images, labels = data["image"], data["label"]
    correct = 0
    for image, label in zip(images, labels, strict=True):
        logits = predict({"image": image[None]})["logits"]
        correct += int(np.argmax(logits) == label)
    return correct / len(labels)
