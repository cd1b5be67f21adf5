"""Backends, one module each, found by name. The table below is data: listing targets imports no runtime."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from pydantic import BaseModel

from tapeout.errors import BadInput


@dataclass(frozen=True)
class TargetInfo:
    name: str
    module: str
    summary: str
    device_classes: tuple[str, ...]
    precisions: tuple[str, ...]
    compiles_on_host: bool
    runs_on_host: bool
    install_hint: str


TARGETS: dict[str, TargetInfo] = {
    "onnxruntime": TargetInfo(
        name="onnxruntime",
        module="tapeout.targets.ort_cpu",
        summary="ONNX Runtime, CPU execution provider; the optimized model is the artifact",
        device_classes=("cpu",),
        precisions=("fp32", "int8", "int4"),
        compiles_on_host=True,
        runs_on_host=True,
        install_hint="pip install onnxruntime",
    ),
    "openvino": TargetInfo(
        name="openvino",
        module="tapeout.targets.ov",
        summary="OpenVINO (Intel CPU, GPU, NPU); OpenVINO IR is the artifact, the compiled blob a cache",
        device_classes=("cpu", "gpu", "npu"),
        precisions=("fp32",),
        compiles_on_host=True,
        runs_on_host=True,
        install_hint='pip install "tapeout[openvino]"',
    ),
    "qnn": TargetInfo(
        name="qnn",
        module="tapeout.targets.qnn",
        summary="Qualcomm Hexagon NPU via ONNX Runtime's QNN EP; EPContext model + context binary for a named SoC",
        device_classes=("npu",),
        precisions=("int8", "fp32"),
        compiles_on_host=True,
        runs_on_host=True,  # through the x86 HTP emulator: parity and placement, not device timings
        install_hint='pip install "tapeout[qnn]"',
    ),
}


def info(name: str) -> TargetInfo:
    try:
        return TARGETS[name]
    except KeyError:
        raise BadInput(f"unknown target '{name}'", fix=f"use one of: {', '.join(TARGETS)}") from None


def load(name: str) -> ModuleType:
    return importlib.import_module(info(name).module)


def emulated(backend: ModuleType) -> str | None:
    """Why this host's timings are not the device's (e.g. QNN's x86 HTP emulator), or None."""
    return backend.emulated() if hasattr(backend, "emulated") else None


def options_model(name: str) -> type[BaseModel]:
    return load(name).Options
