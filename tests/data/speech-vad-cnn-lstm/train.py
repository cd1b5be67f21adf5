"""Train the conv-heavy CNN+LSTM VAD on samples/speech-vad's synthetic audio, the state carried across chunks.
Writes weights.npz beside this file (plain arrays). A few minutes on two CPU cores: `python train.py`."""

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.append(str(Path(__file__).resolve().parents[3] / "samples" / "speech-vad"))  # its audio.py; model.py is ours
import audio
from model import CONTEXT, HIDDEN, ConvHeavyVAD

STREAMS, CHUNKS, EPOCHS = 256, 64, 30


def streams(seeds) -> tuple[torch.Tensor, torch.Tensor]:
    made = [audio.synthesize(seed, CHUNKS) for seed in seeds]
    signal = torch.from_numpy(np.stack([s for s, _ in made]).reshape(len(made), CHUNKS, audio.CHUNK))
    return signal, torch.from_numpy(np.stack([labels for _, labels in made]))


def run(model, signal):
    batch = signal.shape[0]
    context = torch.zeros(batch, CONTEXT)
    h, c = torch.zeros(1, batch, HIDDEN), torch.zeros(1, batch, HIDDEN)
    probs = []
    for t in range(signal.shape[1]):
        p, context, h, c = model(signal[:, t], context, h, c)
        probs.append(p[:, 0])
    return torch.stack(probs, dim=1)


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = ConvHeavyVAD()
    train_x, train_y = streams(range(STREAMS))
    test_x, test_y = streams(audio.HELDOUT_SEEDS)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.BCELoss()
    for epoch in range(EPOCHS):
        order = torch.randperm(STREAMS)
        for i in range(0, STREAMS, 32):
            idx = order[i : i + 32]
            loss = loss_fn(run(model, train_x[idx]), train_y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            accuracy = ((run(model, test_x) > 0.5).float() == test_y).float().mean().item()
        print(f"epoch {epoch + 1}: loss {loss.item():.4f}, held-out chunk accuracy {accuracy:.3f}", flush=True)
    np.savez(
        Path(__file__).with_name("weights.npz"),
        **{name: value.detach().numpy() for name, value in model.state_dict().items()},
    )


if __name__ == "__main__":
    main()
