"""A Llama-style decoder of about 40 M parameters made from its config with seeded random weights: the shape of
a small language model (GQA, RMSNorm, SwiGLU, rotary positions, a 32 000-token vocabulary) for measuring the
speed and memory of generation. Its weights are random, so its text means nothing; greedy agreement with torch
is still judged, and perplexity is tiny-lm's job.

`directory()` writes the Hugging Face directory (config.json + model.safetensors) next to this file on first use
and returns it; tapeout then loads it as any Hugging Face causal LM.
"""

import json
import shutil
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
SEED = 20_261_125
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,  # grouped-query attention: 2 query heads per key/value head
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,  # the embedding doubles as the LM head, as in small Llamas (SmolLM, Llama 3.2 1B)
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
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
    config = transformers.LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(config).eval()
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
