"""This host's CPU measured against itself: one thread's FP32 and INT8 multiply rates, an FP32 convolution's, and
copy rates at working sets from L1 to past the last-level cache. They feed the host's roof (`roofline.for_host`).

A lower bound must not be beaten, and a busy minute measures a machine slower than it is: every figure is the best
of many short timings, and the file kept beside the calibrations (`<calibration folder>/<host name>.probes.json`)
keeps, figure by figure, the highest ever measured on this CPU. A new measurement can only raise it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tapeout.core.files import write_json
from tapeout.core.host import host_fingerprint, now
from tapeout.core.host_speed import matmul_graph, ort_session

SCHEMA = "tapeout.host-probes/1"
# copy footprints (source + destination), 4x apart: inside L1, L2 and L3 of the CPUs seen here, and past them
FOOTPRINTS_KIB = (32, 128, 512, 2048, 8192, 32768, 131072, 524288)
SECONDS = 0.2  # per probe: ~2 s in all
MAX_RATE = 1e15


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    schema_: str = Field(alias="schema")
    host: str  # roofline.host_key of the CPU it was measured on
    measured_at: str
    # one thread's rates, bounded far above any CPU core's (about 1e11 flop/s, 1e11 B/s) and far below float's
    # range: a cache edited to 1e300 is not a CPU, and drew an OverflowError in the report
    fp32_flops: float = Field(gt=0, le=MAX_RATE)  # one thread: the faster of a multiply and a convolution
    int8_ops: float = Field(gt=0, le=MAX_RATE)  # one thread: uint8 x int8 MatMulInteger
    copies: list[tuple[int, float]] = Field(min_length=1)  # (footprint bytes, one thread's copy bytes/s)


@dataclass(frozen=True)
class Probes:
    fp32_flops: float
    int8_ops: float
    copy: tuple[tuple[int, float], ...]
    measured_at: str = ""
    path: Path | None = None


def _best(run, work: float, seconds: float = SECONDS) -> float:
    """`work` per second of the fastest of as many calls of `run` as fit in `seconds` (after one warm-up)."""
    run()
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return work / best


def _ort(graph, feeds: dict[str, np.ndarray]):
    session = ort_session(graph, threads=1)
    return lambda: session.run(None, feeds)


def _matmul(n: int, int8: bool) -> float:
    graph, feeds = matmul_graph(n, int8)
    return _best(_ort(graph, feeds), 2 * n**3)


def _conv() -> float:
    """A 3x3 convolution, 64 channels over 28x28: MLAS's blocked direct convolution can beat its own GEMM."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((64, 64, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 28, 28])],
        [weight],
    )
    feeds = {"x": rng.standard_normal((1, 64, 28, 28)).astype(np.float32)}
    return _best(_ort(graph, feeds), 2 * 64 * 64 * 9 * 28 * 28)


def _copy(footprint_kib: int) -> float:
    """Bytes read and written per second copying an array of half the footprint into another, on one thread."""
    src = np.ones(footprint_kib * 1024 // 16)
    dst = np.zeros_like(src)
    repeat = max(1, 8192 // footprint_kib)  # at least ~8 MiB a timing: a 32 KiB copy alone is under the timer's grain
    return _best(
        lambda: [np.copyto(dst, src) for _ in range(repeat)],
        2 * src.nbytes * repeat,
        SECONDS / 2 if footprint_kib < 65536 else SECONDS,
    )


def measure() -> Probes:
    """Every probe once on this host (~2 s)."""
    fp32 = max(_matmul(512, False), _conv())
    int8 = _matmul(512, True)
    return Probes(fp32, int8, tuple((kib * 1024, _copy(kib)) for kib in FOOTPRINTS_KIB), now())


def path_for(host: dict) -> Path:
    from tapeout.estimation.fit import user_folder
    from tapeout.estimation.roofline import host_name

    return user_folder() / f"{host_name(host)}.probes.json"


def load(host: dict) -> Probes | None:
    """What was kept for `host`; None where nothing was, or where the file is unreadable, of another format or for
    another CPU (a cache: measured again and replaced, never trusted as it is)."""
    from tapeout.estimation.roofline import host_key

    path = path_for(host)
    try:
        found = _File.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError, RecursionError):
        return None
    if (
        found.schema_ != SCHEMA
        or found.host != host_key(host)
        or any(not 0 < r <= MAX_RATE or not 0 < size <= 1 << 40 for size, r in found.copies)
    ):
        return None
    return Probes(
        found.fp32_flops, found.int8_ops, tuple((int(s), float(r)) for s, r in found.copies), found.measured_at, path
    )


def is_here(host: dict) -> bool:
    from tapeout.estimation.roofline import host_key

    return host_key(host) == host_key(host_fingerprint())


def kept(host: dict, again: bool = False) -> Probes:
    """This host's probes: what was kept, else measured now; `again` measures and raises what was kept, figure by
    figure (`tapeout calibrate` does, so every calibration lifts the roof toward what the CPU can do)."""
    from tapeout.estimation.roofline import host_key

    old = load(host)
    if old is not None and not again:
        return old
    new = measure()
    if old is not None:
        rates = dict(old.copy)
        new = Probes(
            max(old.fp32_flops, new.fp32_flops),
            max(old.int8_ops, new.int8_ops),
            tuple((size, max(rate, rates.get(size, 0.0))) for size, rate in new.copy),
            new.measured_at,
        )
    path = path_for(host)
    write_json(
        path,
        {
            "schema": SCHEMA,
            "host": host_key(host),
            "measured_at": new.measured_at,
            "fp32_flops": new.fp32_flops,
            "int8_ops": new.int8_ops,
            "copies": [list(c) for c in new.copy],
        },
    )
    return Probes(new.fp32_flops, new.int8_ops, new.copy, new.measured_at, path)
