"""Backends, one module each, found by name. The table below is data: listing targets, validating a
profile and reading capabilities import no runtime and no backend module.

Adding a target = one module with one `Target` subclass, one entry here, and its tests; the contract
test (tests/test_targets.py) runs every entry through the same checks. A target from another package is
one module and one entry point in group `tapeout.targets` naming its `TargetInfo`: `TARGETS` finds it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tapeout.core import plugins
from tapeout.core.artifact import Artifact
from tapeout.core.capabilities import Capabilities
from tapeout.core.errors import BadInput, TargetUnavailable
from tapeout.targets.base import Probe, Session, Target

if TYPE_CHECKING:
    from pydantic import BaseModel


@dataclass(frozen=True)
class TargetInfo:
    name: str
    cls: str  # "module:Class"
    summary: str
    device_classes: tuple[str, ...]
    install_hint: str
    capabilities: Capabilities


_X86 = "HTP emulator on an x86-64 host: timings and memory are the emulator's, not the NPU's"

BUILT_IN: dict[str, TargetInfo] = {
    "onnxruntime": TargetInfo(
        name="onnxruntime",
        cls="tapeout.targets.ort_cpu:OrtCpu",
        summary="ONNX Runtime, CPU execution provider; the optimized model is the artifact",
        device_classes=("cpu",),
        install_hint="pip install onnxruntime",
        capabilities=Capabilities(
            # No FP16 or 16-bit rung on the CPU EP: both run emulated there, slower than FP32.
            precisions={"fp32": ("fp32",), "int8": ("int8", "fp32"), "int4": ("int4", "int8-weight", "fp32")},
            below={"int8": ("int4",)},  # a decoder's LM head at 4 bits, on request (quantize/rules.py)
            rules="cpu-integer",
            meters=("rss", "rapl"),
            op_profiler="ONNX Runtime profiler (CPU EP node times)",
            workloads=("forward", "generate", "stream", "transcribe"),
            # a cache graph's rotary attention as ORT's fused kernel, its cache one buffer the kernel appends to in
            # place, then its sibling projections as one product
            graph_passes=("group-query-attention", "share-kv-buffer", "pack-projections"),
        ),
    ),
    "ort-cuda": TargetInfo(
        name="ort-cuda",
        cls="tapeout.targets.ort_cuda:OrtCuda",
        summary="ONNX Runtime, CUDA execution provider (NVIDIA GPUs); the FP32/FP16 ONNX model is the artifact",
        device_classes=("gpu",),
        install_hint='pip install "tapeout[cuda]", then swap onnxruntime for onnxruntime-gpu (docs/install.md, "On the device")',
        capabilities=Capabilities(
            precisions={"fp32": ("fp32",), "fp16": ("fp16", "fp32")},
            rules="gpu-float",
            meters=("rss", "nvml", "tegrastats"),
            timing_sync="device",
            device_memory=True,
            accelerator="CUDAExecutionProvider",
            # Without CUPTI in the ORT build, node times are launch times; synchronous launches make each
            # node's time include its kernels (the profiling process only; timed runs stay asynchronous).
            op_profiler="ONNX Runtime profiler (CUDA EP)",
            op_profile_env={"CUDA_LAUNCH_BLOCKING": "1"},
            # the KV cache and a stream's state stay in GPU memory between calls (IOBinding); not with cuda_graph
            workloads=("forward", "generate", "stream", "transcribe"),
        ),
    ),
    "openvino": TargetInfo(
        name="openvino",
        cls="tapeout.targets.ov:OpenVino",
        summary="OpenVINO (Intel CPU, GPU, NPU); OpenVINO IR is the artifact, the compiled blob a cache",
        device_classes=("cpu", "gpu", "npu"),
        install_hint='pip install "tapeout[openvino]"',
        # INT8 and INT4 through NNCF; a group the loop moves up runs in the plugin's float precision
        # (INT4 weights move to INT8 weights first)
        capabilities=Capabilities(
            precisions={"int8": ("int8", "fp32"), "int4": ("int4", "int8-weight", "fp32"), "fp32": ("fp32",)},
            rules="ov-integer",
            meters=("rss", "rapl"),
            op_profiler="OpenVINO PERF_COUNT (per-node real time)",
            # generate: the stateful model (the cache in the plugin's state); on the NPU the
            # plugin's static-shape LLM pipeline (NPUW_LLM), prompts padded to max_prompt
            workloads=("forward", "generate", "stream", "transcribe"),
        ),
    ),
    "executorch": TargetInfo(
        name="executorch",
        cls="tapeout.targets.executorch:ExecuTorch",
        summary="ExecuTorch (PyTorch's edge runtime) with the XNNPACK delegate, for Arm and x86 CPUs (phones, boards); "
        "the .pte program lowered from torch.export is the artifact",
        device_classes=("cpu", "phone"),
        install_hint='pip install "tapeout[executorch]" (the device side too: its runtime runs the .pte)',
        # INT8 by PT2E on the program (XNNPACK's quantizer); a group the loop moves up runs in FP32 in XNNPACK
        capabilities=Capabilities(
            precisions={"fp32": ("fp32",), "int8": ("int8", "fp32")},
            rules="xnnpack-integer",
            compiles_from="torch.export",
            meters=("rss",),
            accelerator="XNNPACK",
            op_profiler="ExecuTorch ETDump (XNNPACK's kernels inside the delegate, portable ops)",
        ),
    ),
    "executorch-coreml": TargetInfo(
        name="executorch-coreml",
        cls="tapeout.targets.executorch:ExecuTorchCoreML",
        summary="ExecuTorch with the Core ML delegate (Apple Neural Engine, GPU, CPU): the .pte is lowered here with "
        "coremltools and runs on macOS and iOS only",
        device_classes=("npu", "phone"),
        install_hint='host: pip install "tapeout[executorch]"; device: macOS or iOS with the ExecuTorch runtime',
        # Core ML compiles the model for the device when the program loads there: off Apple hardware the build
        # goes on with its verdicts estimated, and `check` exits 4
        capabilities=Capabilities(
            precisions={"fp32": ("fp32",)},
            compiles_from="torch.export",
            compile_on="device",
            meters=("rss",),
            accelerator="Core ML",
        ),
    ),
    "aoti": TargetInfo(
        name="aoti",
        cls="tapeout.targets.aoti:Aoti",
        summary="AOTInductor (CPU): the torch.export program compiled by Inductor into a .pt2 package of native "
        "code, loaded by torch (the same version) on the device",
        device_classes=("cpu",),
        install_hint="pip install torch, and a C++ compiler on the building host (apt install g++)",
        # INT8 by PT2E on the program (Inductor's x86 quantizer; oneDNN's integer kernels, x86 CPUs only); BF16 by
        # casts around the program's convs and Linear layers (a CPU with BF16 arithmetic)
        capabilities=Capabilities(
            precisions={"fp32": ("fp32",), "int8": ("int8", "fp32"), "bf16": ("bf16", "fp32")},
            rules="x86-inductor",
            compiles_from="torch.export",
            meters=("rss",),
            # a second package with a RecordFunction around each kernel, loaded for it alone
            op_profiler="torch profiler over Inductor's kernel records (an instrumented "
            "package beside the shipped one)",
        ),
    ),
    "aoti-cuda": TargetInfo(
        name="aoti-cuda",
        cls="tapeout.targets.aoti_cuda:AotiCuda",
        summary="AOTInductor on NVIDIA GPUs: the torch.export program is the artifact; Inductor compiles it into a "
        ".pt2 package of Triton kernels on the device at the first check, cached per GPU and toolchain",
        device_classes=("gpu",),
        install_hint="on the device: torch with CUDA (its wheels bring Triton) and a C++ compiler (apt install g++)",
        # BF16 by casts around the program's convs and Linear layers (tensor cores; no FP16 overflow to keep from)
        capabilities=Capabilities(
            precisions={"fp32": ("fp32",), "bf16": ("bf16", "fp32")},
            rules="gpu-inductor",
            compiles_from="torch.export",
            compile_on="device",
            meters=("rss", "nvml"),
            timing_sync="device",
            device_memory=True,
            op_profiler="torch profiler (CUPTI): device time of Inductor's Triton kernels and "
            "the cuBLAS/cuDNN calls between them",
        ),
    ),
    "qnn": TargetInfo(
        name="qnn",
        cls="tapeout.targets.qnn:Qnn",
        summary="Qualcomm Hexagon NPU via ONNX Runtime's QNN EP; EPContext model + context binary for a named SoC",
        device_classes=("npu",),
        install_hint='pip install "tapeout[qnn]"',
        capabilities=Capabilities(
            # Float on the HTP is FP16: a sensitive group goes to 16-bit activations first, FP16 last.
            precisions={"int8": ("int8", "a16w8", "fp16"), "fp32": ("fp32",)},
            rules="npu-integer",
            meters=("rss",),
            emulated_on={"x86_64": _X86, "amd64": _X86},
            accelerator="HTP",
            # HTP int8 tensors are laid out in 32-channel depth tiles (assumed from QNN's layouts; not measured here)
            channel_multiple={"int8": 32, "fp32": 32},
            # generate: the cache graph pinned to one decode step over a cache of max_context slots, each token's
            # key and value written into its slot (StaticCachedDecoder); prompts through a second context binary
            # pinned to [options] prefill_chunk tokens, their first length mod chunk tokens one per call
            workloads=("forward", "generate", "stream"),
            workloads_not={
                "transcribe": "the HTP runs graphs of static shapes, and no static-cache decoder step over an "
                "encoder's cross cache is built yet"
            },
        ),
    ),
    "tensorrt": TargetInfo(
        name="tensorrt",
        cls="tapeout.targets.tensorrt:TensorRT",
        summary="NVIDIA TensorRT (GPUs, Jetson; TensorRT for RTX as a flavour): the ONNX with its precision and the "
        "builder settings are the artifact, the engine is built on the device at the first check and cached",
        device_classes=("gpu",),
        install_hint='on the device: pip install "tapeout[cuda]" tensorrt (docs/install.md, "On the device")',
        capabilities=Capabilities(
            # Strongly typed: FP16 is an FP16 graph, INT8/FP8 explicit Q/DQ with the rest FP16; a group the loop
            # moves up runs FP16 (ModelOpt casts the whole remainder; no per-group FP32 rung there).
            precisions={"fp32": ("fp32",), "fp16": ("fp16", "fp32"), "int8": ("int8", "fp16"), "fp8": ("fp8", "fp16")},
            rules="gpu-qdq",
            compile_on="device",
            meters=("rss", "nvml", "tegrastats"),
            timing_sync="device",
            device_memory=True,
            op_profiler="TensorRT IProfiler (per-layer GPU time)",
            # tensor-core tiles: FP16 MMA shapes take K and N in multiples of 8; INT8/FP8 in multiples of 16
            channel_multiple={"fp32": 8, "fp16": 8, "int8": 16, "fp8": 16},
            workloads_not={
                "generate": "an engine is one static-profile network: decoding runs in TensorRT-LLM or "
                "TensorRT Edge-LLM, which tapeout does not drive",
                "stream": "the engine is built on the device, where no stream loop drives it yet",
                "transcribe": "the engine is built on the device, where no encoder-decoder loop drives it yet",
            },
        ),
    ),
    "migraphx": TargetInfo(
        name="migraphx",
        cls="tapeout.targets.migraphx:MIGraphX",
        summary="AMD GPUs (ROCm) through MIGraphX: the ONNX and its compile settings are the artifact, the program "
        "is compiled on the device at the first check and cached",
        device_classes=("gpu",),
        install_hint='on the device: ROCm and MIGraphX from AMD, then pip install "tapeout[rocm]"',
        capabilities=Capabilities(
            precisions={"fp32": ("fp32",), "fp16": ("fp16", "fp32"), "int8": ("int8", "fp16")},
            rules="gpu-qdq",
            compile_on="device",
            meters=("rss", "amdsmi"),
            workloads_not={
                w: "the program is compiled on the device, where no generation or stream loop drives it yet"
                for w in ("generate", "stream", "transcribe")
            },
        ),
    ),
}


class _Registry(Mapping):
    """The built-in targets, and the plug-ins' (entry points looked up only for a name not built in, or a listing)."""

    GROUP = "tapeout.targets"

    def __init__(self, built_in: dict[str, TargetInfo]):
        self._built_in = built_in

    def _plugin(self, name: str) -> TargetInfo:
        found = plugins.load(self.GROUP, name)
        if not isinstance(found, TargetInfo) or found.name != name:
            raise BadInput(
                f"the target plug-in '{name}' names {found!r}, not a TargetInfo named '{name}'",
                fix="point its entry point at the target's TargetInfo",
            )
        return found

    def __getitem__(self, name: str) -> TargetInfo:
        if name in self._built_in:
            return self._built_in[name]
        if name in plugins.entries(self.GROUP):
            return self._plugin(name)
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return name in self._built_in or name in plugins.entries(self.GROUP)

    def __iter__(self) -> Iterator[str]:
        yield from self._built_in
        yield from sorted(set(plugins.entries(self.GROUP)) - set(self._built_in))

    def __len__(self) -> int:
        return sum(1 for _ in self)


