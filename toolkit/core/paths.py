"""Every path read from a file is confined: a relative path that stays inside the folder it belongs to,
through no symlink. One helper for all of them (external-data locations in an ONNX model, file names
in a manifest), and the ONNX copy that uses it.

Standard library only (onnx is imported inside the copy): every layer may use it.
"""

from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath

from tapeout.core.errors import BadInput
from tapeout.core.onnx_graphs import bodies


def resolved(path: Path | str, what: str, fix: str) -> Path:
    """A path the user named, made absolute: a symlink loop (RuntimeError before Python 3.13, OSError after) or a
    name the filesystem refuses is one line naming it."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError, ValueError) as exc:
        raise BadInput(f"{what} {path} cannot be opened: {exc}", fix=fix) from None


def confined(base: Path, relative: str, what: str) -> Path:
    """`base / relative`, or one clear line if `relative` is absolute, climbs out with '..', or passes
    through a symlink (a link inside the folder may point anywhere)."""
    rel = PurePosixPath(str(relative).replace("\\", "/"))
    if not str(relative) or rel.is_absolute() or ".." in rel.parts or rel.parts[:1] == ("",):
        raise BadInput(
            f"{what} '{relative}' is not a plain relative path inside {base}",
            fix="paths in model and build files stay inside their folder: no absolute paths, no '..'",
        )
    path = base
    for part in rel.parts:
        path = path / part
        if path.is_symlink():
            raise BadInput(
                f"{what} '{relative}' passes through the symlink {path}",
                fix="replace the link with the file itself; tapeout never follows links out of a folder",
            )
    return base / Path(*rel.parts)


def external_data_files(model_path: Path) -> list[str]:
    """The external-data locations an ONNX model names (models over 2 GB keep their weights beside the graph),
    from every tensor it holds: initializers, sparse ones, node attributes, in subgraphs and functions too."""
    import onnx

    header = onnx.load(str(model_path), load_external_data=False)
    return sorted(
        {
            entry.value
            for tensor in _all_tensors(header)
            if tensor.data_location == onnx.TensorProto.EXTERNAL
            for entry in tensor.external_data
            if entry.key == "location"
        }
    )


def _all_tensors(model):
    def of_sparse(sparse):
        yield sparse.values
        yield sparse.indices

    def of_nodes(nodes):
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("sparse_tensor"):
                    yield from of_sparse(attr.sparse_tensor)
                for sparse in attr.sparse_tensors:
                    yield from of_sparse(sparse)
            for _, body in bodies(node):
                yield from of_graph(body)

    def of_graph(graph):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield from of_sparse(sparse)
        yield from of_nodes(graph.node)

    yield from of_graph(model.graph)
    for function in model.functions:
        yield from of_nodes(function.node)


def copy_onnx(model_path: Path, target: Path) -> list[Path]:
    """Copy a model and every external-data file it names, each confined to the model's folder and a
    regular file; returns the files written. Nothing is followed out of the folder, nothing is missed."""
    written = []
    sources = []
    for location in external_data_files(model_path):
        source = confined(model_path.parent, location, f"{model_path.name}: external data")
        if not source.is_file():
            raise BadInput(
                f"{model_path.name} names external data '{location}', which is not a file in {model_path.parent}",
                fix="copy the weights file beside the model",
            )
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
