""".pt2 (torch.export) archives opened without ever unpickling: a model file from someone else is data.

An archive is a zip: JSON graphs and payload configs, raw tensor bytes, and optionally pickled
payloads (weights or constants marked `use_pickle`, torchbind and opaque objects, a legacy constants
`.pt`), plus `data/sample_inputs/*.pt`, which torch retries with `weights_only=False` when the safe
load fails. Unpickling runs whatever the pickle names. So, first, the archive's listing and configs
are read and anything pickled is refused with one line; then torch.export.load runs with every
unpickling path it has (torch.load, pickle.loads, torch's torchbind loader) made safe or refused,
which also covers paths a future torch adds to the archive format through the same calls.
"""

from __future__ import annotations

import contextlib
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

from tapeout.core.errors import BadInput

_FIX = (
    "save it with torch.export.save from a module with plain tensors (no tensor subclasses or script "
    "objects), or give tapeout the model as ONNX or a module:callable"
)


class UnpicklingRefused(Exception):
    pass


def pickled_entries(path: Path) -> list[str]:
    """What in the archive would be unpickled by torch.export.load (empty: nothing)."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise BadInput(f"{path} is not a .pt2 archive ({exc})", fix="save it with torch.export.save") from None
    found = []
    with archive:
        for name in archive.namelist():
            rel = name.split("/", 1)[-1]  # entries sit under one top-level folder
            if rel.startswith("data/constants/") and rel.endswith(".pt"):
                found.append(f"{name} (legacy pickled constants)")
            if not rel.endswith("_config.json") or not rel.startswith(("data/weights/", "data/constants/")):
                continue
            try:
                config = json.loads(archive.read(name)).get("config", {})
            except (ValueError, AttributeError) as exc:
                raise BadInput(f"{path}: {name} is not a payload config ({exc})", fix=_FIX) from None
            for fqn, meta in config.items() if isinstance(config, dict) else []:
                path_name = str(meta.get("path_name", "")) if isinstance(meta, dict) else ""
                if (
                    not isinstance(meta, dict)
                    or meta.get("use_pickle")
                    or path_name.startswith(("custom_obj_", "opaque_obj_"))
                ):
                    found.append(f"{fqn} in {name}")
    return found


@contextlib.contextmanager
def _no_unpickling() -> Iterator[None]:
    """torch.load only with weights_only=True (tensors and plain containers, never code); pickle.loads and
    torch's torchbind loader refused. Restored on exit."""
    import pickle

    import torch

    real_load, real_loads, real_obj = torch.load, pickle.loads, torch._C._pickle_load_obj

    def safe_load(f, *args, **kwargs):
        kwargs["weights_only"] = True
        return real_load(f, *args, **kwargs)

    def refuse(*_args, **_kwargs):
        raise UnpicklingRefused("tapeout never unpickles a model archive's payloads")

    torch.load, pickle.loads, torch._C._pickle_load_obj = safe_load, refuse, refuse
    try:
        yield
    finally:
        torch.load, pickle.loads, torch._C._pickle_load_obj = real_load, real_loads, real_obj


def load(path: Path):
    """The ExportedProgram in `path`, loaded without unpickling anything."""
    import torch

    pickled = pickled_entries(path)
    if pickled:
        more = f" and {len(pickled) - 1} more" if len(pickled) > 1 else ""
        raise BadInput(
            f"{path} holds pickled data ({pickled[0]}{more}); tapeout never unpickles a model file", fix=_FIX
        )
    try:
        with _no_unpickling():
            return torch.export.load(str(path))
    except UnpicklingRefused:
        raise BadInput(
            f"{path} asked to unpickle a payload while loading; tapeout never unpickles a model file", fix=_FIX
        ) from None
    except Exception as exc:
        text = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        if "weights_only" in str(exc) or "Unpickling" in type(exc).__name__:
            raise BadInput(
                f"{path} holds a payload that is not a plain tensor ({text}); tapeout never unpickles a model file",
                fix=_FIX,
            ) from None
        raise BadInput(
            f"{path} is not a loadable ExportedProgram ({type(exc).__name__}: {text})",
            fix="save it with torch.export.save",
        ) from None
