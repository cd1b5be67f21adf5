"""Target `toy-ort`: ONNX Runtime's CPU execution provider under another name, registered from outside tapeout."""

from __future__ import annotations

from tapeout.core.capabilities import Capabilities
from tapeout.targets import TargetInfo
from tapeout.targets.ort_cpu import OrtCpu


class ToyOrt(OrtCpu):
    """The CPU EP's compile, session and profiler, inherited; only the name differs."""


TARGET = TargetInfo(
    name="toy-ort",
    cls="tapeout_toys.toy_target:ToyOrt",
    summary="ONNX Runtime's CPU EP under another name (a plug-in target)",
    device_classes=("cpu",),
    install_hint="pip install onnxruntime",
    capabilities=Capabilities(
        precisions={"fp32": ("fp32",)}, meters=("rss",), op_profiler="ONNX Runtime profiler (CPU EP node times)"
    ),
)
