"""tests/test_stream.py: samples/speech-vad (see its model.py for the model, its state and its training) as first
trained, with a sign·log1p (mu-law-like) compression in front of its convolutions. On the QNN HTP emulator at A16W8
that front end loses the audio when the state is zero, and the carried GRU state locks into silence: the streamed
probability is off by 0.99 while a CPU-EP evaluation of the same QDQ model sees no accuracy loss. Kept, frozen
with its weights, to prove the stream budget catches it."""

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
        compressed = torch.log1p(window.abs() * 50) * torch.sign(window)  # mu-law-like: loud and quiet
        frames = self.frontend(compressed.unsqueeze(1)).transpose(1, 2)  # [1, 11, 32]
        steps, h_out = self.gru(frames, h)
        probability = torch.sigmoid(self.head(steps[:, -1]))
        return probability, window[:, -CONTEXT:], h_out


def build() -> StreamingVAD:
    """The trained model; weights are plain arrays (no pickle), written by train.py."""
    model = StreamingVAD()
    with np.load(WEIGHTS, allow_pickle=False) as weights:
        model.load_state_dict({name: torch.from_numpy(weights[name]) for name in weights.files})
    return model.eval()
