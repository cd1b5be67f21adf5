"""A Hugging Face model directory, loaded offline with transformers, as a plain tensor-in/tensor-out module."""

from __future__ import annotations

import contextlib
from pathlib import Path

from tapeout.errors import BadInput, TargetUnavailable, first_line
from tapeout.exporters.sources import LoadedModel, state_dict_sha256


def load(directory: Path, input_names: list[str], output_names: list[str] | None) -> LoadedModel:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise TargetUnavailable(f"a Hugging Face directory needs torch and transformers ({exc})",
                                fix='pip install "tapeout[hf]"') from None
    transformers.utils.logging.disable_progress_bar()  # tapeout's own progress line covers this step
    try:
        model = transformers.AutoModel.from_pretrained(str(directory), local_files_only=True,
                                                       trust_remote_code=False)  # a directory's .py files never run
    except Exception as exc:
        raise BadInput(f"transformers could not load {directory}: {first_line(exc)}",
                       fix="check that the directory holds config.json and the weights (model.safetensors)") from None
    model.eval()
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

        def forward(self, *args):
            out = self.inner(**dict(zip(self.names, args, strict=True)), return_dict=True)
            return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state

    weights = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("*.bin"))
    return LoadedModel(
        "torch",
        f"Hugging Face {model.config.model_type} from {directory}",
        module=HuggingFaceOutputs(model, input_names).eval(),
        output_names=output_names,
        weights_sha256=state_dict_sha256(model),
        files=[directory / "config.json", *weights],
    )
