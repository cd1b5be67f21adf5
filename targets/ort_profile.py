"""Reading ONNX Runtime's profiler output (Chrome trace JSON) into per-node kernel times.

Keeps `cat == "Node"` events named `<node>_kernel_time` and the `model_run` session events;
runs before `skip_runs` are warm-up and dropped (research/profiling-modeling.md §2.1).
"""

from __future__ import annotations

import json
from pathlib import Path

from tapeout.targets.base import OpProfile, OpTime


def parse(trace_file: Path, skip_runs: int = 0) -> OpProfile:
    events = json.loads(Path(trace_file).read_text())
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"), key=lambda e: e["ts"])
    if not runs:
        return OpProfile(runs=0, run_total_us=0.0, ops=[])
    kept = runs[skip_runs:] or runs
    start = kept[0]["ts"]
    ops: dict[str, list] = {}
    for event in events:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time") or event["ts"] < start:
            continue
        args = event.get("args", {})
        node = event["name"][: -len("_kernel_time")]
        entry = ops.setdefault(node, [args.get("op_name", "?"), args.get("provider", "?"), 0, 0.0])
        entry[2] += 1
        entry[3] += float(event.get("dur", 0))
    return OpProfile(
        runs=len(kept),
        run_total_us=float(sum(e.get("dur", 0) for e in kept)),
        ops=[OpTime(node, v[0], v[1], v[2], v[3]) for node, v in ops.items()],
    )
