"""A Hugging Face model directory, loaded offline with transformers, as a plain tensor-in/tensor-out module."""

from __future__ import annotations

import contextlib
from pathlib import Path

from tapeout.core.errors import BadInput, TargetUnavailable, first_line, runtime_detail
from tapeout.exporters.sources import LoadedModel, state_dict_sha256


def load(directory: Path, input_names: list[str], output_names: list[str] | None) -> LoadedModel:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise TargetUnavailable(f"a Hugging Face directory needs torch and transformers ({exc})",
                                fix='pip install "tapeout[hf]"') from None
    transformers.utils.logging.disable_progress_bar()  # tapeout's own progress line covers this step
    model_class, note = model_class_for(directory, transformers)
    try:
        model = model_class.from_pretrained(str(directory), local_files_only=True,
                                            trust_remote_code=False)  # a directory's .py files never run
    except Exception as exc:
        raise BadInput(f"transformers could not load {directory} as {model_class.__name__}: {first_line(exc)}",
                       detail=runtime_detail(exc), fix="check that the directory holds config.json and the weights (model.safetensors)") from None
    model.eval()
    if getattr(model.config, "use_cache", False):
        model.config.use_cache = False  # one forward, one output: no KV-cache tensors in the exported graph
    # The attention implementation decides the exported graph; eager attention exports on every opset.
    if hasattr(model, "set_attn_implementation"):
        with contextlib.suppress(Exception):  # models without the switch keep their default
            model.set_attn_implementation("eager")

    class HuggingFaceOutputs(torch.nn.Module):
        """Positional tensors in, the model's main output tensor out (logits, else last_hidden_state)."""

        def __init__(self, inner, names: list[str]):
            super().__init__()
            self.inner = inner
            self.names = names
            self.config = inner.config  # the model_type and architectures back the graph's family evidence

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
        return transformers.AutoModel, (f"config.json names {architectures}, which this transformers "
                                        f"{transformers.__version__} does not have: loaded the bare model without its head")
    return transformers.AutoModel, "config.json names no architecture: loaded the bare model (no task head)"
