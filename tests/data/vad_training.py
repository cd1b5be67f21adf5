"""The training loop the CNN+LSTM VADs under tests/data share (speech-vad-lstm, speech-vad-cnn-lstm): samples/
speech-vad's synthetic audio, the audio context and the LSTM's h and c carried across chunks as deployed. Each model's
train.py hands it its model; weights are written beside that script as plain arrays."""

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.append(str(Path(__file__).resolve().parents[2] / "samples" / "speech-vad"))  # its audio.py
import audio

STREAMS, CHUNKS, EPOCHS = 256, 64, 30


def streams(seeds) -> tuple[torch.Tensor, torch.Tensor]:
    made = [audio.synthesize(seed, CHUNKS) for seed in seeds]
    signal = torch.from_numpy(np.stack([s for s, _ in made]).reshape(len(made), CHUNKS, audio.CHUNK))
    return signal, torch.from_numpy(np.stack([labels for _, labels in made]))


def run(model, signal, context_size: int, hidden: int):
    batch = signal.shape[0]
    context = torch.zeros(batch, context_size)
    h, c = torch.zeros(1, batch, hidden), torch.zeros(1, batch, hidden)
    probs = []
    for t in range(signal.shape[1]):
        p, context, h, c = model(signal[:, t], context, h, c)
        probs.append(p[:, 0])
    return torch.stack(probs, dim=1)


def train(make_model, context_size: int, hidden: int, weights: Path) -> None:
    """`make_model()` builds the model, seeded (0) as the weights kept beside each train.py were."""
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = make_model()
    train_x, train_y = streams(range(STREAMS))
    test_x, test_y = streams(audio.HELDOUT_SEEDS)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.BCELoss()
    for epoch in range(EPOCHS):
        order = torch.randperm(STREAMS)
        for i in range(0, STREAMS, 32):
            idx = order[i : i + 32]
            loss = loss_fn(run(model, train_x[idx], context_size, hidden), train_y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            accuracy = ((run(model, test_x, context_size, hidden) > 0.5).float() == test_y).float().mean().item()
        print(f"epoch {epoch + 1}: loss {loss.item():.4f}, held-out chunk accuracy {accuracy:.3f}", flush=True)
    np.savez(weights, **{name: value.detach().numpy() for name, value in model.state_dict().items()})
