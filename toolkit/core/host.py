"""The machine a file is written on and the moment: host fingerprint, CPU model and flags, the installed
packages' versions (from metadata: asking never imports torch), and the time in UTC.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any

import psutil

from tapeout import __version__

_PACKAGES = (
    "numpy",
    "onnx",
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-qnn",
    "openvino",
    "nncf",
    "nvidia-ml-py",
    "nvidia-modelopt",
    "tensorrt",
    "tensorrt-rtx",
    "onnxscript",
    "torch",
    "transformers",
    "psutil",
    "pydantic",
)


_CPU_FLAGS = (
    "sse2",
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_int8",
    "amx_bf16",
    "amx_fp16",
    "asimd",
    "asimddp",
)


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
