"""The names tapeout's parts agree on, each defined once: precisions a profile asks for, the rungs of a
precision ladder, the meters an inference process reads, and the quantization rule sets. A test checks that
every name the registries and tables use is one of these.
"""

from __future__ import annotations

# What a profile's `precision` may be (a target's capabilities say which of these it takes).
PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")
# The rungs of a sensitivity ladder: a precision plus the in-between steps a group can move to.
RUNGS = ("int4", "int8-weight", "int8", "fp8", "a16w8", "fp16", "bf16", "fp32")
# What an inference process reads besides time (measurement/meters.py registers one meter per name).
METERS = ("rss", "rapl", "nvml", "amdsmi", "tegrastats")
# The number formats a device spec gives a compute peak in (a precision's kernels run at the nearest one).
PEAK_FORMATS = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4")
# The quantization rule tables (quantize/rules.py), one per kind of hardware.
RULE_SETS = (
    "cpu-integer",
    "npu-integer",
    "gpu-float",
    "gpu-qdq",
    "ov-integer",
    "xnnpack-integer",
    "x86-inductor",
    "gpu-inductor",
)
