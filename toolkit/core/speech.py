"""An encoder-decoder speech model's two graphs as data (a `transcribe` workload: exporters/encoder_decoder.py makes
them): what the encoder takes and gives, what the decoder step takes and gives. numpy only: the build, the measuring
process and `check` on a device all use it.

    encoder  input_features float32 [batch, mel_bins, frames] -> per decoder layer i: cross_key_i, cross_value_i
             [batch, heads, source, head_dim]
    decoder  input_ids int64 [batch, seq], per layer past_key_i, past_value_i [batch, heads, past, head_dim], then
             every cross_key_i, cross_value_i -> logits [batch, seq, vocab], present_key_i, present_value_i
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from tapeout.core.decoding import INPUT_IDS
from tapeout.core.errors import BadInput
from tapeout.core.schemas import InputSpec

INPUT_FEATURES = "input_features"
LAYOUT_KEYS = ("layers", "heads", "head_dim", "vocab", "max_target", "mel_bins", "frames", "start_ids", "eos")
FIX_SIGNATURE = (
    "follow the encoder-decoder signature in the docs (docs/workloads.md): module.encoder(input_features) -> cross "
    "keys and values, module.decoder(input_ids, *past, *cross) -> (logits, *present), module.plain(input_features, "
    "input_ids) -> logits and module.transcription = {layers, heads, head_dim, vocab, max_target, mel_bins, frames, "
    "start_ids, eos}"
)


@dataclass(frozen=True)
class SpeechLayout:
    """The two graphs' interface: what the encoder takes and gives, what the decoder step takes and gives."""

    layers: int
    heads: int
    head_dim: int
    vocab: int
    max_target: int  # the most decoder positions (start tokens + generated)
    mel_bins: int
    frames: int  # the encoder's input length: the declared longest clip's feature frames
    start_ids: tuple[int, ...]  # the decoder's prompt (Whisper: start of transcript, language, task, no timestamps)
    eos: int
    source: int = 0  # the encoder's output positions (the cross cache's length); 0: frames // 2, Whisper's
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not self.source:
            object.__setattr__(self, "source", self.frames // 2)  # Whisper's stride-2 convolution halves the frames

    @staticmethod
    def from_module(module) -> SpeechLayout:
        info = getattr(module, "transcription", None)
        if not isinstance(info, dict) or any(k not in info for k in LAYOUT_KEYS):
            missing = [k for k in LAYOUT_KEYS if not isinstance(info, dict) or k not in info]
            raise BadInput(
                f"the encoder-decoder module has no transcription layout ({', '.join(missing)})", fix=FIX_SIGNATURE
            )
        numbers = {k: info[k] for k in LAYOUT_KEYS if k not in ("start_ids",)}
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in numbers.values()):
            raise BadInput(f"transcription layout {numbers}: every size is a non-negative integer", fix=FIX_SIGNATURE)
        start = tuple(int(t) for t in info["start_ids"])
        if not start or len(start) >= info["max_target"]:
            raise BadInput(
                f"transcription start_ids {list(start)}: the decoder starts from 1 to max_target - 1 tokens",
                fix=FIX_SIGNATURE,
            )
        source = info.get("source", 0)
        if type(source) is not int or source < 0:
            raise BadInput(f"transcription source {source!r}: a non-negative integer", fix=FIX_SIGNATURE)
        return SpeechLayout(**numbers, start_ids=start, source=source)

    def to_json(self) -> dict:
        return {**asdict(self), "start_ids": list(self.start_ids)}

    @classmethod
    def from_json(cls, data: dict) -> SpeechLayout:
        """A layout read back from a build dir (its manifest, verified by hash); its values checked all the same."""
        sizes = {k: data[k] for k in (*LAYOUT_KEYS, "source") if k != "start_ids"}
        if any(type(v) is not int or v < 0 for v in sizes.values()) or data.get("dtype") != "float32":
            raise TypeError(f"{sizes}: whole non-negative sizes and dtype float32 expected")
        start = data["start_ids"]
        if not isinstance(start, list) or not start or any(type(t) is not int or t < 0 for t in start):
            raise TypeError(f"start_ids {start!r}: a list of token ids expected")
        return cls(**sizes, start_ids=tuple(start))

    def cross(self) -> list[str]:
        return [f"cross_{kind}_{i}" for i in range(self.layers) for kind in ("key", "value")]

    def past(self) -> list[str]:
        return [f"past_{kind}_{i}" for i in range(self.layers) for kind in ("key", "value")]

    def present(self) -> list[str]:
        return [f"present_{kind}_{i}" for i in range(self.layers) for kind in ("key", "value")]

    def encoder_inputs(self, batch: str | int = "batch") -> list[InputSpec]:
        return [
            InputSpec(
                name=INPUT_FEATURES, shape=[batch, self.mel_bins, self.frames], dtype="float32", range=(-1.0, 1.0)
            )
        ]

    def decoder_inputs(self, source: int) -> list[InputSpec]:
        """The decoder step's inputs at one decode step at max_target, its cross cache `source` positions long."""
        cache = ["batch", self.heads, "past_len", self.head_dim]
        return [
            InputSpec(name=INPUT_IDS, shape=["batch", "seq"], dtype="int64", range=(0, self.vocab - 1)),
            *(InputSpec(name=n, shape=cache, dtype=self.dtype, range=(-1.0, 1.0)) for n in self.past()),
            *(
                InputSpec(
                    name=n, shape=["batch", self.heads, source, self.head_dim], dtype=self.dtype, range=(-1.0, 1.0)
                )
                for n in self.cross()
            ),
        ]

    def self_cache_bytes(self, batch: int = 1) -> int:
        return 2 * self.layers * batch * self.heads * self.max_target * self.head_dim * 4

    def cross_cache_bytes(self, source: int, batch: int = 1) -> int:
        return 2 * self.layers * batch * self.heads * source * self.head_dim * 4


def pad_tokens(tokens: Sequence[int], length: int, eos: int) -> list[int]:
    """A clip's greedy tokens to `length`, the end token repeated after it: rows of one length, compared whole (a
    decoder that ends early or late differs at that position)."""
    return [*tokens, *[eos] * (length - len(tokens))]
