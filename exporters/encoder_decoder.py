"""Export for an encoder-decoder speech model (Whisper and its kin): the encoder run once over the audio features,
its output projected into every decoder layer's cross-attention keys and values there (once per clip, never per
token), and a decoder step over two caches: its own self-attention keys and values, which grow by each token, and
the cross-attention ones, which it only reads.

A user module follows this signature:

    module.encoder(input_features) -> (cross_key_0, cross_value_0, …)
        input_features  float32 [batch, mel_bins, frames]
        cross_*         per decoder layer, [batch, heads, source, head_dim]
    module.decoder(input_ids, *past, *cross) -> (logits, *present)
        input_ids       int64 [batch, seq]
        past            per layer a self-attention key and value, [batch, heads, past_len, head_dim] (past_len ≥ 0)
        logits          [batch, seq, vocab]
        present         per layer the key and value after this call, [batch, heads, past_len + seq, head_dim]
    module.plain(input_features, input_ids) -> logits       the whole sequence in one call: the reference
    module.transcription = {"layers", "heads", "head_dim", "vocab", "max_target", "mel_bins", "frames",
                            "start_ids": [...], "eos": id}     (and "source", the encoder's output positions,
                                                                      where it is not frames // 2)

Positions are past_len … past_len + seq - 1. A Hugging Face `WhisperForConditionalGeneration` is wrapped into the
same signature around transformers' own EncoderDecoderCache (`whisper`). The two graphs are verified against torch
by greedy decoding several clips through them and comparing every step's logits with the plain forward over the
whole sequence: a cache that is wrong anywhere shows as a divergence.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tapeout.core.decoding import INPUT_IDS, LOGITS
from tapeout.core.errors import BadInput, ExportMismatch
from tapeout.core.speech import FIX_SIGNATURE, INPUT_FEATURES, SpeechLayout, pad_tokens


def start_ids(config, generation: dict) -> list[int]:
    """The decoder's start as Whisper transcribes English without timestamps: <|startoftranscript|>, then the forced
    ids of its generation config (`generation`: generation_config.json as read, or the model's generation config's
    fields), a language left open (detected at run time) set to <|en|>, the transcribe task where none is forced,
    and <|notimestamps|>."""
    forced = {int(k): v for k, v in generation.get("forced_decoder_ids") or []}
    languages, tasks = generation.get("lang_to_id") or {}, generation.get("task_to_id") or {}
    if languages and forced.get(1) is None:
        forced[1] = languages.get("<|en|>")
    if tasks and 2 not in forced:
        forced[2] = tasks.get("transcribe")
    no_timestamps = generation.get("no_timestamps_token_id")
    if no_timestamps is not None and no_timestamps not in forced.values():
        forced[max(forced, default=0) + 1] = no_timestamps
    first = generation.get("decoder_start_token_id", config.decoder_start_token_id)
    return [int(first), *(int(forced[k]) for k in sorted(forced) if forced[k] is not None)]


def whisper(model, generation: dict | None = None):
    """A Hugging Face WhisperForConditionalGeneration in the encoder-decoder signature: the encoder with each
    decoder layer's cross-attention projections applied to its output, the decoder step around transformers'
    EncoderDecoderCache with the cross half marked as already computed (so it is read, never recomputed), and the
    plain forward. The encoder takes the config's frames only (Whisper pads every clip to them: 30 s). `generation`:
    the directory's generation_config.json (transformers keeps only some of Whisper's fields on the model), else the
    model's generation config."""
    import torch
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    config = model.config
    heads = config.decoder_attention_heads
    head_dim = config.d_model // heads
    layers = config.decoder_layers
    if generation is None:
        generation = getattr(model, "generation_config", None)
        generation = generation.to_dict() if generation is not None else {}
    start = start_ids(config, generation)
    layout = {
        "layers": layers,
        "heads": heads,
        "head_dim": head_dim,
        "vocab": config.vocab_size,
        "max_target": config.max_target_positions,
        "mel_bins": config.num_mel_bins,
        "frames": 2 * config.max_source_positions,  # two mel frames per encoder position (its stride-2 conv)
        "start_ids": start,
        "eos": config.eos_token_id,
    }

    # transformers 5.x names the decoder's cache `cache` (`past_key_values` is deprecated there, with a warning)
    cache_argument = (
        "cache" if "cache" in inspect.signature(model.model.decoder.forward).parameters else "past_key_values"
    )

    class WhisperEncoder(torch.nn.Module):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_features):
            hidden = self.inner.model.encoder(input_features).last_hidden_state
            batch, source, _ = hidden.shape
            cross = []
            for layer in self.inner.model.decoder.layers:
                attention = layer.encoder_attn
                for proj in (attention.k_proj, attention.v_proj):
                    cross.append(proj(hidden).view(batch, source, heads, head_dim).transpose(1, 2))
            return tuple(cross)

    class WhisperDecoderStep(torch.nn.Module):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, *caches):
            past, cross = caches[: 2 * layers], caches[2 * layers :]
            own, theirs = DynamicCache(), DynamicCache()
            for i in range(layers):
                own.update(past[2 * i], past[2 * i + 1], i)
                theirs.update(cross[2 * i], cross[2 * i + 1], i)
            cache = EncoderDecoderCache(own, theirs)
            for i in range(layers):
                cache.is_updated[i] = True  # the cross keys and values are given: read them, do not project again
            start = past[0].shape[2]
            positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device).unsqueeze(0)
            # cross-attention runs only where encoder states are given; with the cache's cross half marked
            # computed it reads the keys and values given and never these states, so one zero position stands in
            stand_in = cross[0].new_zeros(input_ids.shape[0], 1, self.inner.config.d_model)
            out = self.inner.model.decoder(
                input_ids=input_ids,
                encoder_hidden_states=stand_in,
                **{cache_argument: cache},
                position_ids=positions,
                use_cache=True,
                return_dict=True,
            )
            present = []
            for layer in out.past_key_values.self_attention_cache.layers:
                present += [layer.keys, layer.values]
            return (self.inner.proj_out(out.last_hidden_state), *present)

    class WhisperParts(torch.nn.Module):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner
            self.config = inner.config
            self.encoder = WhisperEncoder(inner).eval()
            self.decoder = WhisperDecoderStep(inner).eval()
            self.transcription = layout

        def plain(self, input_features, input_ids):
            return self.inner(input_features=input_features, decoder_input_ids=input_ids, use_cache=False).logits

    return WhisperParts(model).eval()


