"""Reading ONNX Runtime's profiler output (Chrome trace JSON) into per-node times.

Keeps `cat == "Node"` events named `<node>_kernel_time` from the last `keep_last` `model_run`
session events (the earlier ones are warm-up; research/profiling-modeling.md §2.1). A build of ORT
with CUDA profiling (CUPTI) also writes `cat == "Kernel"` events right after the node that launched
them; when present, a node's time is the sum of its kernels' GPU time instead of its host-side time.
"""

from __future__ import annotations

import json
from pathlib import Path

from tapeout.targets.base import OpProfile, OpTime


def parse(trace_file: Path, keep_last: int | None = None, method: str = "ONNX Runtime profiler") -> OpProfile:
    events = json.loads(Path(trace_file).read_text())
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"), key=lambda e: e["ts"])
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
            entry = host.setdefault(node, [args.get("op_name", "?"), args.get("provider", "?"), 0, 0.0])
            entry[2] += 1
            entry[3] += float(event.get("dur", 0))
        elif event.get("cat") == "Kernel" and node is not None and event.get("ts", 0) >= start:
            kernels[node] = kernels.get(node, 0.0) + float(event.get("dur", 0))
    if kernels:
        method = f"{method}: GPU kernel time per node (CUPTI kernel events)"
        ops = [OpTime(n, v[0], v[1], v[2], kernels.get(n, 0.0)) for n, v in host.items()]
    else:
        ops = [OpTime(n, v[0], v[1], v[2], v[3]) for n, v in host.items()]
    return OpProfile(runs=len(kept), run_total_us=float(sum(e.get("dur", 0) for e in kept)), ops=ops, method=method)
