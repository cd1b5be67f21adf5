"""Reading ONNX Runtime's profiler output (Chrome trace JSON) into per-node times.

Keeps `cat == "Node"` events named `<node>_kernel_time` from the last `keep_last` `model_run`
session events (the earlier ones are warm-up; research/profiling-modeling.md §2.1). A build of ORT
with CUDA profiling (CUPTI) also writes `cat == "Kernel"` events right after the node that launched
them; when present, a node's time is the sum of its kernels' GPU time instead of its host-side time.
Host-side times are calls × the median call, and the run total likewise, so one stalled call does
not stand for every run. Each node also carries what it touched (`touched`): shapes, bytes, FLOPs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tapeout.targets.base import OpProfile, OpTime


def parse(trace_file: Path, keep_last: int | None = None, method: str = "ONNX Runtime profiler") -> OpProfile:
    events = json.loads(Path(trace_file).read_text())
    runs = sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"), key=lambda e: e["ts"]
    )
    if not runs:
        return OpProfile(runs=0, run_total_us=0.0, ops=[], method=method)
    kept = runs[-keep_last:] if keep_last else runs
    start = kept[0]["ts"]
    host: dict[str, list] = {}
    kernels: dict[str, float] = {}
    node = None
    for event in events:  # file order: kernel events follow the node event that launched them
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            node = event["name"][: -len("_kernel_time")]
            if event["ts"] < start:
                continue
            args = event.get("args", {})
            entry = host.setdefault(node, [args.get("op_name", "?"), args.get("provider", "?"), 0, [], args])
            entry[2] += 1
            entry[3].append(float(event.get("dur", 0)))
        elif event.get("cat") == "Kernel" and node is not None and event.get("ts", 0) >= start:
            kernels[node] = kernels.get(node, 0.0) + float(event.get("dur", 0))
    if kernels:
        method = f"{method}: GPU kernel time per node (CUPTI kernel events)"
        ops = [OpTime(n, v[0], v[1], v[2], kernels.get(n, 0.0), **touched(v[0], v[4])) for n, v in host.items()]
    else:
        ops = [OpTime(n, v[0], v[1], v[2], _robust_total(v[3]), **touched(v[0], v[4])) for n, v in host.items()]
    return OpProfile(
        runs=len(kept), run_total_us=_robust_total([float(e.get("dur", 0)) for e in kept]), ops=ops, method=method
    )


def _robust_total(durations: list[float]) -> float:
    """Calls × the median call: one call stalled by the OS (a page fault, a preempted thread) would
    otherwise stand for a node's time in every run."""
    return float(np.median(durations)) * len(durations) if durations else 0.0


_MATMULS = {
    "MatMul",
    "FusedMatMul",
    "Gemm",
    "FusedGemm",
    "QGemm",
    "QLinearMatMul",
    "MatMulInteger",
    "MatMulIntegerToFloat",
    "DynamicQuantizeMatMul",
    "MatMulNBits",
}
_CONV_WEIGHT = {"Conv": 1, "FusedConv": 1, "NhwcConv": 1, "NhwcFusedConv": 1, "ConvInteger": 1, "QLinearConv": 3}
_INTEGER = {
    "QGemm",
    "QLinearMatMul",
    "MatMulInteger",
    "MatMulIntegerToFloat",
    "DynamicQuantizeMatMul",
    "QLinearConv",
    "ConvInteger",
}
_DTYPES = {"uint8": "int8", "int8": "int8", "float16": "fp16", "bfloat16": "bf16", "float": "fp32"}
_ITEM_BYTES = {"int64": 8, "int32": 4, "uint8": 1, "int8": 1, "float16": 2, "bfloat16": 2, "float": 4}
_VIEWS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}
_GATHERS = {"Gather", "GatherElements", "GatherND"}


def _shapes(entries) -> tuple:
    return tuple(tuple(int(d) for d in next(iter(e.values()), [])) for e in entries or [] if isinstance(e, dict))


def _dtype(entries) -> str:
    first = next((e for e in entries or [] if isinstance(e, dict)), {})
    return next(iter(first), "")


def touched(op_type: str, args: dict) -> dict:
    """FLOPs, bytes and precision of one ORT node from its profiler args (shapes and byte sizes).

    Weights ORT has prepacked are missing from the recorded input shapes: a Conv's FLOPs are then
    unknown (None), never guessed; a MatMul's are not, since K is the activation's last dim.
    """
    ins, outs = _shapes(args.get("input_type_shape")), _shapes(args.get("output_type_shape"))
    out_elems = int(np.prod(outs[0])) if outs and outs[0] else (1 if outs else 0)
    flops: int | None
    if op_type in _MATMULS:
        flops = 2 * out_elems * ins[0][-1] if ins and ins[0] else None
    elif op_type in _CONV_WEIGHT:
        w = ins[_CONV_WEIGHT[op_type]] if len(ins) > _CONV_WEIGHT[op_type] else ()
        flops = 2 * out_elems * int(np.prod(w[1:])) if len(w) >= 3 else None
    elif op_type in ("Attention", "MultiHeadAttention", "GroupQueryAttention"):
        flops = None
    else:
        flops = out_elems
    precision = (
        "int4"
        if op_type == "MatMulNBits"
        else "int8"
        if op_type in _INTEGER
        else _DTYPES.get(_dtype(args.get("input_type_shape")), "fp32")
    )

    def size(key: str) -> int | None:
        try:
            return int(args[key])
        except (KeyError, TypeError, ValueError):
            return None

    act, params, out = size("activation_size"), size("parameter_size"), size("output_size")
    in_bytes = None if act is None else act + (params or 0)
    if op_type in _VIEWS:
        # ORT's planner lets these alias their input (no copy) unless the input must outlive them: no
        # arithmetic, no traffic; their time is dispatch. Counting in + out made a Reshape "reach" 60x the roof.
        flops, in_bytes, out = 0, 0, 0
    elif op_type in _GATHERS and out is not None and len(ins) > 1:
        # reads the rows it gathers (as many bytes as it writes) and its indices, not the whole table
        # (MiniLM's embedding Gather counted its 47 MB table every run)
        flops = 0
        in_bytes = out + int(np.prod(ins[1])) * _ITEM_BYTES.get(_dtype(args.get("input_type_shape")[1:]), 8)
    return {
        "flops": flops,
        "in_bytes": in_bytes,
        "out_bytes": out,
        "precision": precision,
        "in_shapes": ins,
        "out_shapes": outs,
    }