@dataclass
class SpeechVerification:
    """The two graphs checked by greedy decoding against the plain forward, clip by clip."""

    clips: int
    tokens: int
    agreement: float  # share of the reference's greedy tokens reproduced before each clip's first divergence
    first_divergence: list[int | None]  # per clip: the first generated position that differs, None where none does
    max_abs_logit_diff: float
    reference_tokens: np.ndarray = field(repr=False)

    def to_json(self) -> dict:
        return {
            "clips": self.clips,
            "tokens": self.tokens,
            "agreement": self.agreement,
            "first_divergence": self.first_divergence,
            "max_abs_logit_diff": self.max_abs_logit_diff,
            "method": "greedy decoding of each clip through the encoder's and the decoder step's graphs (ONNX "
            "Runtime CPU), every step's logits compared with torch's plain forward over the sequence so far",
            "summary": f"The encoder and decoder-step graphs were verified by greedy decoding {self.clips} clips × up "
            f"to {self.tokens} tokens against torch: agreement {self.agreement:.0%}, worst logit difference "
            f"{self.max_abs_logit_diff:.3g}.",
        }


def torch_parts(module) -> tuple[Callable, Callable, Callable]:
    """numpy-in, numpy-out calls of the module's encoder, decoder step and plain forward."""
    import torch

    def encoder(features: np.ndarray) -> list[np.ndarray]:
        with torch.no_grad():
            return [t.numpy() for t in module.encoder(torch.from_numpy(features))]

    def decoder(ids: np.ndarray, past: Sequence[np.ndarray], cross: Sequence[np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            out = module.decoder(torch.from_numpy(ids), *map(torch.from_numpy, past), *map(torch.from_numpy, cross))
        return [t.numpy() for t in out]

    def plain(features: np.ndarray, ids: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module.plain(torch.from_numpy(features), torch.from_numpy(ids)).numpy()

    return encoder, decoder, plain


def greedy(
    encoder: Callable, decoder: Callable, layout: SpeechLayout, features: np.ndarray, tokens: int
) -> tuple[list[int], list[np.ndarray]]:
    """Greedy decoding of one clip through an encoder and a decoder step: the start ids as the first call, then one
    token a step until `tokens` are generated or the end token. Returns the generated ids and each step's logits."""
    cross = encoder(features)
    past = [np.zeros((1, layout.heads, 0, layout.head_dim), np.float32) for _ in layout.past()]
    ids = np.asarray([layout.start_ids], np.int64)
    generated, steps = [], []
    for _ in range(tokens):
        out = decoder(ids, past, cross)
        logits, past = out[0][:, -1], out[1:]
        steps.append(logits[0])
        token = int(logits[0].argmax())
        generated.append(token)
        if token == layout.eos or len(layout.start_ids) + len(generated) >= layout.max_target:
            break
        ids = np.asarray([[token]], np.int64)
    return generated, steps


def verify(
    module,
    encoder_path: Path,
    decoder_path: Path,
    layout: SpeechLayout,
    clips: Sequence[np.ndarray],
    tokens: int,
    tolerance: tuple[float, float],
    progress: Callable[[int, int], None] = lambda _done, _total: None,
) -> SpeechVerification:
    """Greedy decoding of each clip through the two ONNX graphs (ONNX Runtime, CPU) against the torch model's plain
    forward over the sequence decoded so far: every step's logits within `tolerance` (atol, rtol), the same tokens. Raises
    ExportMismatch naming the clip and step where the graphs part from torch."""
    import onnxruntime as ort

    atol, rtol = tolerance
    options = ort.SessionOptions()
    options.log_severity_level = 3
    enc = ort.InferenceSession(str(encoder_path), options, providers=["CPUExecutionProvider"])
    dec = ort.InferenceSession(str(decoder_path), options, providers=["CPUExecutionProvider"])
    cross_names, past_names = layout.cross(), layout.past()

    def onnx_encoder(features):
        return enc.run(cross_names, {INPUT_FEATURES: features})

    def onnx_decoder(ids, past, cross):
        feeds = {
            INPUT_IDS: ids,
            **dict(zip(past_names, past, strict=True)),
            **dict(zip(cross_names, cross, strict=True)),
        }
        return dec.run([LOGITS, *layout.present()], feeds)

    _, _, plain = torch_parts(module)
    reference_rows, first, reproduced, worst, total = [], [], 0, 0.0, 0
    for c, features in enumerate(clips):
        ours, logits = greedy(onnx_encoder, onnx_decoder, layout, features[None].astype(np.float32), tokens)
        ids = np.asarray([list(layout.start_ids) + ours], np.int64)
        whole = plain(features[None].astype(np.float32), ids[:, :-1])[0, len(layout.start_ids) - 1 :]
        reference = [int(row.argmax()) for row in whole]
        for step, (got, want) in enumerate(zip(logits, whole, strict=True)):
            diff = float(np.max(np.abs(got - want)))
            worst = max(worst, diff)
            if not np.allclose(got, want, atol=atol, rtol=rtol) and int(got.argmax()) != int(want.argmax()):
                raise ExportMismatch(
                    f"the exported encoder-decoder parts from torch on clip {c} at generated token {step}: max |Δ "
                    f"logit| {diff:.3g} and a different greedy token ({int(got.argmax())} vs {int(want.argmax())})",
                    fix="check the decoder's cache handling (positions past the start ids, the cross cache read "
                    "unchanged), or report the model",
                )
        diverged = next((i for i, (a, b) in enumerate(zip(ours, reference, strict=True)) if a != b), None)
        first.append(diverged)
        reproduced += len(ours) if diverged is None else diverged
        total += len(reference)
        reference_rows.append(pad_tokens(reference, tokens, layout.eos))
        progress(c + 1, len(clips))
    return SpeechVerification(
        clips=len(clips),
        tokens=tokens,
        agreement=reproduced / total if total else 1.0,
        first_divergence=first,
        max_abs_logit_diff=worst,
        reference_tokens=np.asarray(reference_rows, np.int64),
    )


def parts_of(module, source: str):
    """The encoder-decoder parts of a loaded model: a Hugging Face Whisper wrapped (`whisper`), a user module as it
    is where it follows the signature; one line naming what is missing otherwise."""
    inner = getattr(module, "inner", None) if getattr(module, "hugging_face", False) else None
    if inner is not None:
        config = inner.config
        if not getattr(config, "is_encoder_decoder", False) or not hasattr(getattr(inner, "model", None), "decoder"):
            raise BadInput(
                f"[model] source = {source!r} is a {type(inner).__name__}, which has no decoder over an encoder's "
                "output: a transcribe workload needs an encoder-decoder speech model",
                fix="point [model] source at a WhisperForConditionalGeneration directory (or a module with the "
                'encoder-decoder signature), or use kind = "forward" or "generate"',
            )
        if getattr(config, "model_type", None) != "whisper":
            raise BadInput(
                f"[model] source = {source!r} is a {type(inner).__name__}: the transcribe workload exports "
                "Whisper's encoder-decoder (WhisperForConditionalGeneration) from Hugging Face directories",
                fix="wrap the model in a module with the encoder-decoder signature (docs/workloads.md)",
            )
        return whisper(inner, _generation_file(getattr(module, "directory", None)))
    missing = [name for name in ("encoder", "decoder", "plain") if not callable(getattr(module, name, None))]
    if missing:
        raise BadInput(
            f"[model] source = {source!r} has no {', '.join(missing)}: a transcribe workload runs an encoder once "
            "and a decoder over its output",
            fix=FIX_SIGNATURE,
        )
    return module


def _generation_file(directory) -> dict | None:
    """generation_config.json of a Hugging Face directory, read as data; None where there is none."""
    import json

    path = Path(directory) / "generation_config.json" if directory is not None else None
    if path is None or not path.is_file():
        return None
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: not readable JSON ({exc})", fix="restore the file, or remove it") from None
    if not isinstance(found, dict):
        raise BadInput(f"{path}: not a JSON object", fix="restore the file, or remove it")
    return found


def decoder_step(parts, layout: SpeechLayout):
    """The decoder step as the module the build exports (its inputs and outputs in the layout's order), holding the
    whole model: the encoder's graph is exported from it beside the step's."""
    import torch

    class DecoderStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.parts = parts
            self.layout = layout
            self.config = getattr(parts, "config", None)  # the model_type backs the graph's family evidence

        def forward(self, input_ids, *caches):
            return tuple(self.parts.decoder(input_ids, *caches))

    return DecoderStep().eval()


def reference_tokens(parts, layout: SpeechLayout, clips: Sequence[np.ndarray], tokens: int) -> np.ndarray:
    """The torch model's greedy tokens for each clip [clips, tokens], the end token repeated after it."""
    encoder, decoder, _ = torch_parts(parts)
    rows = []
    for clip in clips:
        got, _ = greedy(encoder, decoder, layout, clip[None].astype(np.float32), tokens)
        rows.append(pad_tokens(got, tokens, layout.eos))
    return np.asarray(rows, np.int64)


def golden_feeds(parts, layout: SpeechLayout, clips: Sequence[np.ndarray], seed: int) -> list[dict[str, np.ndarray]]:
    """One decode step per clip at the last position (max_target - 1 tokens in the self cache): the cross cache from
    the clip through the torch encoder, the self cache from one torch decoder call over the start ids and seeded
    random tokens, then one more token."""
    encoder, decoder, _ = torch_parts(parts)
    rng = np.random.default_rng(seed)
    feeds = []
    for clip in clips:
        cross = encoder(clip[None].astype(np.float32))
        fill = layout.max_target - 1 - len(layout.start_ids)
        ids = np.asarray([[*layout.start_ids, *rng.integers(0, layout.vocab, fill)]], np.int64)
        empty = [np.zeros((1, layout.heads, 0, layout.head_dim), np.float32) for _ in layout.past()]
        present = decoder(ids, empty, cross)[1:]
        token = rng.integers(0, layout.vocab, (1, 1)).astype(np.int64)
        feeds.append(
            {
                INPUT_IDS: token,
                **dict(zip(layout.past(), present, strict=True)),
                **dict(zip(layout.cross(), cross, strict=True)),
            }
        )
    return feeds
