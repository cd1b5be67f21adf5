"""The sweep's timing process: `python -m tapeout.measurement.kernel_timer REQUEST.json RESULT.json`.

A fresh interpreter per chunk of a sweep, as every measurement is: it loads each configuration's model on the
target with the sweep's options (ONNX Runtime's CPU EP at the device's thread count), runs it on random inputs
after a warm-up until `min_s` of runs (at least 5), in ROUNDS windows round-robin over the chunk's models, and writes
each model's p10/p50/p90 seconds over all its runs. A uint8 image-shaped
input (a static INT8 CNN's MaxPool reads one) is a quantized feature map (`feature_maps`), not uniform bytes: ONNX
Runtime's 8-bit MaxPool is a compare loop whose time follows the data. The baselines
(an Identity model and Neg chains) are listed first and last, and so timed in every window beside the kernels: what
a run costs without the kernel, subtracted from each model's p50 by the caller.

Then, where the target has a per-node profiler, one profiled pass of `profile_runs` runs or more, kept to the pace
of the timed runs where the profiler reads running counters (OpenVINO: targets/ov_profile.py): the time of the nodes
the runtime inserted around the kernel (`inserted`: ONNX Runtime's layout reorders into and out of its blocked
NCHWc format, which a lone Conv pays on each side and a CNN pays once) is reported per run, and the caller takes
it out of the kernel's time. Where the request asks for `layer_times` (a target whose kernels are timed by its own
profiler: OpenVINO's in-process counters), the rest of the nodes' profiled time a run is reported too
(`profiled`; OpenVINO keeps a node's running mean in whole µs: each kernel's time is known to ±0.5 µs).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np

# Each model is timed in this many windows, round-robin over the chunk's models (the baselines among them), and its
# p50 is over all its windows' runs: where the machine's speed moves within a process, each model's runs span the
# chunk instead of one ~12 ms window. On a 2-core AMD EPYC (Zen 4), 2026-12-01, the one-Identity model's p50 read
# 4.5-4.8 µs in some processes and 6.7-8.5 in others, and switched within one (8.52 before its chunk, 4.69 after);
# the same chunk timed in eight fresh processes each way, its 11 kernels of runs under 15 µs ranged 5.8 µs (the
# median over them) less Identity timed one window a model, 3.3 in four windows, the chunk 3.0 s against 3.2
ROUNDS = 4
MOST_RUNS = 2000  # of a model's runs in all its windows


def _time(call, min_s: float, warm: int = 3, most: int = MOST_RUNS, least: int = 5) -> np.ndarray:
    """Seconds of each run of `call`, after `warm` runs: at least `least`, then until `min_s` or `most` runs."""
    for _ in range(warm):
        call()
    clock, samples, start = time.perf_counter_ns, [], time.perf_counter()
    while len(samples) < least or (time.perf_counter() - start < min_s and len(samples) < most):
        t0 = clock()
        call()
        samples.append(clock() - t0)
    return np.array(samples, dtype=np.float64) / 1e9


def _error(exc: Exception) -> str:
    """A configuration's loss as the caller reports it: the exception's type and its message's first line."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"


def _rounds(calls: dict, min_s: float, rounds: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every call's run times over `rounds` windows of min_s / rounds, round-robin (every other round in reverse, so
    no model always follows the same one), and the error of each call that raised; at least 5 runs each in all, the
    first window after three warm-up runs, each later one after one (a model run since has had the caches)."""
    got: dict[str, list[np.ndarray]] = {key: [] for key in calls}
    failed: dict[str, str] = {}
    least = math.ceil(5 / rounds)
    for r in range(rounds):
        for key in (list(calls) if r % 2 == 0 else list(reversed(calls))):
            if key in failed:
                continue
            try:
                got[key].append(_time(calls[key], min_s / rounds, 3 if r == 0 else 1, MOST_RUNS // rounds, least))
            except Exception as exc:  # a run the runtime refuses is that model's loss, not the chunk's
                failed[key] = _error(exc)
    return {key: np.concatenate(t) for key, t in got.items() if key not in failed and t}, failed


def feature_maps(shape: list[int], rng: np.random.Generator) -> np.ndarray:
    """uint8 maps [N, C, H, W] as a quantized CNN's pool reads them: a random 3×3 conv over three channels of noise
    (an image's pixels), each channel at unit spread plus an offset of spread 2 (a conv's bias and batch norm), ReLU,
    scaled so the 99.5th percentile is 255: as in resnet-m's and cnn-lstm-m's own maps, a channel is anywhere from
    all 0 to none, and about one in ten is (nearly) all 0. ONNX Runtime's 8-bit MaxPool compares in a loop whose
    branches follow the data: a 3×3 stride-2 pool of 64 × 64 × 64 here ran 1182 µs on uniform bytes, about as slow
    on maps whose every channel is half 0, 917 on resnet-m's maps from its golden images and 927-1036 on these (three
    seeds); a 2×2 one of 16 × 16 × 256 ran 142, 66 on cnn-lstm-m's and 78-96 on these. The sweep timed uniform
    bytes before (definition 3) and over-priced the two models' pools by 40-70 %."""
    n, channels, height, width = shape
    noise = rng.random((n, 3, height + 2, width + 2), dtype=np.float32) - 0.5
    patches = np.stack([noise[:, i, dy:dy + height, dx:dx + width] for i in range(3) for dy in range(3)
                        for dx in range(3)], axis=1)  # [N, 27, H, W]: each output's 3×3×3 window
    maps = np.einsum("ck,nkhw->nchw", rng.standard_normal((channels, 27)).astype(np.float32), patches)
    maps /= maps.std(axis=(0, 2, 3), keepdims=True) + 1e-12
    maps = np.maximum(maps + 2 * rng.standard_normal((1, channels, 1, 1)).astype(np.float32), 0)
    scale = float(np.percentile(maps, 99.5)) / 255 or 1.0
    return np.clip(np.rint(maps / scale), 0, 255).astype(np.uint8)


