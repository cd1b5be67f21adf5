"""The model zoo's kinds at working sizes (1-30 ms on a 2-core CPU) for bench/estimator.py.

The zoo of tests/zoo_models.py is sized for the test suite: 20-100 µs a run, where a runtime's
per-call overhead and the process-to-process spread (up to ±50 %) are most of what is measured.
These are the same architectures at the sizes people deploy at the edge, where the ops' own cost
shows. Seeded random weights; a bench project copies this file and zoo_models.py beside its
tapeout.toml and names a builder here as its `[model] source`.
"""

from __future__ import annotations

import torch
from zoo_models import KeywordSpotter, LineRecognizer, TinyUNet, _seeded, hf_model, sized_whisper_encoder


@_seeded
def gpt2_m():
    return hf_model(
        "GPT2LMHeadModel",
        "GPT2Config",
        vocab_size=8192,
        n_embd=256,
        n_layer=4,
        n_head=4,
        n_positions=256,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )


@_seeded
def distilbert_m():
    return hf_model(
        "DistilBertForSequenceClassification",
        "DistilBertConfig",
        vocab_size=8192,
        dim=256,
        n_layers=4,
        n_heads=4,
        hidden_dim=1024,
        num_labels=3,
    )


@_seeded
def vit_m():
    return hf_model(
        "ViTForImageClassification",
        "ViTConfig",
        image_size=160,
        patch_size=16,
        num_channels=3,
        hidden_size=256,
        num_hidden_layers=6,
        num_attention_heads=4,
        intermediate_size=1024,
        num_labels=100,
    )


@_seeded
def resnet_m():
    return hf_model(
        "ResNetForImageClassification",
        "ResNetConfig",
        num_channels=3,
        embedding_size=64,
        hidden_sizes=[64, 128, 256, 512],
        depths=[2, 2, 2, 2],
        layer_type="basic",
        num_labels=100,
    )


@_seeded
def whisper_m():
    return sized_whisper_encoder(mels=80, width=256, layers=4, heads=4, ffn=1024, positions=250)


@_seeded
def unet_m():
    return TinyUNet(width=64)


@_seeded
def lstm_m():
    return KeywordSpotter(features=40, hidden=256)


@_seeded
def cnn_lstm_m():
    return LineRecognizer(classes=80)


TOKENS = [("input_ids", [1, 128], "int64", [0, 8191])]
# name → (builder, inputs, outputs)
CASES = {
    "gpt2-m": ("gpt2_m", TOKENS, ["logits"]),
    "distilbert-m": ("distilbert_m", TOKENS, ["logits"]),
    "vit-m": ("vit_m", [("pixel_values", [1, 3, 160, 160], "float32", [0.0, 1.0])], ["logits"]),
    "resnet-m": ("resnet_m", [("pixel_values", [1, 3, 128, 128], "float32", [0.0, 1.0])], ["logits"]),
    "whisper-m": ("whisper_m", [("input_features", [1, 80, 500], "float32", [-1.0, 1.0])], ["last_hidden_state"]),
    "unet-m": (
        "unet_m",
        [("latent", [1, 4, 64, 64], "float32", [-1.0, 1.0]), ("timestep", [1], "float32", [0.0, 999.0])],
        ["noise"],
    ),
    "lstm-m": ("lstm_m", [("frames", [1, 100, 40], "float32", [-1.0, 1.0])], ["logits"]),
    "cnn-lstm-m": ("cnn_lstm_m", [("image", [1, 1, 16, 256], "float32", [0.0, 1.0])], ["logits"]),
}

if __name__ == "__main__":  # the sizes, for the docstring's claim
    for name, (builder, inputs, _) in CASES.items():
        model = globals()[builder]()
        feeds = [torch.randint(0, 8192, s) if d == "int64" else torch.rand(s) for _, s, d, _ in inputs]
        print(name, sum(p.numel() for p in model.parameters()), "parameters")
        with torch.no_grad():
            model(*feeds)
