"""The build's lockfile: what went in (hashes, versions, profile, seeds) and where it was built."""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tapeout import __version__
from tapeout.types import InputSpec

SCHEMA = "tapeout.manifest/2"
_PACKAGES = ("numpy", "onnx", "onnxruntime", "onnxruntime-gpu", "onnxruntime-qnn", "openvino", "nncf", "nvidia-ml-py",
             "nvidia-modelopt", "tensorrt", "tensorrt-rtx", "onnxscript", "torch", "transformers", "psutil", "pydantic")
_CPU_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_hashes(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): sha256_file(p)
        for p in sorted(Path(directory).rglob("*")) if p.is_file()
    }


def tree_size(directory: Path) -> int:
    return sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())


def package_versions() -> dict[str, str | None]:
    """Installed versions from package metadata: asking never imports torch."""
    found: dict[str, str | None] = {"tapeout": __version__, "python": platform.python_version()}
    for name in _PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def cpu_info() -> tuple[str, frozenset[str]]:
    """This host's CPU model name and instruction-set flags (x86 `flags`, arm64 `Features`), from /proc/cpuinfo."""
    cpu_model, flags = platform.processor() or "", frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return cpu_model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not cpu_model:
            cpu_model = value.strip()
        elif key.strip() in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return cpu_model, flags


def host_fingerprint() -> dict[str, Any]:
    cpu_model, flags = cpu_info()
    return {
        "hostname": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu": cpu_model or platform.machine(),
        "cpu_flags": [f for f in _CPU_FLAGS if f in flags],
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cores": psutil.cpu_count(logical=True),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class _Recorded(BaseModel):
    model_config = ConfigDict(extra="allow")  # a manifest records more than `check` reads


class ArtifactRecord(_Recorded):
    target: str
    main_file: str
    files: dict[str, str] = Field(min_length=1, description="every artifact file and its sha256")
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _main_file_is_hashed(self) -> ArtifactRecord:
        if self.main_file not in self.files:
            raise ValueError(f"main_file {self.main_file!r} is not among the hashed files")
        return self


class FileRecord(_Recorded):
    file: str
    sha256: str


class ProjectRecord(_Recorded):
    name: str
    source: str
    file: str
    # the shapes the build was made at: the estimate in `check` re-derives the model's kernels from them
    inputs: list[InputSpec] = Field(default_factory=list)
    dims: dict[str, int] = Field(default_factory=dict)


class HostRecord(_Recorded):
    """The build machine, as far as `check` compares it with its own."""

    cpu: str | None = None
    cpu_flags: list[str] = Field(default_factory=list)


class ManifestRecord(_Recorded):
    """What `check` reads from manifest.json, validated before any of it is used."""

    artifact: ArtifactRecord
    golden: FileRecord
    report: FileRecord
    project: ProjectRecord
    profile: dict[str, Any]
    device_spec: dict[str, Any] | None = None
    host: HostRecord = HostRecord()
