"""A device's roofs: peak throughput per precision and memory bandwidth, from its spec or from this host.

The estimator and the bottleneck view both divide by these numbers. For a device spec they are the
datasheet's (each with its source URL); for this host's CPU, which has no datasheet here, the peak
is the higher of what the instruction-set flags and the reported clock give and a measured matrix
multiply, the bandwidth is measured (a large array copy), and the roof says so. Calibration
(`fit.py`) corrects both for what the runtime actually reaches, so the derivation only has
to be consistent, not exact.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass, field

import numpy as np

from tapeout.core.host_speed import copy_rates, matmul_rates, ort_conv_rates, ort_matmul_rates, read_rates
from tapeout.core.schemas import DeviceSpec
from tapeout.estimation.strided import Strided
from tapeout.estimation.strided import measured as strided_measured

# When a spec lists no peak for a precision, the kernels run in the nearest one it has.
_FALLBACK = {"int4": ("int8",), "fp8": ("fp16", "int8"), "bf16": ("fp16",), "tf32": ("fp32",),
             "fp16": ("bf16", "fp32"), "int8": ("fp16",), "fp32": ("tf32", "fp16")}

BYTES_PER_ELEMENT = {"fp32": 4.0, "tf32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}

# The precision ladders' mixed rungs: (the format their weights move in, the format they compute in). ORT's 8-bit
# MatMulNBits (`int8-weight`) computes in int8 where the plan gives it integer compute (accuracy_level 4; without
# it the plan keeps such a group FP32); the HTP's A16W8 at its 16-bit rate. In the memory-bound kernels where
# bytes decide (a decode step's matmuls) weights are nearly all the bytes. Priced as FP32, the 8-bit LM head of
# llama-40m's cpu-int4 build (62.6 MB) put the TPOT bound at 3.2 ms where 2.4 ms was measured.
MIXED_RUNGS = {"int8-weight": ("int8", "int8"), "a16w8": ("int8", "fp16")}


def bytes_per_element(precision: str, default: float = 4.0) -> float:
    """Bytes a kernel at `precision` moves per element: a peak format's, a mixed rung's weights'."""
    return BYTES_PER_ELEMENT.get(MIXED_RUNGS.get(precision, (precision,))[0], default)


