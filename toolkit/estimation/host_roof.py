"""This host's CPU roof, measured once and kept: its FP32 and INT8 matrix-multiply rates, copy bandwidth, one
thread's read stream, cache bandwidths and strided loop, written beside the calibrations
(`<calibration folder>/<host name>.roof.json`, schema `tapeout.host-roof/6`) the first time an estimate needs them
and read back by every later one, so the same model estimated twice on this host prices at the same roof.
`tapeout calibrate` measures again (once per calibration) and its calibration keeps the roof its records were
priced at.

Measured every time instead, one digits-cnn build's uncalibrated estimate read 0.0026 ms at build time and 0.0068
ms minutes later on the same shared 2-core VM (the copy bandwidth swings 24.6–33.4 GB/s within seconds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tapeout.core.errors import BadInput
from tapeout.core.files import write_json
from tapeout.core.host import host_fingerprint, now
from tapeout.estimation import roofline, strided
from tapeout.estimation.strided import UNMEASURED, Strided
from tapeout.records.estimate import StridedRecord

# 2: the FP32 rate is the faster of numpy's and ONNX Runtime's multiply (1: numpy's alone, which ONNX Runtime's own
# kernels beat on a Zen 4); 3: the strided loop (`strided.py`); 4: the INT8 multiply's rate (on a CPU with AMX, 9.3
# times FP32 where the flags' 4 was beaten); 5: the FP32 rate also a 3×3 convolution's (MLAS's NCHWc kernels beat its
# multiply by a third on an AVX-512 Xeon); 6: one thread's read stream past the caches (`roofline.measured_stream`). A
# kept file of another format is measured again
SCHEMA = "tapeout.host-roof/6"


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_: str = Field(alias="schema")
    host: str                                       # roofline.host_key of the CPU it was measured on
    measured_at: str
    fp32_flops: float = Field(gt=0)                 # the fastest of numpy's and ONNX Runtime's multiply and a conv
    int8_ops: float = Field(gt=0)                   # ONNX Runtime's uint8 x int8 MatMulInteger
    bandwidth_bytes: float = Field(gt=0)            # array copy, best of 30
    stream_bytes: float = Field(gt=0)               # one thread's read of an array past the caches
    cache: list[tuple[int, float]] = Field(min_length=1)  # (working-set bytes, copy bytes/s)
    strided: StridedRecord | None = None            # strided.Strided.to_json; none where sysfs gives no L1


@dataclass(frozen=True)
class Measured:
    fp32_flops: float
    int8_ops: float
    bandwidth_bytes: float
    cache: tuple[tuple[int, float], ...]
    measured_at: str
    path: Path
    strided: Strided = UNMEASURED
    stream_bytes: float | None = None


def is_here(host: dict) -> bool:
    """Whether `host` (a fingerprint or a report's `host`) is this machine's CPU."""
    return roofline.host_key(host) == roofline.host_key(host_fingerprint())


def path_for(host: dict) -> Path:
    from tapeout.estimation.fit import user_folder

    return user_folder() / f"{roofline.host_name(host)}.roof.json"


def load(host: dict) -> Measured | None:
    """What was kept for `host`; None where nothing was, or where the file is unreadable, of another format or for
    another CPU (a cache: it is measured again and replaced, never trusted as it is)."""
    path = path_for(host)
    try:
        found = _File.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError, RecursionError):
        return None
    if found.schema_ != SCHEMA or found.host != roofline.host_key(host):
        return None
    strided = Strided.from_json(found.strided) or UNMEASURED
    return Measured(found.fp32_flops, found.int8_ops, found.bandwidth_bytes, tuple((int(s), float(r)) for s, r in found.cache),
                    found.measured_at, path, strided, found.stream_bytes)


def measure(host: dict) -> Measured:
    """Measure this host (~1 s, once per process) and keep the figures, replacing what was kept."""
    if not is_here(host):
        raise BadInput(f"cannot measure the CPU {roofline.host_key(host)}: it is not this machine's",
                       fix="estimate it on that machine, or name a device spec (--device)")
    body = _File.model_validate({"schema": SCHEMA, "host": roofline.host_key(host), "measured_at": now(),
                                 "fp32_flops": roofline.measured_fp32_peak(),
                                 "int8_ops": roofline.measured_int8_peak(),
                                 "bandwidth_bytes": roofline.measured_bandwidth(),
                                 "stream_bytes": roofline.measured_stream(),
                                 "cache": [list(c) for c in roofline.measured_cache_bandwidth()],
                                 "strided": strided.measured().to_json()})
    write_json(path_for(host), body.model_dump(by_alias=True))  # two builds measuring at once: each file whole
    return load(host)


def kept_or_measured(host: dict) -> Measured:
    """What was kept for this host, else measured now and kept."""
    return load(host) or measure(host)
