"""A decoder of SmolLM2-135M's shape (HuggingFaceTB/SmolLM2-135M's config: 30 layers, hidden 576, 9 query heads over
3 key/value heads, SwiGLU 1536, a 49 152-token vocabulary, tied embeddings; 134.5 M parameters) with seeded random
weights: a language model at the size users ship, for the speed, memory and build time of generation. Its text
means nothing; greedy agreement with torch is still judged.

`directory()` writes the Hugging Face directory (config.json + model.safetensors) next to this file on first use
and returns it; tapeout then loads it as any Hugging Face causal LM.
"""

import json
import shutil
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
SEED = 20_261_206
CONFIG = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def directory() -> Path:
    """The model directory, made once from CONFIG and SEED; remade if the config it was made from changed."""
    target = HERE / "hf"
    stamp = json.dumps({"config": CONFIG, "seed": SEED}, sort_keys=True)
    if (target / "made-from.json").is_file() and (target / "made-from.json").read_text() == stamp:
        return target
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
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

    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    print(f"{path}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters")