@dataclass(frozen=True)
class Roof:
    name: str                       # device spec name, or "host-<key>" for this machine's CPU
    kind: str                       # gpu | soc | cpu: the device class calibrations are kept per
    peaks: dict[str, float]         # precision -> FLOP/s (or OP/s)
    bandwidth: float | None         # bytes/s; None where nothing gives it
    source: str                     # where the numbers come from, in words
    notes: list[str] = field(default_factory=list)
    # (working-set bytes, bytes/s) measured for this host's caches, smallest first; none for a device spec
    cache: tuple[tuple[int, float], ...] = ()
    # what an element of a strided scalar loop costs here (a reorder run element by element); none for a device spec
    strided: Strided | None = None
    # bytes/s one thread reads an array past the caches at (a decode step's weights); none where it was not measured
    # (a device spec, a roof kept before it was): data past the caches then moves at `bandwidth`
    stream: float | None = None

    def bandwidth_at(self, working_set: float) -> float | None:
        """The bandwidth data re-read from a working set of this size moves at: the rate of the probe whose copy
        holds that much (log-interpolated; past the largest, the one-thread read stream where it was measured, else
        the DRAM bandwidth), or None where no cache was measured."""
        if not self.cache:
            return None
        # a probe copies an array of its size into another: it holds twice that in the cache (a 2 MiB probe, 4 MiB
        # of L2 and L3, ran at 29 GB/s on an Intel Xeon whose 2 MiB L2 re-read an LSTM's 1 MiB of weights at ~100)
        sizes = np.log([2 * size for size, _ in self.cache])
        rates = [rate for _, rate in self.cache]
        if working_set > 2 * self.cache[-1][0] and (self.stream or self.bandwidth):
            return self.stream or self.bandwidth
        return float(np.interp(np.log(max(working_set, 1.0)), sizes, rates))

    def peak(self, precision: str) -> tuple[float | None, str]:
        """The peak a kernel at `precision` runs against, and which precision's peak that is."""
        precision = MIXED_RUNGS.get(precision, (None, precision))[1]
        if precision in self.peaks:
            return self.peaks[precision], precision
        for other in _FALLBACK.get(precision, ()):
            if other in self.peaks:
                return self.peaks[other], other
        return None, ""

    def ridge(self, precision: str) -> float | None:
        """FLOP per byte at which a kernel turns from memory-bound to compute-bound."""
        peak, _ = self.peak(precision)
        return peak / self.bandwidth if peak and self.bandwidth else None

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "peaks_tops": {k: v / 1e12 for k, v in self.peaks.items()},
                "bandwidth_gbs": self.bandwidth / 1e9 if self.bandwidth else None, "source": self.source,
                "notes": self.notes,
                **({"cache_bandwidth_gbs": [[size, rate / 1e9] for size, rate in self.cache]} if self.cache else {}),
                **({"strided": self.strided.to_json()} if self.strided and self.strided.table else {}),
                **({"stream_gbs": self.stream / 1e9} if self.stream else {})}

    def as_recorded(self) -> Roof:
        """This roof as its JSON reads back: the JSON keeps GB/s and TOPS, and (x / 1e9) · 1e9 is not always x, so a
        build priced at the roof it measured and priced again at the roof its report recorded could differ in the last
        bit (one digits-cnn bound read 0.01096661545599755 ms, then ...7548). Once read back, a value reads back
        unchanged."""
        return Roof.from_json(self.to_json(), self.name)

    @classmethod
    def from_json(cls, data: dict, name: str | None = None, note: str | None = None) -> Roof:
        """The roof `to_json` wrote (a build's report, a sweep, a predictor), under `name`, with `note` added."""
        return cls(name=name or data["name"], kind=data["kind"],
                   peaks={k: v * 1e12 for k, v in data["peaks_tops"].items()},
                   bandwidth=(data.get("bandwidth_gbs") or 0) * 1e9 or None, source=data["source"],
                   notes=[*data.get("notes", []), *([note] if note else [])],
                   cache=tuple((int(s), r * 1e9) for s, r in data.get("cache_bandwidth_gbs") or ()),
                   strided=Strided.from_json(data.get("strided")), stream=(data.get("stream_gbs") or 0) * 1e9 or None)


def from_spec(spec: DeviceSpec) -> Roof:
    return Roof(
        name=spec.name, kind=spec.kind,
        peaks={p: s.value * 1e12 for p, s in spec.peak_dense_tops.items()},
        bandwidth=spec.memory_bandwidth_gbs.value * 1e9,
        source=f"device spec {spec.name} (datasheet peaks, dense; sources in profiles/devices/{spec.name}.toml)",
    )


# FP32 FLOP per cycle per core from the widest FMA the flags name: lanes x 2 (multiply-add), one FMA
# pipe assumed (two-pipe parts reach twice this; calibration absorbs the factor for a given CPU).
_FP32_PER_CYCLE = (("avx512f", 32), ("avx2", 16), ("asimd", 8), ("sse2", 4))


def host_key(host: dict) -> str:
    """One string for the CPU a report's host ran on: model, the flags the kernels key on, the cores used."""
    flags = ",".join(sorted(host.get("cpu_flags") or []))
    return f"{host.get('cpu', '?')}|{flags}|{host.get('cpu_affinity') or host.get('physical_cores') or '?'}c"


def host_name(host: dict) -> str:
    return "host-" + hashlib.sha256(host_key(host).encode()).hexdigest()[:10]


