"""Every path read from a file is confined: a relative path that stays inside the folder it belongs to,
through no symlink. One helper for all of them (external-data locations in an ONNX model, file names
in a manifest), and the ONNX copy that uses it.

Standard library only (onnx is imported inside the copy): every layer may use it.
"""

from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath

from tapeout.errors import BadInput


def confined(base: Path, relative: str, what: str) -> Path:
    """`base / relative`, or one clear line if `relative` is absolute, climbs out with '..', or passes
    through a symlink (a link inside the folder may point anywhere)."""
    rel = PurePosixPath(str(relative).replace("\\", "/"))
    if not str(relative) or rel.is_absolute() or ".." in rel.parts or rel.parts[:1] == ("",):
        raise BadInput(f"{what} '{relative}' is not a plain relative path inside {base}",
                       fix="paths in model and build files stay inside their folder: no absolute paths, no '..'")
    path = base
    for part in rel.parts:
        path = path / part
        if path.is_symlink():
            raise BadInput(f"{what} '{relative}' passes through the symlink {path}",
                           fix="replace the link with the file itself; tapeout never follows links out of a folder")
    return base / Path(*rel.parts)


def external_data_files(model_path: Path) -> list[str]:
    """The external-data locations an ONNX model names (models over 2 GB keep their weights beside the graph)."""
    import onnx

    header = onnx.load(str(model_path), load_external_data=False)
    tensors = [*header.graph.initializer, *(n.attribute[0].t for n in header.graph.node
                                            if n.op_type == "Constant" and n.attribute and n.attribute[0].HasField("t"))]
    return sorted({entry.value for tensor in tensors if tensor.data_location == onnx.TensorProto.EXTERNAL
                   for entry in tensor.external_data if entry.key == "location"})


def copy_onnx(model_path: Path, target: Path) -> list[Path]:
    """Copy a model and every external-data file it names, each confined to the model's folder and a
    regular file; returns the files written. Nothing is followed out of the folder, nothing is missed."""
    written = []
    sources = []
    for location in external_data_files(model_path):
        source = confined(model_path.parent, location, f"{model_path.name}: external data")
        if not source.is_file():
            raise BadInput(f"{model_path.name} names external data '{location}', which is not a file in "
                           f"{model_path.parent}", fix="copy the weights file beside the model")
        sources.append((location, source))
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_path, target)
    written.append(target)
    for location, source in sources:
        destination = target.parent / location
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, destination)
        written.append(destination)
    return written
