"""The engine cache of device-compiled targets (TensorRT, MIGraphX, AOTInductor on CUDA): `engines/` beside `artifact/` in the
build dir, one engine per key (device, compute capability, toolchain version, driver, ONNX hash,
settings hash), each with a JSON record of its sha256, when it was built and what it is made of.

An engine is code for the GPU: only an engine whose bytes match the record tapeout wrote is loaded.
When there is no engine for the key, `why_build` says what differs from the newest cached one.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from tapeout.core.errors import BadInput, TargetUnavailable
from tapeout.core.files import write_bytes, write_json

ENGINES_DIR = "engines"
SETTINGS_FILE = "engine-settings.json"  # beside the ONNX in artifact/: what the device needs to build the engine
MAX_RECORD_BYTES = 64 << 20
MAX_SETTINGS_BYTES = 1 << 20
LABELS = {
    "gpu": "GPU",
    "compute_capability": "compute capability",
    "toolchain": "toolchain",
    "driver": "driver",
    "onnx_sha256": "ONNX",
    "program_sha256": "program",
    "settings_sha256": "settings",
    "kernel_timings": "kernel timings",
}


@dataclass(frozen=True)
class Entry:
    engine: Path
    record: Path
    relative: str  # the engine's path relative to the build dir


def entry(artifact_dir: Path, key: dict, suffix: str) -> Entry:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    folder = artifact_dir.parent / ENGINES_DIR
    return Entry(folder / f"{digest}{suffix}", folder / f"{digest}.json", f"{ENGINES_DIR}/{digest}{suffix}")


def settings_hash(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def read_settings(artifact_dir: Path, model, schema: str):
    """engine-settings.json from a build dir (a file from elsewhere): confined, bounded, validated by `model`."""
    from pydantic import ValidationError

    from tapeout.core.errors import first_line
    from tapeout.core.paths import confined

    path = confined(artifact_dir, SETTINGS_FILE, "engine settings")
    if not path.is_file() or path.stat().st_size > MAX_SETTINGS_BYTES:
        raise BadInput(f"{path} is missing or too large", fix="copy the whole build dir to the device, or rebuild")
    try:
        return model.model_validate(json.loads(path.read_text()))
    except (ValidationError, json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise BadInput(f"{path} is not a {schema} file ({first_line(exc)})", fix="rebuild") from None


def read_record(path: Path) -> dict | None:
    if not path.is_file() or path.stat().st_size > MAX_RECORD_BYTES:
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("key"), dict) else None


def cached(e: Entry) -> dict | None:
    """The record of a cached engine whose bytes are the ones recorded, else None."""
    record = read_record(e.record)
    if record and e.engine.is_file() and record.get("engine_sha256") == _sha256(e.engine.read_bytes()):
        return record
    return None


def store(e: Entry, engine: bytes, key: dict, **fields) -> None:
    from tapeout.core.host import now

    write_bytes(e.engine, engine)
    write_json(e.record, {"key": key, "engine_sha256": _sha256(engine), "built": now(), **fields})


def load(e: Entry) -> tuple[bytes, dict]:
    """The engine's bytes, verified against its record; one clear line when there is none or it was changed."""
    record = read_record(e.record)
    if record is None or not e.engine.is_file():
        raise TargetUnavailable(
            f"no engine for this device and toolchain in {e.engine.parent}",
            fix="run `tapeout check` on this device: it builds the engine first",
        )
    data = e.engine.read_bytes()
    if _sha256(data) != record.get("engine_sha256"):
        raise BadInput(
            f"{e.engine} differs from the engine tapeout built (sha256 mismatch)",
            fix=f"delete {e.engine.parent} and run `tapeout check` again",
        )
    return data, record


def why_build(folder: Path, key: dict, prepared_for: str | None = None) -> str:
    """Why there is no engine to reuse: none cached yet, or what differs from the newest cached one; and
    whether the toolchain here is another version than the one the ONNX was prepared for."""
    records = []
    if folder.is_dir():
        for path in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime):
            record = read_record(path)
            if record:
                records.append(record["key"])
    why = "no engine cached in this build dir yet"
    if records:
        last = records[-1]
        changed = [f"{LABELS.get(k, k)} {_short(last.get(k))} → {_short(key[k])}" for k in key if last.get(k) != key[k]]
        if changed:
            why = "the cached engine was built for another " + "; ".join(changed)
    if prepared_for:
        installed = re.findall(r"\d+\.\d+", str(key.get("toolchain", "")))
        if installed and _major_minor(installed[0]) != _major_minor(prepared_for):
            why += f"; the ONNX was prepared for {prepared_for}, this device has {installed[0]}"
    return why


def _short(value) -> str:
    text = str(value)
    return text[:12] if re.fullmatch(r"[0-9a-f]{64}", text) else text


def _major_minor(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
