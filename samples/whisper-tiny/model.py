"""A model of Whisper-tiny's shape (37.8 M parameters: d_model 384, 4 encoder and 4 decoder layers of 6 heads, 80
mel bins, 30 s of audio as 3000 frames, a 51 865-token vocabulary, 448 decoder positions) made from its config with
seeded random weights: the shape of the most deployed on-device speech recognizer, for measuring the speed and
memory of transcription. Its weights are random, so its transcripts mean nothing; greedy agreement with torch is
still judged.

`directory()` writes the Hugging Face directory (config.json, generation_config.json, model.safetensors) next to
this file on first use and returns it; tapeout then loads it as any Hugging Face Whisper.
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


def directory() -> Path:
    """The model directory, made once from CONFIG and SEED; remade if what it was made from changed."""
    target = HERE / "hf"
    stamp = json.dumps({"config": CONFIG, "forced": FORCED, "seed": SEED}, sort_keys=True)
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
        (staging / "made-from.json").write_text(stamp)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


if __name__ == "__main__":
    path = directory()
    import transformers

    model = transformers.WhisperForConditionalGeneration.from_pretrained(path)
    print(f"{path}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters")
