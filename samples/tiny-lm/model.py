"""A small decoder-only transformer over bytes: causal attention, RMSNorm, learned positions, SwiGLU MLP.

Trained by train.py on the Python documentation that ships with CPython; weights.npz holds the result.
It follows tapeout's generation signature (docs/workloads.md): `forward(input_ids)` is the plain forward over
the whole sequence; `forward(input_ids, *past)` continues from a KV cache and returns (logits, *present).
"""

from pathlib import Path

import numpy as np
import torch
from torch import nn

WEIGHTS = Path(__file__).with_name("weights.npz")
VOCAB = 256  # bytes
CONTEXT = 128
WIDTH = 192
HEADS = 6
LAYERS = 4
HIDDEN = 512  # SwiGLU width


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

    def forward(self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, keep: torch.Tensor | None = None):
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q, k, v = (
            p(h).view(b, t, HEADS, WIDTH // HEADS).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        start = past_k.shape[2]
        # query i sits at position start + i and sees keys 0 .. start + i
        visible = torch.arange(k.shape[2])[None, :] <= torch.arange(start, start + t)[:, None]
        if keep is not None:  # and no key a padding mask drops
            visible = visible & keep
        scores = (q @ k.transpose(-2, -1)) * (WIDTH // HEADS) ** -0.5
        attn = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, t, WIDTH))
        h = self.mlp_norm(x)
        return x + self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h)), k, v


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # the cache layout tapeout's generate workload exports (docs/workloads.md)
        self.generation = {
            "layers": LAYERS,
            "kv_heads": HEADS,
            "head_dim": WIDTH // HEADS,
            "vocab": VOCAB,
            "max_context": CONTEXT,
        }
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        *past: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ):
        """The generation signature (docs/workloads.md); the mask and the positions are given only by a runtime that
        pads prompts to static shapes (OpenVINO's NPU pipeline), else positions follow the cache's length."""
        b, t = input_ids.shape
        cached = bool(past)
        if not cached:
            past = tuple(torch.zeros(b, HEADS, 0, WIDTH // HEADS) for _ in range(2 * LAYERS))
        start = past[0].shape[2]
        if position_ids is None:
            position_ids = torch.arange(start, start + t, device=input_ids.device)[None]
        x = self.embed(input_ids) + self.positions(position_ids)
        keep = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        present = []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, past[2 * i], past[2 * i + 1], keep)
            present += [k, v]
        logits = self.lm_head(self.norm(x))
        return (logits, *present) if cached else logits


def build() -> TinyLM:
    """The trained model. Weights are stored as float16 arrays (no pickle) and computed in float32."""
    model = TinyLM()
    with np.load(WEIGHTS, allow_pickle=False) as weights:
        model.load_state_dict({name: torch.from_numpy(weights[name].astype(np.float32)) for name in weights.files})
    return model.eval()
