"""A Hugging Face model directory, loaded offline with transformers, as a plain tensor-in/tensor-out module."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from tapeout.core.errors import BadInput, TargetUnavailable, first_line, runtime_detail
from tapeout.exporters.sources import LoadedModel, state_dict_sha256


def load(directory: Path, input_names: list[str], output_names: list[str] | None) -> LoadedModel:
    # transformers imports torchao where it is installed (ExecuTorch brings it), whose pytree registrations log a
    # deprecation warning at import: not the user's to act on
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise TargetUnavailable(
            f"a Hugging Face directory needs torch and transformers ({exc})", fix='pip install "tapeout[hf]"'
        ) from None
    transformers.utils.logging.disable_progress_bar()  # tapeout's own progress line covers this step
    model_class, note = model_class_for(directory, transformers)
    try:
        model, loading = model_class.from_pretrained(
            str(directory), local_files_only=True, trust_remote_code=False, output_loading_info=True
        )  # a directory's .py files never run
    except Exception as exc:
        raise BadInput(
            f"transformers could not load {directory} as {model_class.__name__}: {first_line(exc)}",
            detail=runtime_detail(exc),
            fix="check that the directory holds config.json and the weights (model.safetensors)",
        ) from None
    _weights_match_config(directory, model_class.__name__, loading, bare=bool(note))
    model.eval()
    if getattr(model.config, "use_cache", False):
        model.config.use_cache = False  # one forward, one output: no KV-cache tensors in the exported graph
    # The attention implementation decides the exported graph; eager attention exports on every opset.
    if hasattr(model, "set_attn_implementation"):
        with contextlib.suppress(Exception):  # models without the switch keep their default
            model.set_attn_implementation("eager")

    class HuggingFaceOutputs(torch.nn.Module):
        """Positional tensors in, the model's main output tensor out (logits, else last_hidden_state)."""

        hugging_face = True  # a generate workload wraps `inner` with its cache instead (decoder() below)

        def __init__(self, inner, names: list[str]):
            super().__init__()
            self.inner = inner
            self.names = names
            self.config = inner.config  # the model_type and architectures back the graph's family evidence
            self.directory = directory  # its other files (a Whisper's generation config) are read as data

        def forward(self, *args):
            out = self.inner(**dict(zip(self.names, args, strict=True)), return_dict=True)
            return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state

    weights = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("*.bin"))
    return LoadedModel(
        "torch",
        f"Hugging Face {model.config.model_type} ({type(model).__name__}) from {directory}",
        module=HuggingFaceOutputs(model, input_names).eval(),
        output_names=output_names,
        weights_sha256=state_dict_sha256(model),
        files=[directory / "config.json", *weights],
        notes=[note] if note else [],
    )


def _weights_match_config(directory: Path, cls: str, loading: dict, bare: bool) -> None:
    """Weights the config asks for and the files lack are initialized at random by transformers, with a warning:
    an artifact with a random layer. Refused, as are weights of another shape; weights the files hold and the model
    does not use are refused too, except where the bare backbone was loaded from a checkpoint with a head."""
    missing = sorted(loading.get("missing_keys") or [])
    mismatched = [str(m[0]) if isinstance(m, tuple | list) else str(m) for m in loading.get("mismatched_keys") or []]
    unexpected = [] if bare else sorted(loading.get("unexpected_keys") or [])
    for what, keys in (
        ("lacks", missing),
        ("holds weights of another shape for", mismatched),
        ("holds weights the model does not use:", unexpected),
    ):
        if keys:
            shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
            raise BadInput(
                f"{directory}: its weights do not match its config.json for {cls}: the checkpoint {what} {shown}",
                fix="use the config.json the weights were saved with (its layer count and sizes)",
            )


