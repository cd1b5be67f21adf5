"""Small models of the kinds users bring, built from configs with seeded random weights.

transformers ships the model code, so the Hugging Face ones are the real architectures at toy sizes;
the rest are written here in a few lines each (no diffusers wheel on this machine, so the UNet is
ours: conv blocks, a sinusoidal timestep embedding, skip connections). A test copies this file into
a project folder and names a builder as the project's `[model] source` ("zoo_models.py:lstm").
Every builder seeds torch itself: each call returns the same weights, so a metric can rebuild the
model it compares against.
"""

from __future__ import annotations

import json
import math

import numpy as np
import torch
from torch import nn


def _seeded(build):
    def wrapper():
        torch.manual_seed(0)
        return build().eval()

    wrapper.__name__ = build.__name__
    wrapper.__doc__ = build.__doc__
    return wrapper


def hf_model(architecture: str, config_name: str, **config):
    import transformers

    torch.manual_seed(0)
    return getattr(transformers, architecture)(getattr(transformers, config_name)(**config)).eval()


HF_CONFIGS = {
    # directory name → (architecture, config class, config kwargs)
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(vocab_size=128, n_embd=32, n_layer=2, n_head=2, n_positions=64)),
    "llama": (
        "LlamaForCausalLM",
        "LlamaConfig",
        dict(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        ),
    ),
    # the same with a head size of 16, which ORT's fused GroupQueryAttention needs (used by the generate tests)
    "llama16": (
        "LlamaForCausalLM",
        "LlamaConfig",
        dict(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        ),
    ),
    # q/k RMSNorm and an explicit head_dim (used by the generate tests, not the zoo's forward cases)
    "qwen3": (
        "Qwen3ForCausalLM",
        "Qwen3Config",
        dict(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            head_dim=8,
            num_key_value_heads=2,
            max_position_embeddings=64,
        ),
    ),
    # the other decoder families users ship, at toy sizes (the generate tests): Qwen2.5 (biased q/k/v
    # projections), Llama 3.2 (llama3 rotary scaling, tied embeddings), Phi-3 (fused qkv and gate/up
    # projections) and Gemma 3 (q/k norms, scaled embeddings, sliding-window layers between global ones)
    "qwen2": (
        "Qwen2ForCausalLM",
        "Qwen2Config",
        dict(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        ),
    ),
    "llama32": (
        "LlamaForCausalLM",
        "LlamaConfig",
        dict(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            tie_word_embeddings=True,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
    ),
    "phi3": (
        "Phi3ForCausalLM",
        "Phi3Config",
        dict(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            original_max_position_embeddings=64,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    "gemma3": (
        "Gemma3ForCausalLM",
        "Gemma3TextConfig",
        dict(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=64,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
    "distilbert": (
        "DistilBertForSequenceClassification",
        "DistilBertConfig",
        dict(vocab_size=128, dim=32, n_layers=2, n_heads=2, hidden_dim=64, num_labels=3),
    ),
    "vit": (
        "ViTForImageClassification",
        "ViTConfig",
        dict(
            image_size=32,
            patch_size=8,
            num_channels=3,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            num_labels=5,
        ),
    ),
    "resnet": (
        "ResNetForImageClassification",
        "ResNetConfig",
        dict(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=5),
    ),
}


def write_project(project, source: str, inputs, outputs: list[str], extra: str = "") -> None:
    """A tapeout project in `project` (which holds the model's files): tapeout.toml naming `source`,
    the inputs (name, shape, dtype, [low, high]) and outputs, and 16 seeded calibration samples."""
    rng = np.random.default_rng(0)
    toml = f'[model]\nsource = "{source}"\noutputs = {json.dumps(outputs)}\n'
    calibration = {}
    for input_name, shape, dtype, bounds in inputs:
        toml += f'[[inputs]]\nname = "{input_name}"\nshape = {shape}\ndtype = "{dtype}"\nrange = {bounds}\n'
        size = (16, *shape)
        calibration[input_name] = (
            rng.integers(bounds[0], bounds[1] + 1, size)
            if dtype == "int64"
            else rng.uniform(bounds[0], bounds[1], size)
        ).astype(dtype)
    np.savez(project / "calibration.npz", **calibration)
    (project / "tapeout.toml").write_text(toml + '[calibration]\ndata = "calibration.npz"\n' + extra)


def save_hf(name: str, directory) -> None:
    """A Hugging Face model directory (config.json + safetensors) for the named config."""
    architecture, config_name, config = HF_CONFIGS[name]
    hf_model(architecture, config_name, **config).save_pretrained(directory)


@_seeded
def distilbert():
    """The DistilBERT classifier given as a module (model.py returns the transformers model)."""
    architecture, config_name, config = HF_CONFIGS["distilbert"]
    return hf_model(architecture, config_name, **config)


def sized_whisper_encoder(mels: int, width: int, layers: int, heads: int, ffn: int, positions: int):
    """Whisper's audio encoder: two convs over log-mel frames (2 × positions of them), then transformer blocks."""
    from transformers import WhisperConfig, WhisperModel

    config = WhisperConfig(
        num_mel_bins=mels,
        d_model=width,
        encoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_layers=1,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        max_source_positions=positions,
        vocab_size=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    return WhisperModel(config).get_encoder()


@_seeded
def whisper_encoder():
    return sized_whisper_encoder(mels=16, width=32, layers=2, heads=2, ffn=64, positions=32)


@_seeded
def wav2vec2():
    """wav2vec2: a conv feature extractor over the raw waveform, then transformer blocks."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    config = Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(16, 16),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_feat_extract_layers=2,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        vocab_size=32,
    )

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Wav2Vec2Model(config)
            self.config = config

        def forward(self, input_values):
            return self.inner(input_values).last_hidden_state

    return Encoder()


class TinyUNet(nn.Module):
    """Down, middle, up with a skip; the timestep enters as a sinusoidal embedding and a small MLP."""

    def __init__(self, channels: int = 4, width: int = 16) -> None:
        super().__init__()
        self.width = width
        self.time_mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.conv_in = nn.Conv2d(channels, width, 3, padding=1)
        self.down = nn.Sequential(nn.GroupNorm(4, width), nn.SiLU(), nn.Conv2d(width, width, 3, stride=2, padding=1))
        self.mid = nn.Sequential(nn.GroupNorm(4, width), nn.SiLU(), nn.Conv2d(width, width, 3, padding=1))
        self.up = nn.Sequential(nn.Upsample(scale_factor=2.0, mode="nearest"), nn.Conv2d(width, width, 3, padding=1))
        self.conv_out = nn.Conv2d(2 * width, channels, 3, padding=1)

    def forward(self, latent, timestep):
        half = self.width // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
        angles = timestep[:, None] * freqs[None]
        temb = self.time_mlp(torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1))
        x = self.conv_in(latent) + temb[:, :, None, None]
        h = self.mid(self.down(x))
        return self.conv_out(torch.cat([x, self.up(h)], dim=1))


@_seeded
def unet():
    return TinyUNet()


class KeywordSpotter(nn.Module):
    """MFCC frames → LSTM → the last step's class scores (the LSTM does nearly all the work)."""

    def __init__(self, features: int = 20, hidden: int = 64, classes: int = 12) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, frames):
        out, _ = self.lstm(frames)
        return self.head(out[:, -1])


@_seeded
def lstm():
    return KeywordSpotter()


class LineRecognizer(nn.Module):
    """An OCR line model: a conv stack over the image, a bidirectional LSTM over its columns, per-column
    character scores (CTC). The convolutions do most of the work: by MAC share it is a CNN."""

    def __init__(self, classes: int = 20) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d((2, 1)),
            nn.Conv2d(32, 32, 3, padding=1),
            nn.ReLU(),
        )
        self.lstm = nn.LSTM(32 * 4, 32, batch_first=True, bidirectional=True)
        self.head = nn.Linear(64, classes)

    def forward(self, image):  # [B, 1, 16, W]
        columns = self.features(image).permute(0, 3, 1, 2).flatten(2)  # [B, W/2, 128]
        out, _ = self.lstm(columns)
        return self.head(out)


@_seeded
def cnn_lstm():
    return LineRecognizer()


class RateSwitchedVAD(nn.Module):
    """A voice-activity detector whose whole network sits in an If on its scalar sample-rate input."""

    def __init__(self, frame: int = 64) -> None:
        super().__init__()
        self.wide = nn.Sequential(nn.Linear(frame, 64), nn.ReLU(), nn.Linear(64, 1))
        self.narrow = nn.Sequential(nn.Linear(frame, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, frame, sample_rate):
        return torch.cond(
            sample_rate > 12000,
            lambda x: torch.sigmoid(self.wide(x)),
            lambda x: torch.sigmoid(self.narrow(x)),
            (frame,),
        )


@_seeded
def vad():
    return RateSwitchedVAD()


class RateSwitchedConvGRU(nn.Module):
    """A speech VAD as real ones export: a strided Conv1d front-end per sample rate, chosen by an If on the scalar
    sample-rate input, and one GRU and head after it (dynamo cannot put a GRU inside torch.cond)."""

    def __init__(self) -> None:
        super().__init__()
        self.fronts = nn.ModuleList(
            nn.Sequential(nn.Conv1d(1, 16, 8, stride=4), nn.ReLU(), nn.Conv1d(16, 32, 4, stride=2), nn.ReLU())
            for _ in range(2)
        )
        self.gru = nn.GRU(32, 96, batch_first=True)
        self.head = nn.Linear(96, 1)

    def forward(self, audio, sample_rate):
        features = torch.cond(
            sample_rate > 12000,
            lambda a: self.fronts[0](a.unsqueeze(1)),
            lambda a: self.fronts[1](a.unsqueeze(1)),
            (audio,),
        )
        out, _ = self.gru(features.transpose(1, 2))
        return torch.sigmoid(self.head(out[:, -1]))


@_seeded
def conv_gru_vad():
    return RateSwitchedConvGRU()


# Fidelity metrics: mean cosine between the torch model's first output and the artifact's on seeded
# inputs (1.0 is exact). With random weights there is no task accuracy; this is what quantization costs.
INPUTS = {
    "lstm": {"frames": ((1, 49, 20), -1.0, 1.0)},
    "cnn_lstm": {"image": ((1, 1, 16, 32), 0.0, 1.0)},
    "whisper_encoder": {"input_features": ((1, 16, 64), -1.0, 1.0)},
    "wav2vec2": {"input_values": ((1, 1600), -1.0, 1.0)},
}


def _fidelity(name: str, predict, samples: int = 8) -> float:
    import numpy as np

    model = globals()[name]()
    rng = np.random.default_rng(7)
    cosines = []
    for _ in range(samples):
        feeds = {k: rng.uniform(lo, hi, shape).astype(np.float32) for k, (shape, lo, hi) in INPUTS[name].items()}
        with torch.no_grad():
            want = model(*[torch.from_numpy(v) for v in feeds.values()])
        want = (want if isinstance(want, torch.Tensor) else next(iter(want.values()))).numpy().ravel()
        got = np.asarray(next(iter(predict(feeds).values()))).ravel()
        cosines.append(float(want @ got / (np.linalg.norm(want) * np.linalg.norm(got) + 1e-30)))
    return float(np.mean(cosines))


def lstm_fidelity(predict) -> float:
    return _fidelity("lstm", predict)


def cnn_lstm_fidelity(predict) -> float:
    return _fidelity("cnn_lstm", predict)


def whisper_encoder_fidelity(predict) -> float:
    return _fidelity("whisper_encoder", predict)


def wav2vec2_fidelity(predict) -> float:
    return _fidelity("wav2vec2", predict)
