"""A streaming voice-activity detector: 32 ms of 16 kHz audio in, the probability that it is speech out, with
the state a streaming deployment carries between calls (as real VADs export, e.g. Silero's): the last 256
samples of audio, so the convolutions see across the chunk boundary, and the GRU's hidden state.

    audio [1, 512], context [1, 256], h [1, 1, 48] -> probability [1, 1], context_out [1, 256], h_out [1, 1, 48]

Front end: two strided Conv1d layers over context + audio (a learned filterbank), then a GRU over the frames and
a linear head on its last step. Trained by train.py on synthetic speech and noise (audio.py).
"""

from pathlib import Path

import numpy as np
import torch
from torch import nn

WEIGHTS = Path(__file__).with_name("weights.npz")
CONTEXT = 256
HIDDEN = 48


class StreamingVAD(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frontend = nn.Sequential(
            nn.Conv1d(1, 24, kernel_size=64, stride=32),
            nn.ReLU(),  # 768 samples -> 23 frames
            nn.Conv1d(24, 32, kernel_size=3, stride=2),
            nn.ReLU(),  # -> 11 frames
        )
        self.gru = nn.GRU(32, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, audio, context, h):
        window = torch.cat([context, audio], dim=1)  # [1, 768]
        frames = self.frontend(window.unsqueeze(1)).transpose(1, 2)  # [1, 11, 32]
        steps, h_out = self.gru(frames, h)
        probability = torch.sigmoid(self.head(steps[:, -1]))
        return probability, window[:, -CONTEXT:], h_out


def build() -> StreamingVAD:
    """The trained model; weights are plain arrays (no pickle), written by train.py."""
    model = StreamingVAD()
    with np.load(WEIGHTS, allow_pickle=False) as weights:
        model.load_state_dict({name: torch.from_numpy(weights[name]) for name in weights.files})
    return model.eval()
