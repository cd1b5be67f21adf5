"""What ONNX Runtime runs around a lone swept kernel besides the kernel, which a sweep point's time must not keep:
around a static INT8 kernel the activation's Q and DQ (and around a QLinearConv the Transposes into and out of NHWC),
around a blocked (NCHWc) FP32 conv or MaxPool the layout reorders into and out of its blocked layout. A model pays
these where its graph has them, and the estimate prices them there as kernels of their own
(`runtime_graph.quantized_kernels`, `runtime_graph.reorder_kernels`); so a point is trained on its time less them as
the predictors price them (`commands/sweep._train`), not as the profiler records them: it records each at whole
microseconds and its own cost (1-2 µs where a small one runs in ~0.3), and taken out as profiled they left a small
kernel's time at nothing or below it (a 96-channel 8 × 8 depthwise conv at −1.3 µs)."""

from __future__ import annotations

# the nodes `wrapper_kernels` sizes, by the op type the sweep's profiled pass records them under (`inserted_s`)
QDQ = ("QuantizeLinear", "DequantizeLinear", "Transpose")
REORDERS = ("ReorderInput", "ReorderOutput")
OPS = QDQ + REORDERS
_FP32_BYTES = 4


def wrapper_kernels(point: dict, target: str = "onnxruntime") -> list[tuple[str, float, float, str]]:
    """(class, FLOPs, bytes, op) of the nodes ONNX Runtime ran around a swept point's kernel, sized from its
    configuration as the estimate sizes a model's: a Q or DQ a `quantize` kernel of 5 bytes an element, a Transpose
    of 8-bit elements or a reorder of FP32 ones a movement kernel reading and writing them (a reorder only where
    the point's profiled pass found it: ONNX Runtime blocks some channel counts, not others). [] for any other
    point."""
    from tapeout.estimation.predictor import QUANTIZED_BY

    if target != "onnxruntime":
        return []
    if point.get("precision") == "fp32" and point["op"] in ("Conv", "MaxPool"):
        into, out = _activations(point)
        found = point.get("inserted_s") or {}
        return [("movement", 0.0, 2.0 * _FP32_BYTES * size, op)
                for op, size in (("ReorderInput", into), ("ReorderOutput", out)) if op in found]
    c = point["config"]
    method = point.get("quantization") or QUANTIZED_BY.get(target, {}).get(point["cls"])  # a point before the field
    if point.get("precision") != "int8" or method != "static" or point["op"] not in ("Conv", "Gemm"):
        return []
    if point["op"] == "Gemm":
        into, out = c["m"] * c["k"], c["m"] * c["n"]
        return [("quantize", into, 5.0 * into, "QuantizeLinear"), ("quantize", out, 5.0 * out, "DequantizeLinear")]
    into, out = _activations(point)
    return [("quantize", into, 5.0 * into, "QuantizeLinear"), ("movement", 0.0, 2.0 * into, "Transpose"),
            ("movement", 0.0, 2.0 * out, "Transpose"), ("quantize", out, 5.0 * out, "DequantizeLinear")]


def _activations(point: dict) -> tuple[int, int]:
    """The elements of a swept 2-D Conv's or MaxPool's input and output, as `sweep.model` builds it: a conv padded
    to keep its size at stride 1 (k // 2 a side), a 3 × 3 pool padded 1 a side and a 2 × 2 one not at all."""
    c = point["config"]
    hw, wide = int(c["hw"]), int(c.get("wide", 1))
    into = int(c["c"]) * hw * hw * wide
    if point["op"] == "Conv":
        stride = int(c["stride"])
        return into, int(c["co"]) * -(-hw // stride) * -(-hw * wide // stride)
    k, stride = int(c.get("k", 3)), int(c.get("stride", 2))
    side = (hw + 2 * (1 if k == 3 else 0) - k) // stride + 1
    return into, int(c["c"]) * side * side