def for_host(host: dict, bandwidth: float | None = None, fp32_peak: float | None = None,
             threads: int | None = None, cache: tuple[tuple[int, float], ...] | None = None,
             measured=None, strided: Strided | None = None, int8_peak: float | None = None) -> Roof:
    """This host's CPU as a roof. `host` is manifest.host_fingerprint() (or a report's `host`);
    `bandwidth`, `fp32_peak` and `int8_peak`, where given (a calibration's, already the peaks of the device it
    was made for), replace what was measured. `measured` (host_roof.Measured) is the measurement kept for this
    host; without it, this process measures. `threads` fewer than the cores: the compute peaks are
    those of that many cores (the bandwidth is a one-thread copy's either way). `strided`, where given (a
    calibration's; `strided.UNMEASURED` for one made before it was measured), replaces the strided loop measured
    here."""
    flags = set(host.get("cpu_flags") or [])
    cores = host.get("cpu_affinity") or host.get("physical_cores") or os.cpu_count() or 1
    mhz = _max_mhz()
    per_cycle = next((n for flag, n in _FP32_PER_CYCLE if flag in flags), 4)
    derived = cores * mhz * 1e6 * per_cycle
    notes = [f"{cores} cores x {mhz:.0f} MHz x {per_cycle} FP32 FLOP/cycle from the flags "
             f"({', '.join(sorted(flags)) or 'none of the FMA flags'}): {derived / 1e9:.0f} GFLOP/s"]
    # INT8 dot products: VNNI/AMX do four 8-bit multiply-adds per 32-bit lane; without them
    # (pmaddubsw + pmaddwd) about two. BF16 dot products (avx512_bf16) two per lane.
    int8_per_fp32 = 4 if flags & {"avx512_vnni", "avx_vnni", "amx_int8", "asimddp"} else 2
    if fp32_peak is None:
        # The derivation assumes one FMA pipe and the reported clock; a core with two pipes, or boosting
        # past the clock /proc/cpuinfo reports, runs faster, and a "lower bound" must not be beaten.
        rate = measured.fp32_flops if measured else measured_fp32_peak()
        fp32_peak = max(derived, rate)
        notes.append(f"FP32 measured here: {rate / 1e9:.0f} GFLOP/s (best of 4, the fastest of a 1536² multiply "
                     "in numpy's BLAS and in ONNX Runtime's MLAS and a 3×3 convolution in MLAS); the peak is the "
                     "higher of that and the flags'")
        # AMX tiles multiply 8-bit matrices far past four per FP32 lane (9.3 times FP32 on an Intel Xeon here):
        # an INT8 roof from the flags alone is beaten by the kernels it bounds
        int8_rate = measured.int8_ops if measured else measured_int8_peak()
        int8_peak = max(fp32_peak * int8_per_fp32, int8_rate)
        notes.append(f"INT8 matrix multiply measured here: {int8_rate / 1e9:.0f} GOP/s (ONNX Runtime's MatMulInteger, "
                     f"uint8 × int8, 1536², best of 4); the INT8 peak is the higher of that and {int8_per_fp32}× "
                     "the FP32 peak")
        if threads and threads < cores:
            # inference on `threads` cores: the others' FMA pipes are not this device's
            fp32_peak *= threads / cores
            int8_peak *= threads / cores
            notes.append(f"{threads} of {cores} cores run inference: the compute peaks are {threads}/{cores} of that")
    int8 = int8_peak or fp32_peak * int8_per_fp32
    peaks = {"fp32": fp32_peak, "int8": int8, "int4": int8}
    if "avx512_bf16" in flags or "amx_bf16" in flags:
        peaks["bf16"] = fp32_peak * 2
    if bandwidth is None:
        bandwidth = measured.bandwidth_bytes if measured else measured_bandwidth()
        notes.append(f"memory bandwidth measured here: {bandwidth / 1e9:.1f} GB/s (array copy, best of 30)")
    notes.append("bytes are priced at DRAM bandwidth: a model whose weights stay in the last-level cache "
                 "between runs can beat its memory roof")
    if cache is None:
        cache = measured.cache if measured else measured_cache_bandwidth()
        notes.append("a recurrent cell's weights, read again every time step, are priced at the copy bandwidth "
                     "measured for their size: " + ", ".join(f"{size // 1024} KiB {rate / 1e9:.0f} GB/s"
                                                             for size, rate in cache))
    if strided is None:
        strided = measured.strided if measured else strided_measured()
    if strided and strided.table:
        notes.append("a reorder run element by element is priced at the strided loop measured here, by the cache "
                     "lines its strided side keeps in one L1 set: " + ", ".join(
                         f"{ratio:.1f}× the ways {seconds * 1e9:.1f} ns" for ratio, seconds in strided.table))
    if measured:
        notes.append(f"the figures measured here were kept on {measured.measured_at} ({measured.path}); every "
                     "estimate on this host uses them until `tapeout calibrate` measures again")
    return Roof(name=host_name(host), kind="cpu", peaks=peaks, bandwidth=bandwidth,
                source=f"this host's CPU ({host.get('cpu', '?')}): peak from its flags or a measured matrix "
                       "multiply, bandwidth measured" + (f" on {measured.measured_at}" if measured else ""),
                notes=notes, cache=tuple(cache), strided=strided)


