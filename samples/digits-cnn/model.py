"""A small CNN for the 8×8 handwritten digits that ship with scikit-learn."""

from pathlib import Path

import numpy as np
import torch
from torch import nn

WEIGHTS = Path(__file__).with_name("weights.npz")


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(image))


def build() -> DigitsCNN:
    """The trained model; weights are plain arrays (no pickle), written by train.py."""
    model = DigitsCNN()
    with np.load(WEIGHTS, allow_pickle=False) as weights:
        model.load_state_dict({name: torch.from_numpy(weights[name]) for name in weights.files})
    return model.eval()
