"""A model of Whisper-tiny's shape (37.8 M parameters: d_model 384, 4 encoder and 4 decoder layers of 6 heads, 80
mel bins, 30 s of audio as 3000 frames, a 51 865-token vocabulary, 448 decoder positions) made from its config with
seeded random weights: the shape of the most deployed on-device speech recognizer, for measuring the speed and
memory of transcription. Its weights are random, so its transcripts mean nothing; greedy agreement with torch is
still judged.

`directory()` writes the Hugging Face directory next to this file on first use and returns it, with everything a
Whisper directory holds, so that other runtimes' Whisper pipelines load it too: config.json and model.safetensors,
the generation config (the forced start tokens, the language and task maps), the feature extractor's config, and a
tokenizer at Whisper's token ids (a made-up byte-level vocabulary: the transcripts mean nothing anyway). tapeout
itself reads the config, the weights and the generation config.
"""

import json
import shutil
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
SEED = 20_261_207
CONFIG = {
    "vocab_size": 51865,
    "num_mel_bins": 80,
    "d_model": 384,
    "encoder_layers": 4,
    "decoder_layers": 4,
    "encoder_attention_heads": 6,
    "decoder_attention_heads": 6,
    "encoder_ffn_dim": 1536,
    "decoder_ffn_dim": 1536,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "decoder_start_token_id": 50258,  # <|startoftranscript|>
    "eos_token_id": 50257,
    "pad_token_id": 50257,
    "bos_token_id": 50257,
    # at the default 0.02 a random model this size gives near-uniform logits and decodes one token forever
    "init_std": 0.1,
}
# <|en|> <|transcribe|> <|notimestamps|>: the decoder starts from these after <|startoftranscript|>, as Whisper does
FORCED = [[1, 50259], [2, 50359], [3, 50363]]
# Whisper's special tokens from 50257: the end token, the start of a transcript, 99 languages, the tasks, then 1501
# timestamps
LANGUAGES = [
    "en",
    "zh",
    "de",
    "es",
    "ru",
    "ko",
    "fr",
    "ja",
    "pt",
    "tr",
    "pl",
    "ca",
    "nl",
    "ar",
    "sv",
    "it",
    "id",
    "hi",
    "fi",
    "vi",
    "he",
    "uk",
    "el",
    "ms",
    "cs",
    "ro",
    "da",
    "hu",
    "ta",
    "no",
    "th",
    "ur",
    "hr",
    "bg",
    "lt",
    "la",
    "mi",
    "ml",
    "cy",
    "sk",
    "te",
    "fa",
    "lv",
    "bn",
    "sr",
    "az",
    "sl",
    "kn",
    "et",
    "mk",
    "br",
    "eu",
    "is",
    "hy",
    "ne",
    "mn",
    "bs",
    "kk",
    "sq",
    "sw",
    "gl",
    "mr",
    "pa",
    "si",
    "km",
    "sn",
    "yo",
    "so",
    "af",
    "oc",
    "ka",
    "be",
    "tg",
    "sd",
    "gu",
    "am",
    "yi",
    "lo",
    "uz",
    "fo",
    "ht",
    "ps",
    "tk",
    "nn",
    "mt",
    "sa",
    "lb",
    "my",
    "bo",
    "tl",
    "mg",
    "as",
    "tt",
    "haw",
    "ln",
    "ha",
    "ba",
    "jw",
    "su",
]
SPECIALS = [
    "<|startoftranscript|>",
    *(f"<|{code}|>" for code in LANGUAGES),
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nospeech|>",
    "<|notimestamps|>",
]


def directory() -> Path:
    """The model directory, made once from CONFIG and SEED; remade if what it was made from changed."""
    target = HERE / "hf"
    stamp = json.dumps({"config": CONFIG, "forced": FORCED, "seed": SEED, "files": 2}, sort_keys=True)
    if (target / "made-from.json").is_file() and (target / "made-from.json").read_text() == stamp:
        return target
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(SEED)
    model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**CONFIG)).eval()
    model.generation_config.forced_decoder_ids = FORCED
    # written beside, then moved into place: an interrupted run never leaves a directory that looks complete
    staging = Path(tempfile.mkdtemp(prefix=".hf-", dir=HERE))
    try:
        model.save_pretrained(staging)
        _whisper_files(staging)
        (staging / "made-from.json").write_text(stamp)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte a printable character (Whisper's tokenizer is GPT-2's)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def _whisper_files(folder: Path) -> None:
    """The tokenizer (50 257 byte-level tokens, then Whisper's special tokens at their ids), the feature extractor's
    config and the generation config's language and task maps."""
    from transformers import WhisperFeatureExtractor, WhisperTokenizer, WhisperTokenizerFast

    alphabet = list(_bytes_to_unicode().values())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = []
    for a in alphabet:  # pairs of bytes fill the vocabulary up to Whisper's 50 257 ordinary tokens
        for b in alphabet:
            if len(vocab) < 50257 and a + b not in vocab:
                vocab[a + b] = len(vocab)
                merges.append(f"{a} {b}")
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    end = "<|endoftext|>"
    slow = WhisperTokenizer(
        str(folder / "vocab.json"), str(folder / "merges.txt"), unk_token=end, bos_token=end, eos_token=end
    )
    slow.add_special_tokens({"additional_special_tokens": SPECIALS})
    slow.add_tokens([f"<|{i * 0.02:.2f}|>" for i in range(1501)])
    slow.save_pretrained(folder)
    WhisperTokenizerFast.from_pretrained(folder).save_pretrained(folder)
    WhisperFeatureExtractor(feature_size=CONFIG["num_mel_bins"]).save_pretrained(folder)
    generation = json.loads((folder / "generation_config.json").read_text())
    generation.update(
        is_multilingual=True,
        lang_to_id={f"<|{code}|>": 50259 + i for i, code in enumerate(LANGUAGES)},
        task_to_id={"translate": 50358, "transcribe": 50359},
        no_timestamps_token_id=50363,
        prev_sot_token_id=50361,
        begin_suppress_tokens=[220, 50257],
        suppress_tokens=[],
        max_initial_timestamp_index=50,
        max_length=CONFIG["max_target_positions"],
        return_timestamps=False,
    )
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))


if __name__ == "__main__":
    path = directory()
    import transformers

    model = transformers.WhisperForConditionalGeneration.from_pretrained(path)
    print(f"{path}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters")