def _max_mhz() -> float:
    """The cores' top clock (cpufreq where the kernel exposes it, else /proc/cpuinfo's current MHz)."""
    from pathlib import Path

    try:
        return int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) / 1000
    except (OSError, ValueError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1])
    except (OSError, ValueError):
        pass
    return 2000.0


@functools.lru_cache(maxsize=1)
def measured_fp32_peak() -> float:
    """This host's FP32 rate (~0.4 s): the fastest of a 1536² matrix multiply in numpy's BLAS and in ONNX Runtime's
    MLAS and a 3×3 convolution in MLAS's NCHWc kernels, each best of 4. The multiply: 194-209 GFLOP/s over three
    processes on a 2-core AMD EPYC whose flags and reported clock give 166; on another 2-core AMD EPYC (Zen 4), numpy
    249-274 and ONNX Runtime more (one thread: 127 against ~165). The convolution: on a 2-core Intel Xeon (AVX-512)
    a ResNet's 3×3 convolutions ran 203 GFLOP/s on one thread where the multiply reached 151."""
    return max(max(matmul_rates(1536, 4)), max(ort_matmul_rates(1536, 4)), max(ort_conv_rates(4)))


@functools.lru_cache(maxsize=1)
def measured_int8_peak() -> float:
    """This host's INT8 matrix-multiply rate (ONNX Runtime's MatMulInteger, uint8 activations × int8 weights,
    1536², best of 4, ~0.1 s): on a 2-core Intel Xeon with AMX, 1,398 GOP/s on one thread against 151 GFLOP/s FP32."""
    return max(ort_matmul_rates(1536, 4, int8=True))


@functools.lru_cache(maxsize=1)
def measured_stream() -> float:
    """What one thread reads an array past the caches at (256 MiB summed, best of 5, ~0.6 s with the array's writing): a decode step's
    weights stream so, and a copy does not price them. On a 2-core Intel Xeon here: 17.1 GB/s read, against 25.9 for
    the 64 MiB copy (read and write counted) and 16.2 for ONNX Runtime's one-thread GEMV over 256 MB of weights."""
    return max(read_rates(256, 5))


@functools.lru_cache(maxsize=1)
def measured_bandwidth() -> float:
    """This host's copy bandwidth, 64 MiB best of 30. Best of 5 into a fresh array (page faults) ranged
    19.7-23.3 GB/s over five processes on a shared 2-core VM; this, 23.8-24.1 at the same moment. The
    machine itself still swings (24.6-33.4 GB/s within seconds at another): a calibration keeps the
    figure its records were priced with."""
    return max(copy_rates(64, 30))


# Working sets the cache bandwidth is measured at: within L1, L2 and L3 of the CPUs seen here, and past them.
CACHE_PROBE_KIB = (32, 128, 512, 2048, 8192, 32768)


@functools.lru_cache(maxsize=1)
def measured_cache_bandwidth() -> tuple[tuple[int, float], ...]:
    """(bytes, copy bytes/s) for arrays of each CACHE_PROBE_KIB size copied again and again (~0.1 s): what
    data re-read from a working set that size moves at. On the 2-core AMD EPYC here: ~70-95 GB/s up to
    4 MiB, 50 at 16 MiB, 31 at 32 MiB, against 24-25 from DRAM."""
    # at least 8 MiB copied a timing: a 32 KiB copy alone is ~0.4 µs, under the timer's resolution
    return tuple((kib * 1024, max(copy_rates(kib / 1024, 7, max(1, 8192 // kib)))) for kib in CACHE_PROBE_KIB)
