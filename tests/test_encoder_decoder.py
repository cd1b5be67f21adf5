"""The encoder-decoder export (exporters/encoder_decoder.py) on a Whisper-shaped model from its config: the encoder
graph gives every decoder layer's cross-attention keys and values once, the decoder step reads them with its own
growing cache, and greedy decoding through the two ONNX graphs reproduces the torch model's plain forward clip by
clip. A decoder that loses its cache is caught at the token where it parts from torch."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tapeout.core.errors import BadInput, ExportMismatch  # noqa: E402
from tapeout.exporters import encoder_decoder as ed  # noqa: E402
from tapeout.exporters import torch_onnx  # noqa: E402
from tapeout.exporters.sources import LoadedModel  # noqa: E402

OPTIONS = torch_onnx.ExportOptions(opset=18, max_ir_version=10)


def _small_whisper():
    config = transformers.WhisperConfig(
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        num_mel_bins=80,
        vocab_size=500,
        max_source_positions=50,
        max_target_positions=40,
        decoder_start_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        bos_token_id=1,
        init_std=0.3,  # at the default 0.02 a model this small decodes its start token forever: no test of a cache
    )
    torch.manual_seed(0)
    return transformers.WhisperForConditionalGeneration(config).eval()


def _clips(layout, count=3):
    rng = np.random.default_rng(3)
    return [rng.standard_normal((layout.mel_bins, layout.frames)).astype(np.float32) * 0.5 for _ in range(count)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("whisper")
    parts = ed.whisper(_small_whisper())
    layout = ed.SpeechLayout.from_module(parts)
    source = layout.frames // 2
    torch_onnx.export(
        LoadedModel("torch", "encoder", module=parts.encoder, output_names=layout.cross()),
        layout.encoder_inputs(),
        {"batch": 1},
        out / "encoder.onnx",
        OPTIONS,
    )
    torch_onnx.export(
        LoadedModel("torch", "decoder", module=parts.decoder, output_names=["logits", *layout.present()]),
        layout.decoder_inputs(source),
        {"batch": 1, "seq": 1, "past_len": 5},
        out / "decoder.onnx",
        OPTIONS,
    )
    return parts, layout, out


def test_the_layout_is_read_from_the_config(exported):
    _, layout, _ = exported
    assert (layout.layers, layout.heads, layout.head_dim, layout.vocab) == (2, 4, 16, 500)
    assert (layout.frames, layout.max_target, layout.start_ids, layout.eos) == (100, 40, (1,), 2)
    assert layout.cross()[:2] == ["cross_key_0", "cross_value_0"] and len(layout.present()) == 4
    # the cross cache is the encoder's length (its stride-2 convolution halves the frames), the self cache max_target
    assert layout.cross_cache_bytes(50) == 2 * 2 * 4 * 50 * 16 * 4
    assert layout.self_cache_bytes() == 2 * 2 * 4 * 40 * 16 * 4


def test_greedy_decoding_through_both_graphs_matches_torch_on_every_clip(exported):
    parts, layout, out = exported
    clips = _clips(layout)
    verified = ed.verify(parts, out / "encoder.onnx", out / "decoder.onnx", layout, clips, 12, (1e-4, 1e-3))
    assert verified.clips == 3 and verified.agreement == 1.0 and verified.first_divergence == [None, None, None]
    assert verified.max_abs_logit_diff < 1e-4
    # the reference tokens are torch's own greedy decoding of each clip through the plain forward
    _, _, plain = ed.torch_parts(parts)
    for clip, row in zip(clips, verified.reference_tokens, strict=True):
        row = list(row)
        decoded = row[: row.index(layout.eos) + 1] if layout.eos in row else row  # the end token repeats after it
        ids = list(layout.start_ids)
        for _ in range(len(decoded)):
            ids.append(int(plain(clip[None], np.asarray([ids], np.int64))[0, -1].argmax()))
        assert ids[len(layout.start_ids) :] == decoded
        assert row == ed.pad_tokens(decoded, 12, layout.eos)
    assert len({tuple(r) for r in verified.reference_tokens}) > 1  # the clips decode differently: not one constant


def test_the_cross_projections_live_in_the_encoder_graph_only(exported):
    """The decoder step reads cross keys and values as inputs: it holds no cross-attention key or value weight, so
    nothing projects the encoder output again per token."""
    _, layout, out = exported
    decoder = onnx.load(str(out / "decoder.onnx"), load_external_data=False)
    encoder = onnx.load(str(out / "encoder.onnx"), load_external_data=False)
    assert [i.name for i in decoder.graph.input][-len(layout.cross()) :] == layout.cross()
    assert [o.name for o in encoder.graph.output] == layout.cross()

    def projections(model) -> int:  # d_model × d_model weights: attention's projections, nothing else at this size
        return sum(1 for i in model.graph.initializer if list(i.dims) == [64, 64])

    # per decoder layer: self-attention q, k, v, out and cross-attention q, out; the cross k and v in the encoder's
    assert projections(decoder) == 6 * layout.layers
    assert projections(encoder) == 4 * 2 + 2 * layout.layers  # its own self-attention's, then the cross k and v


@pytest.mark.slow  # a third export; the fast subset keeps the two graphs verified
def test_a_decoder_that_loses_its_cache_is_caught_where_it_parts_from_torch(exported, tmp_path):
    parts, layout, out = exported

    class Forgetful(torch.nn.Module):
        """Each step sees only its own token: the past is dropped."""

        def __init__(self, step):
            super().__init__()
            self.step = step

        def forward(self, input_ids, *caches):
            past, cross = caches[: 2 * layout.layers], caches[2 * layout.layers :]
            empty = [p[:, :, :0] for p in past]
            out = self.step(input_ids, *empty, *cross)
            return (out[0], *(torch.cat([p, q], dim=2) for p, q in zip(past, out[1:], strict=True)))

    torch_onnx.export(
        LoadedModel("torch", "decoder", module=Forgetful(parts.decoder), output_names=["logits", *layout.present()]),
        layout.decoder_inputs(layout.frames // 2),
        {"batch": 1, "seq": 1, "past_len": 5},
        tmp_path / "decoder.onnx",
        OPTIONS,
    )
    with pytest.raises(ExportMismatch, match=r"on clip 0 at generated token [1-9]"):
        ed.verify(parts, out / "encoder.onnx", tmp_path / "decoder.onnx", layout, _clips(layout, 1), 12, (1e-4, 1e-3))


@pytest.mark.parametrize(
    "transcription, says",
    [
        (None, "has no transcription layout (layers, heads"),
        (
            {"layers": 2, "heads": 4, "head_dim": 16, "vocab": 500, "max_target": 40, "mel_bins": 80},
            "(frames, start_ids, eos)",
        ),
        (
            {
                "layers": 2,
                "heads": 4,
                "head_dim": 16,
                "vocab": 500,
                "max_target": 3,
                "mel_bins": 80,
                "frames": 100,
                "start_ids": [1, 2, 3],
                "eos": 2,
            },
            "the decoder starts from 1 to max_target - 1 tokens",
        ),
        (
            {
                "layers": 2.5,
                "heads": 4,
                "head_dim": 16,
                "vocab": 500,
                "max_target": 40,
                "mel_bins": 80,
                "frames": 100,
                "start_ids": [1],
                "eos": 2,
            },
            "every size is a non-negative integer",
        ),
    ],
)
def test_a_module_without_a_usable_layout_is_one_line(transcription, says):
    class Module:
        pass

    module = Module()
    if transcription is not None:
        module.transcription = transcription
    with pytest.raises(BadInput, match=None) as raised:
        ed.SpeechLayout.from_module(module)
    assert says in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("generation", "start"),
    [
        ({"forced_decoder_ids": [[1, 50259], [2, 50359], [3, 50363]]}, [50258, 50259, 50359, 50363]),
        # openai/whisper-*'s own: the language left to detection, the task forced; English is taken, no timestamps
        (
            {
                "forced_decoder_ids": [[1, None], [2, 50359]],
                "lang_to_id": {"<|en|>": 50259, "<|de|>": 50261},
                "task_to_id": {"transcribe": 50359, "translate": 50358},
                "no_timestamps_token_id": 50363,
            },
            [50258, 50259, 50359, 50363],
        ),
        ({}, [50258]),
    ],
)
def test_the_start_ids_are_whispers_english_transcription_without_timestamps(generation, start):
    config = transformers.WhisperConfig(decoder_start_token_id=50258)
    assert ed.start_ids(config, generation) == start
