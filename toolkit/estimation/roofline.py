"""A device's roofs: peak throughput per precision and memory bandwidth, from its spec or from this host.

The estimator and the bottleneck view both divide by these numbers. For a device spec they are the datasheet's
(each with its source URL). For this host's CPU, which has no datasheet here, they are ceilings, so that the sum
over kernels is a lower bound a measurement does not beat: per precision, the cores times the most the widest
unit its flags name does per cycle (two pipes: AMX tiles, VNNI, AVX-512 FMA) at the higher of the reported clock
and the clock its measured FP32 rate implies, or the measured rate where higher; bandwidth per working set, the
fastest one-thread copy measured at that footprint times the cores (`host_probes.py`). Calibration (`fit.py`)
scales each class back to what the runtime reaches.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from tapeout.core.schemas import DeviceSpec

# When a spec lists no peak for a precision, the kernels run in the nearest one it has.
_FALLBACK = {
    "int4": ("int8",),
    "fp8": ("fp16", "int8"),
    "bf16": ("fp16",),
    "tf32": ("fp32",),
    "fp16": ("bf16", "fp32"),
    "int8": ("fp16",),
    "fp32": ("tf32", "fp16"),
}

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
    name: str  # device spec name, or "host-<key>" for this machine's CPU
    kind: str  # gpu | soc | cpu: the device class calibrations are kept per
    peaks: dict[str, float]  # precision -> FLOP/s (or OP/s)
    bandwidth: float | None  # bytes/s; None where nothing gives it
    source: str  # where the numbers come from, in words
    notes: list[str] = field(default_factory=list)
    # (footprint bytes, bytes/s) for this host's caches, smallest first, never rising; none for a device spec
    cache: tuple[tuple[int, float], ...] = ()

    def bandwidth_at(self, working_set: float) -> float | None:
        """The most bandwidth data in a working set of this size can move at: the rate at the largest footprint
        measured that it does not exceed (the smallest's under it), so a working set between two levels is priced
        at the faster; the roof's bandwidth where no cache was measured."""
        if not self.cache:
            return self.bandwidth
        fits = [rate for size, rate in self.cache if size <= working_set]
        return fits[-1] if fits else self.cache[0][1]

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
        return {
            "name": self.name,
            "kind": self.kind,
            "peaks_tops": {k: v / 1e12 for k, v in self.peaks.items()},
            "bandwidth_gbs": self.bandwidth / 1e9 if self.bandwidth else None,
            "source": self.source,
            "notes": self.notes,
            **({"cache_bandwidth_gbs": [[size, rate / 1e9] for size, rate in self.cache]} if self.cache else {}),
        }

    def as_recorded(self) -> Roof:
        """This roof as its JSON reads back: the JSON keeps GB/s and TOPS, and (x / 1e9) · 1e9 is not always x, so a
        build priced at the roof it measured and priced again at the roof its report recorded could differ in the last
        bit (one digits-cnn bound read 0.01096661545599755 ms, then ...7548). Once read back, a value reads back
        unchanged."""
        return Roof.from_json(self.to_json(), self.name)

    @classmethod
    def from_json(cls, data: dict, name: str | None = None, note: str | None = None) -> Roof:
        """The roof `to_json` wrote (a build's report, a calibration), under `name`, with `note` added."""
        return cls(
            name=name or data["name"],
            kind=data["kind"],
            peaks={k: v * 1e12 for k, v in data["peaks_tops"].items()},
            bandwidth=(data.get("bandwidth_gbs") or 0) * 1e9 or None,
            source=data["source"],
            notes=[*data.get("notes", []), *([note] if note else [])],
            cache=tuple((int(s), r * 1e9) for s, r in data.get("cache_bandwidth_gbs") or ()),
        )


def from_spec(spec: DeviceSpec) -> Roof:
    return Roof(
        name=spec.name,
        kind=spec.kind,
        peaks={p: s.value * 1e12 for p, s in spec.peak_dense_tops.items()},
        bandwidth=spec.memory_bandwidth_gbs.value * 1e9,
        source=f"device spec {spec.name} (datasheet peaks, dense; sources in profiles/devices/{spec.name}.toml)",
    )


# Operations per cycle per core of the widest unit each flag names, two pipes where the cores have two (a ceiling:
# no core does more), by precision; the first flag a host has decides.
PER_CYCLE = {
    "fp32": (("avx512f", 64), ("avx2", 32), ("fma", 32), ("asimd", 16), ("sse2", 8)),
    "int8": (
        ("amx_int8", 2048),
        ("avx512_vnni", 256),
        ("avx512bw", 256),
        ("avx_vnni", 128),
        ("avx2", 128),
        ("asimddp", 64),
        ("asimd", 32),
        ("sse2", 32),
    ),
    "bf16": (("amx_bf16", 1024), ("avx512_bf16", 128)),
    "fp16": (("amx_fp16", 1024), ("avx512_fp16", 128)),
}


def host_key(host: dict) -> str:
    """One string for the CPU a report's host ran on: model, the flags the kernels key on, the cores used."""
    flags = ",".join(sorted(host.get("cpu_flags") or []))
    return f"{host.get('cpu', '?')}|{flags}|{host.get('cpu_affinity') or host.get('physical_cores') or '?'}c"


def host_name(host: dict) -> str:
    return "host-" + hashlib.sha256(host_key(host).encode()).hexdigest()[:10]


def cpu_class(host: dict) -> str:
    """The class of CPU a calibration carries to (`cpu-<vendor>-<tier>`): the same vendor and widest units run the
    runtimes' same kernels, so their efficiencies against the roof carry, whatever the clock, cores and caches."""
    flags = set(host.get("cpu_flags") or [])
    name = (host.get("cpu") or "").lower()
    vendor = (
        "intel"
        if "intel" in name
        else "amd"
        if "amd" in name or "epyc" in name or "ryzen" in name
        else "arm"
        if "asimd" in flags
        else "other"
    )
    tier = (
        "amx"
        if "amx_int8" in flags
        else "avx512"
        if "avx512f" in flags
        else "avx2"
        if "avx2" in flags
        else "neon"
        if "asimd" in flags
        else "base"
    )
    return f"cpu-{vendor}-{tier}"


def per_cycle(flags: set[str], precision: str) -> int | None:
    return next((n for flag, n in PER_CYCLE[precision] if flag in flags), None)


def for_host(host: dict, probes=None, threads: int | None = None) -> Roof:
    """This host's CPU as a roof of ceilings (see the module's docstring). `host` is host_fingerprint() (or a
    report's `host`); `probes` (host_probes.Probes) its measured one-thread rates, without which the flags and the
    reported clock alone give the peaks and no bandwidth is known. `threads` fewer than the cores: that many cores."""
    flags = set(host.get("cpu_flags") or [])
    cores = host.get("cpu_affinity") or host.get("physical_cores") or os.cpu_count() or 1
    if threads and threads < cores:
        cores = threads
    mhz = _max_mhz()
    fp32_cycle = per_cycle(flags, "fp32") or 8
    measured = {"fp32": probes.fp32_flops, "int8": probes.int8_ops} if probes else {}
    # a core boosting past the reported clock: the clock its measured FP32 rate implies, at two FMA pipes
    clock = max(mhz * 1e6, measured.get("fp32", 0.0) / fp32_cycle)
    peaks = {}
    for precision in PER_CYCLE:
        n = per_cycle(flags, precision)
        if n or precision in measured:
            peaks[precision] = cores * max((n or 0) * clock, measured.get(precision, 0.0))
    peaks["int4"] = peaks["int8"]
    notes = [
        f"{cores} core(s) at {clock / 1e9:.2f} GHz (the reported {mhz:.0f} MHz, or the clock the measured FP32 "
        "rate implies where higher); per precision the widest unit the flags name, two pipes: "
        + ", ".join(f"{p} {per_cycle(flags, p)}/cycle" for p in PER_CYCLE if per_cycle(flags, p))
    ]
    cache: tuple[tuple[int, float], ...] = ()
    bandwidth = None
    if probes:
        notes.append(
            f"one thread measured here: FP32 {probes.fp32_flops / 1e9:.0f} GFLOP/s, INT8 "
            f"{probes.int8_ops / 1e9:.0f} GOP/s; the peak is the higher of that and the flags', per core"
        )
        # a smaller footprint is never slower than a larger one: a noisy probe below a larger one's rate is raised to it
        rates = sorted((size, rate * cores) for size, rate in probes.copy)
        cache = tuple((size, max(r for _, r in rates[i:])) for i, (size, _) in enumerate(rates))
        bandwidth = cache[-1][1]
        notes.append(
            "bytes move at the fastest one-thread copy measured at their working set's footprint, times the "
            "cores: " + ", ".join(f"{size // 1024} KiB {rate / 1e9:.0f} GB/s" for size, rate in cache)
        )
        if probes.measured_at:
            notes.append(
                f"the highest of every measurement kept for this CPU ({probes.path}); `tapeout calibrate` "
                "measures again"
            )
    return Roof(
        name=host_name(host),
        kind="cpu",
        peaks=peaks,
        bandwidth=bandwidth,
        source=f"this host's CPU ({host.get('cpu', '?')}): ceilings from its flags, clock and probes",
        notes=notes,
        cache=cache,
    )


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
