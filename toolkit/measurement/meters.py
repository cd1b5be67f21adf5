"""What the inference process reads besides time, chosen by the target's capabilities (`meters`).

A meter is read at four points of one measurement process: `start` (before the session exists),
`after_session`, and around the timed window (`window_start`, `window_end`). `result()` is a
JSON-able dict with the keys below, so the host side can merge processes without knowing the meter:

    energy_j, window_s, runs     energy over the timed window (the timed runs, extended with more runs of
                                 the same call until the window spans `check.energy_window_s`)
    power_avg_w                  energy_j / window_s
    energy_quantum_j             how far the window's energy can be off from the counter's granularity
                                 and update lag (both reads); bounds the energy per inference
    energy_scope, energy_method  what the counter covers and how it was read
    device_memory_mb, device_memory_scope   peak device memory of this process (GPU meters)
    peak_rss_mb, rss_start_mb, rss_after_session_mb                          (rss)
    device {name, ...}           identity of the device measured (GPU meters)
    state {start, end}           clocks, temperature, throttle reasons
    notes                        caveats worth a line in the report

A meter that cannot read here sets `unavailable` to the reason instead of failing the measurement;
the budget it would feed is then `unmeasured` with that reason.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

REGISTRY = {
    "rss": "tapeout.measurement.meters:RssMeter",
    "rapl": "tapeout.measurement.meters:RaplMeter",
    "nvml": "tapeout.measurement.gpu_meters:NvmlMeter",
    "amdsmi": "tapeout.measurement.gpu_meters:AmdSmiMeter",
    "tegrastats": "tapeout.measurement.tegrastats:TegrastatsMeter",
}


class Meter:
    name = "meter"
    measures_energy = False

    def __init__(self, device_index: int = 0):
        self.device_index = device_index
        self.unavailable: str | None = None
        self.data: dict[str, Any] = {}

    def start(self) -> None: ...

    def after_session(self) -> None: ...

    def window_start(self) -> None: ...

    def window_end(self, runs: int, seconds: float) -> None: ...

    def close(self) -> None: ...

    def result(self) -> dict[str, Any]:
        return {"unavailable": self.unavailable} if self.unavailable else dict(self.data)


def create(names: tuple[str, ...] | list[str], device_index: int = 0) -> list[Meter]:
    meters = []
    for name in names:
        module, _, cls = REGISTRY[name].partition(":")
        meters.append(getattr(importlib.import_module(module), cls)(device_index))
    return meters


def safely(meter: Meter, step: str, *args) -> None:
    """Call one step; a meter that breaks mid-run becomes unavailable with the reason, never a failed measurement."""
    if meter.unavailable:
        return
    try:
        getattr(meter, step)(*args)
    except Exception as exc:
        meter.unavailable = f"{meter.name}: {step} failed ({type(exc).__name__}: {str(exc)[:200]})"


# ---------------------------------------------------------------- host meters


def _status_kb(field: str) -> float | None:
    status = Path("/proc/self/status")
    if not status.is_file():
        return None
    for line in status.read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])
    return None


def peak_rss_mb() -> float:
    hwm = _status_kb("VmHWM")
    if hwm is not None:
        return hwm / 1024
    import resource  # macOS reports bytes, Linux KiB; the /proc path above covers Linux

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


class RssMeter(Meter):
    """Resident memory of the inference process: before the session, after it, and the peak (VmHWM)."""

    name = "rss"

    def start(self) -> None:
        self.data["rss_start_mb"] = rss_mb()

    def after_session(self) -> None:
        self.data["rss_after_session_mb"] = rss_mb()

    def close(self) -> None:
        self.data["peak_rss_mb"] = peak_rss_mb()  # VmHWM only grows: read last, it covers every loop


RAPL_ZONE = Path("/sys/class/powercap/intel-rapl:0")


class RaplMeter(Meter):
    """CPU package energy from RAPL (Intel, and AMD Zen through the same powercap interface)."""

    name = "rapl"
    measures_energy = True

    def __init__(self, device_index: int = 0, zone: Path = RAPL_ZONE):
        super().__init__(device_index)
        self.zone = zone

    def _read_uj(self) -> int:
        return int((self.zone / "energy_uj").read_text())

    def start(self) -> None:
        try:
            self._read_uj()
        except (OSError, ValueError) as exc:
            self.unavailable = (
                f"RAPL: {self.zone / 'energy_uj'} is not readable ({type(exc).__name__}): absent on this "
                "machine (VMs rarely expose it), or root-only since Linux 5.10"
            )

    def window_start(self) -> None:
        self._e0 = self._read_uj()

    def window_end(self, runs: int, seconds: float) -> None:
        delta = self._read_uj() - self._e0
        if delta < 0:  # the counter wrapped once during the window
            delta += int((self.zone / "max_energy_range_uj").read_text())
        joules = delta / 1e6
        self.data.update(
            energy_j=joules,
            window_s=seconds,
            runs=runs,
            power_avg_w=joules / seconds if seconds else None,
            energy_quantum_j=2e-6,
            energy_scope="CPU package (RAPL zone 0): every core and the uncore, not the model alone",
            energy_method="RAPL energy_uj counter read before and after the window",
        )