def model_class_for(directory: Path, transformers) -> tuple[type, str]:
    """The class config.json's `architectures` names (the task head: …ForSequenceClassification,
    …ForCausalLM), looked up in transformers itself, never in the directory's code; AutoModel, the bare
    backbone, where it names none or one this transformers lacks, with a note saying so."""
    import json

    try:
        architectures = json.loads((directory / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        architectures = []  # transformers' own loader names what is wrong with the file
    for name in architectures:
        cls = getattr(transformers, name, None) if isinstance(name, str) and name.isidentifier() else None
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
            return cls, ""
    if architectures:
        return transformers.AutoModel, (
            f"config.json names {architectures}, which this transformers "
            f"{transformers.__version__} does not have: loaded the bare model without its head"
        )
    return transformers.AutoModel, "config.json names no architecture: loaded the bare model (no task head)"


CONTEXT_KEYS = ("max_position_embeddings", "n_positions")  # Llama/Qwen/Phi/Gemma; GPT-2


def decoder(model, source: str):
    """A Hugging Face causal LM in tapeout's generation signature (exporters/generation.py): forward(input_ids,
    *past) -> (logits, *present) around transformers' own DynamicCache, forward(input_ids) -> logits, and the
    cache layout from the config (GQA's key/value heads kept)."""
    import inspect

    import torch
    from transformers import DynamicCache

    config = model.config
    # transformers 5.x renamed `past_key_values` to `cache` (the old name warns until it goes in 5.40)
    parameters = inspect.signature(model.forward).parameters
    cache_arg = "cache" if "cache" in parameters else "past_key_values"
    # the head on the last position only: decoding reads nothing else, and on the whole prompt the head is the
    # largest matmul of a small model's prefill (llama-40m at 128 tokens: 4.2 of 10.9 GFLOP)
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
    if not hasattr(model, "lm_head") and not type(model).__name__.endswith(("ForCausalLM", "LMHeadModel")):
        raise BadInput(
            f"[model] source {source} loads as {type(model).__name__}, not a causal LM: a generate workload "
            "decodes from the language-model head's logits",
            fix='name a …ForCausalLM class in config.json `architectures`, or use [workload] kind = "forward"',
        )
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None) or getattr(text, "n_head", None)
    width = getattr(text, "hidden_size", None) or getattr(text, "n_embd", None)
    layout = {
        "layers": getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", None),
        "kv_heads": getattr(text, "num_key_value_heads", None) or heads,
        "head_dim": getattr(text, "head_dim", None) or (width // heads if width and heads else None),
        "vocab": getattr(text, "vocab_size", None),
        "max_context": next((getattr(text, k) for k in CONTEXT_KEYS if isinstance(getattr(text, k, None), int)), None),
    }

    class HuggingFaceDecoder(torch.nn.Module):
        """The causal LM with its KV cache as tensors: past → DynamicCache → the model → present, positions
        past_len … past_len + seq - 1 (the causal mask transformers derives from them) unless given, with the
        padding mask where given."""

        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner
            self.config = inner.config  # the model_type and architectures back the graph's family evidence
            self.generation = layout

        def forward(self, input_ids, *past, attention_mask=None, position_ids=None):
            if not past:
                return self.inner(input_ids=input_ids, use_cache=False, return_dict=True).logits
            cache = DynamicCache()
            for layer in range(len(past) // 2):
                cache.update(past[2 * layer], past[2 * layer + 1], layer)
            if position_ids is None:
                start = past[0].shape[2]
                positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
                position_ids = positions.unsqueeze(0).expand(input_ids.shape[0], -1)
            # a mask given (a static-shape runtime pads): transformers combines it with the causal mask
            masked = {} if attention_mask is None else {"attention_mask": attention_mask}
            out = self.inner(
                input_ids=input_ids,
                position_ids=position_ids,
                use_cache=True,
                return_dict=True,
                **masked,
                **{cache_arg: cache},
                **last_only,
            )
            present = []
            for layer in getattr(out, cache_arg).layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    return HuggingFaceDecoder(model).eval()
