"""tests/test_stream.py: samples/speech-vad with an LSTM in place of its GRU — a CNN+LSTM VAD, which carries three
states between calls: the last 256 audio samples, and the LSTM's hidden and cell states. Trained by train.py
beside it on the sample's synthetic audio (samples/speech-vad/audio.py).

    audio [1, 512], context [1, 256], h [1, 1, 48], c [1, 1, 48]
        -> probability [1, 1], context_out [1, 256], h_out [1, 1, 48], c_out [1, 1, 48]
"""

from pathlib import Path

import numpy as np
import torch
from torch import nn

WEIGHTS = Path(__file__).with_name("weights.npz")
CONTEXT = 256
HIDDEN = 48


class StreamingLstmVAD(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frontend = nn.Sequential(
            nn.Conv1d(1, 24, kernel_size=64, stride=32),
            nn.ReLU(),  # 768 samples -> 23 frames
            nn.Conv1d(24, 32, kernel_size=3, stride=2),
            nn.ReLU(),  # -> 11 frames
        )
        self.lstm = nn.LSTM(32, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, audio, context, h, c):
        window = torch.cat([context, audio], dim=1)  # [1, 768]
        frames = self.frontend(window.unsqueeze(1)).transpose(1, 2)  # [1, 11, 32]
        steps, (h_out, c_out) = self.lstm(frames, (h, c))
        probability = torch.sigmoid(self.head(steps[:, -1]))
        return probability, window[:, -CONTEXT:], h_out, c_out


def build() -> StreamingLstmVAD:
    """The trained model; weights are plain arrays (no pickle), written by train.py."""
    model = StreamingLstmVAD()
    with np.load(WEIGHTS, allow_pickle=False) as weights:
        model.load_state_dict({name: torch.from_numpy(weights[name]) for name in weights.files})
    return model.eval()
