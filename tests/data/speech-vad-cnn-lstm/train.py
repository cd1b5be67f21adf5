"""Train the conv-heavy CNN+LSTM VAD on samples/speech-vad's synthetic audio, the state carried across chunks as deployed
(tests/data/vad_training.py). Writes weights.npz beside this file (plain arrays). A few minutes on two CPU cores:
`python train.py`."""

import sys
from pathlib import Path

from model import CONTEXT, HIDDEN, ConvHeavyVAD

sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests/data: the shared training loop
from vad_training import train

if __name__ == "__main__":
    train(ConvHeavyVAD, CONTEXT, HIDDEN, Path(__file__).with_name("weights.npz"))
