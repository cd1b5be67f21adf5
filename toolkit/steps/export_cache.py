"""The export cache: a verified torch → ONNX export kept on disk and reused by a later build of the same model, so
`build -p cpu-int8` then `build -p cpu-int4` exports and verifies once.

An entry is keyed by what decides the export: the module's parameters and buffers (bytes), its Hugging Face config,
the project's settings and its small files (the model's code; a file over 4 MiB is data the weights already cover),
the export options, the export-stage graph passes, tapeout's own code, and the versions of torch, onnx, onnxscript,
onnxruntime and transformers. Where it lives: $TAPEOUT_EXPORT_CACHE (`off` turns it off), else
$XDG_CACHE_HOME/tapeout/exports or ~/.cache/tapeout/exports. The MAX_ENTRIES entries used last are kept.

An entry is data, checked before use: each of its files must be a plain file inside it with the size and SHA-256
its record names, and its figures the report's own types; anything else (a crash mid-write, a disk error, an edit)
is a miss, said in one line, and the build exports afresh.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import numpy as np

from tapeout.core.hashing import sha256_file

ENV = "TAPEOUT_EXPORT_CACHE"
RECORD = "entry.json"
MAX_RECORD_BYTES = 16 << 20
SMALL_FILE_BYTES = 4 << 20
MAX_ENTRIES = 8  # the most recently used are kept: a language model's export is its FP32 weights' size
_SKIPPED_DIRS = {"build", "__pycache__", ".git", ".venv"}
_VERSIONED = ("torch", "onnx", "onnxscript", "onnxruntime", "transformers")


def root() -> Path | None:
    """The cache folder, or None where it is turned off."""
    chosen = os.environ.get(ENV)
    if chosen is not None and chosen.strip().lower() in ("off", "0", "no", "false", ""):
        return None
    if chosen:
        return Path(chosen)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tapeout" / "exports"


def key(module, project, options, project_root: Path, pass_names: list[str]) -> str:
    """The entry's name: a digest of everything the export and its verification depend on."""
    digest = hashlib.sha256()

    def add(label: str, value: bytes | str) -> None:
        data = value.encode() if isinstance(value, str) else value
        digest.update(f"{label}:{len(data)}:".encode())
        digest.update(data)

    add("tapeout", _own_code())
    for name in _VERSIONED:
        add(name, _version(name))
    add("options", json.dumps(asdict(options), sort_keys=True, default=str))
    add("passes", json.dumps(sorted(pass_names)))
    add("project", project.model_dump_json())
    for path in _small_files(project_root):
        add(f"file {path.relative_to(project_root)}", sha256_file(path))
    config = getattr(getattr(module, "inner", module), "config", None)
    inner_config = getattr(getattr(getattr(module, "inner", None), "inner", None), "config", None)
    for found in (config, inner_config):
        if found is not None and hasattr(found, "to_json_string"):
            add("config", found.to_json_string())
    import torch

    for name, tensor in (*module.named_parameters(), *module.named_buffers()):
        array = tensor.detach().cpu().contiguous()
        raw = array.reshape(-1).view(torch.uint8).numpy() if array.numel() else b""
        add(f"tensor {name} {array.dtype} {tuple(array.shape)}", raw)  # hashed in place: no copy of the weights
    return digest.hexdigest()[:32]


def load(folder: Path, entry: str, out: Path) -> tuple[dict, list[dict], np.ndarray | None] | str:
    """The entry's export copied into `out`'s folder, with its report section, passes and greedy tokens; or why
    it cannot be used (absent: ""; damaged or foreign: one line)."""
    where = folder / entry
    record_path = where / RECORD
    if not record_path.is_file():
        return ""
    try:
        if record_path.stat().st_size > MAX_RECORD_BYTES:
            return f"{record_path} is over {MAX_RECORD_BYTES >> 20} MiB"
        record = json.loads(record_path.read_text())
        files = record["files"]
        assert isinstance(files, dict) and files and all(isinstance(v, dict) for v in files.values())
        for name, meta in files.items():
            path = where / name
            if (
                Path(name).name != name
                or path.is_symlink()
                or path.resolve().parent != where.resolve()
                or not path.is_file()
            ):
                return f"{where}: its file '{name}' is not a plain file inside the entry"
            if path.stat().st_size != meta["bytes"] or sha256_file(path) != meta["sha256"]:
                return f"{where}: '{name}' does not match its recorded size and SHA-256"
        from tapeout.records.report import ExportInfo

        ExportInfo.model_validate(record["info"])
        passes = record["passes"]
        assert isinstance(passes, list) and all(isinstance(p, dict) for p in passes)
        tokens = record.get("greedy_tokens")
        greedy = None
        if tokens is not None:
            greedy = np.asarray(tokens, dtype=np.int64)
            assert greedy.ndim == 2 and greedy.size and greedy.min() >= 0
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as exc:
        return f"{where}: its record is not one tapeout wrote ({type(exc).__name__})"
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in files:
        shutil.copyfile(where / name, out.parent / name)
    os.utime(record_path)  # used now: the last to be let go
    return record["info"], passes, greedy


def store(folder: Path, entry: str, exported_dir: Path, info: dict, passes: list[dict], greedy_tokens) -> None:
    """The verified export's files and figures as an entry, written whole (a temporary folder renamed into place)."""
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{entry}-", dir=folder))
    try:
        files = {}
        for path in sorted(exported_dir.iterdir()):
            if path.is_file() and not path.is_symlink():
                shutil.copyfile(path, staging / path.name)
                files[path.name] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
        record = {
            "files": files,
            "info": info,
            "passes": passes,
            "greedy_tokens": None if greedy_tokens is None else np.asarray(greedy_tokens).tolist(),
        }
        (staging / RECORD).write_text(json.dumps(record, default=str))
        target = folder / entry
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _let_go(folder)


def _let_go(folder: Path) -> None:
    """All but the MAX_ENTRIES entries used last, and what a build that died while writing one left."""
    entries, now = [], time.time()
    for path in folder.iterdir():
        if path.name.startswith("."):
            if now - path.stat().st_mtime > 3600:
                shutil.rmtree(path, ignore_errors=True)
        elif (path / RECORD).is_file():
            entries.append(((path / RECORD).stat().st_mtime, path))
    for _, path in sorted(entries, reverse=True)[MAX_ENTRIES:]:
        shutil.rmtree(path, ignore_errors=True)


def _small_files(project_root: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(project_root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink() and path.stat().st_size <= SMALL_FILE_BYTES:
                found.append(path)
    return found


@functools.cache
def _own_code() -> str:
    """tapeout's own source, hashed: an export made by other code (an edited checkout) is not reused."""
    import tapeout
    from tapeout import exporters, quantize, targets

    files = {
        p.resolve()
        for package in (tapeout, exporters, quantize, targets)
        for p in Path(package.__file__).parent.rglob("*.py")
    }
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"
