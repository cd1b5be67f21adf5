"""A small decoder-only transformer over bytes: causal attention, RMSNorm, learned positions, SwiGLU MLP.

Trained by train.py on the Python documentation that ships with CPython; weights.npz holds the result.
"""

from pathlib import Path

import numpy as np
import torch
from torch import nn

WEIGHTS = Path(__file__).with_name("weights.npz")
VOCAB = 256      # bytes
CONTEXT = 128
WIDTH = 192
HEADS = 6
LAYERS = 4
HIDDEN = 512     # SwiGLU width


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(WIDTH)
        self.q_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.k_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.v_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.o_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.mlp_norm = RMSNorm(WIDTH)
        self.gate_proj = nn.Linear(WIDTH, HIDDEN, bias=False)
        self.up_proj = nn.Linear(WIDTH, HIDDEN, bias=False)
        self.down_proj = nn.Linear(HIDDEN, WIDTH, bias=False)
        self.register_buffer("causal", torch.tril(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q, k, v = (p(h).view(b, t, HEADS, WIDTH // HEADS).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = (q @ k.transpose(-2, -1)) * (WIDTH // HEADS) ** -0.5
        scores = scores.masked_fill(~self.causal[:t, :t], float("-inf"))
        attn = torch.softmax(scores, dim=-1) @ v
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, t, WIDTH))
        h = self.mlp_norm(x)
        return x + self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) + self.positions(torch.arange(input_ids.shape[1], device=input_ids.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def build() -> TinyLM:
    """The trained model. Weights are stored as float16 arrays (no pickle) and computed in float32."""
    model = TinyLM()
    with np.load(WEIGHTS, allow_pickle=False) as weights:
        model.load_state_dict({name: torch.from_numpy(weights[name].astype(np.float32)) for name in weights.files})
    return model.eval()
