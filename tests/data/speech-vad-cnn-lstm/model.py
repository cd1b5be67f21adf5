"""tests/test_stream.py: a CNN+LSTM VAD whose convolutions hold most of the MACs (about 84 %), so the graph analysis
classes it `cnn`, not `speech-recurrent`, as published VADs are classed. It carries the last 256 samples of audio
and the LSTM's h and c between calls. Trained by train.py beside it on samples/speech-vad's synthetic audio.

    audio [1, 512], context [1, 256], h [1, 1, 16], c [1, 1, 16]
        -> probability [1, 1], context_out [1, 256], h_out [1, 1, 16], c_out [1, 1, 16]
"""

from pathlib import Path

import numpy as np
import torch
from torch import nn

WEIGHTS = Path(__file__).with_name("weights.npz")
CONTEXT = 256
HIDDEN = 16


class ConvHeavyVAD(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frontend = nn.Sequential(
            nn.Conv1d(1, 48, kernel_size=64, stride=32),
            nn.ReLU(),  # 768 samples -> 23 frames
            nn.Conv1d(48, 96, kernel_size=3, stride=2),
            nn.ReLU(),  # -> 11 frames
            nn.Conv1d(96, 64, kernel_size=1),
            nn.ReLU(),
        )
        self.lstm = nn.LSTM(64, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, audio, context, h, c):
        window = torch.cat([context, audio], dim=1)  # [1, 768]
        frames = self.frontend(window.unsqueeze(1)).transpose(1, 2)  # [1, 11, 64]
        steps, (h_out, c_out) = self.lstm(frames, (h, c))
        probability = torch.sigmoid(self.head(steps[:, -1]))
        return probability, window[:, -CONTEXT:], h_out, c_out


def build() -> ConvHeavyVAD:
    """The trained model; weights are plain arrays (no pickle), written by train.py."""
    model = ConvHeavyVAD()
    with np.load(WEIGHTS, allow_pickle=False) as weights:
        model.load_state_dict({name: torch.from_numpy(weights[name]) for name in weights.files})
    return model.eval()