def _feed(spec, item: dict, rng: np.random.Generator) -> np.ndarray:
    """A random input for `spec`: token ids below the item's vocabulary, a uint8 image as quantized feature maps,
    other uint8 tensors as uniform bytes, FP32 from a standard normal (a Softmax's item may mask a share of it)."""
    if spec.dtype == "int64":
        return rng.integers(0, item.get("vocab", 2), size=spec.shape)
    if spec.dtype == "uint8":
        return (feature_maps(list(spec.shape), rng) if len(spec.shape) == 4 else
                rng.integers(0, 256, size=spec.shape, dtype=np.uint8))
    values = rng.standard_normal(spec.shape).astype(np.float32)
    if item.get("masked"):  # a Softmax's mask: the last `masked` percent of each row at float32's lowest, as a
        # padded batch's attention mask puts there (softmax_masks.py)
        width = values.shape[-1]
        values[..., width - round(width * item["masked"] / 100):] = np.finfo(np.float32).min
    return values


def _profiled(target, artifact, feeds: dict, request: dict, pace_s: float) -> tuple[dict[str, float], float | None]:
    """(Seconds per run of each op type the runtime inserted (`request["inserted"]`), the other nodes' profiled
    seconds a run where the request asks for `layer_times`), from a profiled pass of `profile_runs` runs or more,
    kept to the pace of the timed runs (`pace_s`, their p50); ({}, None) where the target has no per-node
    profiler."""
    try:
        profile = target.op_profile(artifact, feeds, request.get("profile_runs", 10), pace_s=pace_s)
    except NotImplementedError:
        return {}, None
    found: dict[str, float] = {}
    rest = 0.0
    # at the pace of the pass's median run: a node's share of the mean run, times the median run. OpenVINO's counters
    # are means, and a lone GRU's run took ~1.3 ms one run in six where the others took ~450 µs, as the timed runs'
    # p50 leaves out and a model's p50 does too
    pace = (profile.median_run_us * profile.runs / profile.run_total_us
            if profile.median_run_us and profile.run_total_us else 1.0)
    for op in profile.ops:
        if not profile.runs:
            continue
        seconds = op.total_us / profile.runs * 1e-6 * pace
        if op.op_type in request.get("inserted", ()):
            found[op.op_type] = found.get(op.op_type, 0.0) + seconds
        else:
            rest += seconds
    return found, (rest if request.get("layer_times") else None)


def main(request_path: str, result_path: str) -> int:
    from tapeout import targets
    from tapeout.core.schemas import InputSpec

    request = json.loads(Path(request_path).read_text())
    target = targets.create(request["target"], request["options"])
    rng = np.random.default_rng(0)
    errors: dict[str, str] = {}
    loaded: dict[str, tuple] = {}  # key: (artifact, feeds)
    calls = {}  # key: its bound run, every model's session open until all are timed
    for item in request["models"]:
        dtypes = item.get("dtypes", {})  # an input not named there is FP32
        specs = [InputSpec(name=n, shape=shape, dtype=dtypes.get(n, "float32")) for n, shape in item["inputs"]]
        folder = Path(item["path"]).parent / (Path(item["path"]).stem + "-compiled")
        try:
            artifact = target.compile(Path(item["path"]), folder, specs, {})
            feeds = {s.name: _feed(s, item, rng) for s in specs}
            calls[item["key"]] = target.session(artifact).bind(feeds)
            loaded[item["key"]] = (artifact, feeds)
        except Exception as exc:  # one configuration the runtime refuses is that point's loss, not the chunk's
            errors[item["key"]] = _error(exc)
    timed, failed = _rounds(calls, request["min_s"], max(1, int(request.get("rounds", ROUNDS))))
    errors.update(failed)
    del calls  # the sessions closed before the profiled passes, which open their own
    out = []
    for item in request["models"]:
        key = item["key"]
        if key in errors:
            out.append({"key": key, "error": errors[key]})
            continue
        artifact, feeds = loaded[key]
        times = timed[key]
        try:
            inserted, profiled = (_profiled(target, artifact, feeds, request, float(np.median(times)))
                                  if item.get("profile") else ({}, None))
        except Exception as exc:
            out.append({"key": key, "error": _error(exc)})
            continue
        out.append({"key": key, "p10": float(np.percentile(times, 10)), "p50": float(np.median(times)),
                    "p90": float(np.percentile(times, 90)), "runs": int(times.size), "inserted": inserted,
                    **({"profiled": profiled} if profiled is not None else {})})
    Path(result_path).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
