"""The inference process: `python -m tapeout.runner REQUEST.json RESULT.json`.

Runs in a fresh interpreter so that cold start is really cold and peak memory is the inference
process's own, not the build's (which holds torch and the exporter). Imports only numpy, the
target's runtime, and tapeout's light modules. What it reads besides time is the target's meters.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tapeout.core import workload
from tapeout.core.errors import TapeoutError


def _timed_loop(call, count: int) -> np.ndarray:
    samples = np.empty(count, dtype=np.float64)
    clock = time.perf_counter_ns
    for i in range(count):  # profiler off: this is the pass budgets are judged on
        t0 = clock()
        call()
        samples[i] = clock() - t0
    return samples / 1e6


def _open(target, name: str, make):
    """The runtime loaded, then `make()` (the session) timed apart: cold start is session creation + the first run,
    and loading the runtime library is reported on its own."""
    t0 = time.perf_counter()
    target.probe().require(name)
    import_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    made = make()
    return made, import_ms, (time.perf_counter() - t0) * 1e3


def measure(request: dict) -> dict:
    from tapeout import targets
    from tapeout.core.artifact import Artifact
    from tapeout.measurement import meters as metering
    from tapeout.records.golden import load_golden
    from tapeout.targets.base import warm_up

    target = targets.create(request["target"], request["options"])
    caps = target.capabilities
    artifact = Artifact(request["target"], Path(request["artifact_dir"]), request["main_file"])
    inputs, _ = load_golden(Path(request["golden"]))
    feeds = inputs[0]

    if request.get("mode") == "op_profile":
        return {"op_profile": target.op_profile(artifact, feeds, request["iterations"]).to_json()}

    meters = metering.create(caps.meters, device_index=request.get("device_index", 0))
    for meter in meters:
        metering.safely(meter, "start")
    try:
        sess, import_ms, create_ms = _open(target, request["target"], lambda: target.session(artifact))
        t0 = time.perf_counter()
        sess.run(feeds)  # the checked call: wrong shapes or dtypes become one clear error here, not a crash later
        first_ms = (time.perf_counter() - t0) * 1e3
        for meter in meters:
            metering.safely(meter, "after_session")

        result: dict = {"import_ms": import_ms, "create_ms": create_ms, "first_ms": first_ms}
        if request.get("outputs_path"):
            outputs = [sess.run(sample) for sample in inputs]
            np.savez(
                request["outputs_path"], **{f"{i}.{k}": v for i, out in enumerate(outputs) for k, v in out.items()}
            )

        call = sess.bind(feeds)
        if caps.timing_sync == "device":  # asynchronous runtimes: a run has ended when the device says so
            bound, sync = call, sess.synchronize

            def call():
                bound()
                sync()

        result["warmup_iters"] = warm_up(
            call, request["warmup_min_iters"], request["warmup_min_s"], request["warmup_max_s"]
        )

        energy = [m for m in meters if m.measures_energy and not m.unavailable]
        for meter in energy:
            metering.safely(meter, "window_start")
        window_start = time.perf_counter()
        samples = _timed_loop(call, request["iterations"])
        runs = samples.size
        # Energy counters update every few ms to 100 ms: extend the window with more runs of the same call.
        while energy and time.perf_counter() - window_start < request.get("energy_window_s", 0.0):
            call()
            runs += 1
        window_s = time.perf_counter() - window_start
        for meter in meters:
            metering.safely(meter, "window_end", runs, window_s)
        result.update(samples_ms=samples.tolist(), timed_wall_s=window_s)

        copies = sess.bind_with_copies(feeds)
        if copies is not None:  # inputs live in device memory: time the host copies too, apart
            for _ in range(min(10, request["iterations"])):
                copies()
            result["samples_e2e_ms"] = _timed_loop(copies, request["iterations"]).tolist()
    finally:
        for meter in meters:
            metering.safely(meter, "close")
    result["meters"] = {m.name: m.result() for m in meters}
    if request.get("then_op_profile"):
        # after every timed run and meter reading, in a session of its own with the profiler on: one process fewer
        # than a pass of its own, and nothing of it reaches the figures above
        sess = call = bound = sync = copies = None  # the timed session let go first (on a GPU, its memory too)
        result["op_profile"] = target.op_profile(
            artifact, feeds, request["then_op_profile"], pace_s=float(np.median(samples)) / 1e3
        ).to_json()
    return result


def workload_frame(request: dict, make: Callable, first: Callable, rest: Callable[[Any], dict]) -> dict:
    """What the workload modes share: the resident-memory meter around the whole process, the session made by
    `make(session)` and timed apart (`_open`), `first(made)` as the cold start's second half, then `rest(made)`'s
    figures. The workload's data is read before this, outside the meter's baseline."""
    from tapeout import targets
    from tapeout.core.artifact import Artifact
    from tapeout.measurement import meters as metering

    target = targets.create(request["target"], request["options"])
    artifact = Artifact(request["target"], Path(request["artifact_dir"]), request["main_file"])
    # the host's resident set always; on a GPU target NVML too, for the device memory the cache or state lives in
    device = ("nvml",) if target.capabilities.device_memory and "nvml" in target.capabilities.meters else ()
    meters = metering.create(("rss", *device), device_index=request.get("device_index", 0))
    for meter in meters:
        metering.safely(meter, "start")
    try:
        made, import_ms, create_ms = _open(target, request["target"], lambda: make(target.session(artifact)))
        first_ms = first(made)
        for meter in meters:
            metering.safely(meter, "after_session")
        result = {"import_ms": import_ms, "create_ms": create_ms, "first_ms": first_ms, **rest(made)}
        for meter in meters:  # NVML samples the device memory again, the cache filled to max_context (its peak kept)
            if meter.name != "rss":
                metering.safely(meter, "after_session")
    finally:
        for meter in meters:
            metering.safely(meter, "close")
    result["meters"] = {m.name: m.result() for m in meters}
    return result


_CRASH_LOG = None  # kept open for faulthandler: it writes to the file's descriptor when the process crashes


def main(argv: list[str]) -> int:
    import faulthandler
    import os

    # A crash in a runtime's native code leaves the Python frame it happened under on stderr; on a copy of fd 2,
    # since sessions redirect fd 2 while a runtime loads (native_output), and a crash there would go to the sink.
    global _CRASH_LOG
    _CRASH_LOG = os.fdopen(os.dup(2), "w")
    faulthandler.enable(file=_CRASH_LOG)
    request_path, result_path = Path(argv[0]), Path(argv[1])
    try:
        request = json.loads(request_path.read_text())
        mode = request.get("mode")
        result = workload.get(mode).child(request) if mode in workload.kinds() else measure(request)
    except TapeoutError as exc:
        result = {"error": str(exc), "exit_code": exc.exit_code, "kind": type(exc).__name__}
    result_path.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
