"""A target's capabilities: what differs between backends, as data on its registry entry. The pipeline,
`check`, the precision step and the quantization rules read these, never a target's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class Capabilities:
    """What differs between targets, as data the rest of tapeout reads."""

    # precision -> its ladder for the sensitivity loop, lowest rung first (the precision itself), the last rung float
    precisions: Mapping[str, tuple[str, ...]]
    # precision -> rungs under the ladder's first that a profile's [quantization] overrides may put a group at, where
    # the rule's method writes them (ORT CPU's int8: a decoder's LM head at 4 bits); a plan with a group there has
    # its ladder start at that rung, so the loop moves the group up through the precision itself
    below: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    rules: str | None = None  # the rule set that plans non-fp32 precisions (quantize/rules.py)
    compile_on: Literal["host", "device"] = "host"  # device: engines tied to the GPU and toolchain
    # what `compile` is handed: the verified ONNX file, or the torch.export ExportedProgram (`compile_program`)
    compiles_from: Literal["onnx", "torch.export"] = "onnx"
    meters: tuple[str, ...] = ("rss",)  # what the inference process reads besides time
    timing_sync: Literal["none", "device"] = "none"  # device: a timed run ends with a device sync
    device_memory: bool = False  # inputs/outputs live in device memory; end-to-end timed apart
    emulated_on: Mapping[str, str] = field(default_factory=dict)  # machine -> why timings are not the device's
    accelerator: str | None = None  # what placement counts nodes on (an ORT EP's name: from the op profile)
    op_profiler: str | None = None  # what produces the per-op profile, or None
    op_profile_env: Mapping[str, str] = field(default_factory=dict)  # environment of the profiling process
    channel_multiple: Mapping[str, int] = field(
        default_factory=dict
    )  # precision -> channel count pruning keeps (default 8)
    # the [workload] kinds its sessions run: "generate" needs a session whose decoder() carries the KV cache
    workloads: tuple[str, ...] = ("forward",)
    # a workload it does not run -> why, in words the refusal and `tapeout targets` show
    workloads_not: Mapping[str, str] = field(default_factory=dict)
    # target-stage graph passes (quantize/passes) the compile step runs on the ONNX model before this target
    # compiles it: rewrites into this runtime's own fused ops; each decides from the model whether it applies
    graph_passes: tuple[str, ...] = ()