TARGETS: Mapping[str, TargetInfo] = _Registry(BUILT_IN)


def info(name: str) -> TargetInfo:
    try:
        return TARGETS[name]
    except KeyError:
        raise BadInput(f"unknown target '{name}'", fix=f"use one of: {', '.join(TARGETS)}") from None


def target_class(name: str) -> type[Target]:
    module, _, cls = info(name).cls.partition(":")
    return getattr(importlib.import_module(module), cls)


def options_model(name: str) -> type[BaseModel]:
    return target_class(name).Options


def create(name: str, options: dict[str, Any] | BaseModel | None = None) -> Target:
    """The target with its options (validated by its Options model; profiles are validated when loaded,
    so a failure here is a recorded manifest or a caller's dict)."""
    from pydantic import ValidationError

    cls = target_class(name)
    try:
        opts = options if isinstance(options, cls.Options) else cls.Options.model_validate(options or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise BadInput(
            f"options for target '{name}': {'.'.join(map(str, err['loc'])) or '(top level)'}: {err['msg']}",
            fix="fix the profile's [options], or rebuild with this tapeout version",
        ) from None
    return cls(name, info(name).capabilities, opts)


@dataclass(frozen=True)
class Readiness:
    """Whether a target can run on this host: its probe (taken once: a GPU target's creates a CUDA session), and
    where it cannot, the problem — the probe's (not installed) or the preflight's (no device, a library missing)."""

    probe: Probe
    problem: TargetUnavailable | None = None

    @property
    def ready(self) -> bool:
        return self.problem is None

    def require(self) -> None:
        if self.problem is not None:
            raise self.problem


def readiness(target: Target) -> Readiness:
    """The one answer to "can this target run here" that build, check and `tapeout targets` all use."""
    probe = target.probe()
    if not probe.available:
        return Readiness(
            probe,
            TargetUnavailable(
                f"target '{target.name}' is not available here: {probe.reason}", fix=probe.install_hint or None
            ),
        )
    try:
        target.preflight()
    except TargetUnavailable as exc:
        return Readiness(probe, exc)
    return Readiness(probe)


def why_not_here(name: str, options: dict[str, Any] | None = None) -> str | None:
    """None if target `name` can run on this host with `options`, else why not."""
    from tapeout.core.errors import TapeoutError

    try:
        found = readiness(create(name, options))
    except TapeoutError as exc:  # options the target refuses, a preflight that names bad input
        return str(exc)
    return None if found.ready else str(found.problem)


def reference_session(model_path: Path) -> Session:
    """The FP32 reference runtime (ONNX Runtime CPU, basic optimizations), whatever the build's target:
    the reference when the source is ONNX, and where emulated targets' candidates are scored."""
    model_path = Path(model_path)
    return create("onnxruntime", {"graph_optimization": "basic"}).session(
        Artifact("onnxruntime", model_path.parent, model_path.name)
    )
