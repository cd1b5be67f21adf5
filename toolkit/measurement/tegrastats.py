"""Jetson power from `tegrastats`: its lines parsed, and a sampler run beside the timed window.

Jetsons have no NVML energy counter; tegrastats prints the on-module INA3221 rails once per
interval (research nvidia §5, profiling-modeling §3.2). Orin prints `NAME <instant>mW/<average>mW`
per rail (VDD_IN, VDD_CPU_GPU_CV, VDD_SOC on Orin Nano/NX; VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0 on
AGX Orin); older L4T prints `POM_5V_IN <instant>/<average>` without units. The average is over
tegrastats' whole lifetime, so only instant values are used. Module power is the input rail (VDD_IN,
POM_5V_IN) where the board has one, else the sum of the rails; CPU and GPU share rails, so this is
never the GPU alone. RAM is unified: its used figure is the whole system's.
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tapeout.measurement.meters import Meter

_RAIL = re.compile(r"\b([A-Z][A-Z0-9_]+) (\d+)(?:mW)?/\d+(?:mW)?(?!\w)|\b([A-Z][A-Z0-9_]+) (\d+)mW(?![/\w])")
_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_GPU = re.compile(r"\bGR3D_FREQ (\d+)%")
INPUT_RAILS = ("VDD_IN", "POM_5V_IN")


@dataclass(frozen=True)
class Sample:
    rails_mw: dict[str, int] = field(default_factory=dict)
    ram_used_mb: int | None = None
    ram_total_mb: int | None = None
    gpu_load_pct: int | None = None

    def module_mw(self) -> tuple[float, str] | None:
        """Module power and what it is: the input rail, else the sum of the rails."""
        for rail in INPUT_RAILS:
            if rail in self.rails_mw:
                return float(self.rails_mw[rail]), f"{rail} (module input rail)"
        if self.rails_mw:
            return float(sum(self.rails_mw.values())), f"sum of rails {' + '.join(sorted(self.rails_mw))}"
        return None


def parse_line(line: str) -> Sample:
    rails = {}
    for m in _RAIL.finditer(line):
        name, value = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        rails[name] = int(value)
    ram, gpu = _RAM.search(line), _GPU.search(line)
    return Sample(
        rails,
        int(ram.group(1)) if ram else None,
        int(ram.group(2)) if ram else None,
        int(gpu.group(1)) if gpu else None,
    )


def window_energy(lines: list[tuple[float, str]], t0: float, t1: float) -> dict | None:
    """Mean module power of the samples taken inside [t0, t1], times the window; None without samples."""
    inside = [parse_line(text) for t, text in lines if t0 <= t <= t1]
    powers = [p for p in (s.module_mw() for s in inside) if p is not None]
    if not powers:
        return None
    watts = statistics.fmean(p[0] for p in powers) / 1e3
    spread = (max(p[0] for p in powers) - min(p[0] for p in powers)) / 1e3
    seconds = t1 - t0
    return {
        "energy_j": watts * seconds,
        "power_avg_w": watts,
        "samples": len(powers),
        "rail": powers[0][1],
        "energy_quantum_j": spread * seconds / max(len(powers), 1) ** 0.5,
    }


class TegrastatsMeter(Meter):
    name = "tegrastats"
    measures_energy = True
    INTERVAL_MS = 100

    def start(self) -> None:
        exe = shutil.which("tegrastats")
        if exe is None:
            self.unavailable = "tegrastats: not found (not a Jetson, or the L4T tools are not on PATH)"
            return
        self._lines: list[tuple[float, str]] = []
        self._proc = subprocess.Popen(
            [exe, "--interval", str(self.INTERVAL_MS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        model = Path("/proc/device-tree/model")
        self.data["device"] = {
            "name": model.read_text(errors="replace").strip("\x00\n ") if model.is_file() else "Jetson"
        }

    def _read(self) -> None:
        for line in self._proc.stdout:  # blocks in C: the timed loop keeps the GIL to itself
            self._lines.append((time.perf_counter(), line.strip()))

    def window_start(self) -> None:
        self._t0 = time.perf_counter()

    def window_end(self, runs: int, seconds: float) -> None:
        t1 = time.perf_counter()
        time.sleep(self.INTERVAL_MS / 1e3 * 1.5)  # let the sample that closes the window arrive
        energy = window_energy(list(self._lines), self._t0, t1)
        if energy is None:
            self.data["energy_unavailable"] = (
                f"tegrastats gave no sample inside the {seconds:.2f} s window "
                f"(interval {self.INTERVAL_MS} ms): raise check.energy_window_s"
            )
        else:
            window = t1 - self._t0
            self.data.update(
                energy_j=energy["energy_j"],
                window_s=window,
                runs=runs,
                power_avg_w=energy["power_avg_w"],
                energy_quantum_j=energy["energy_quantum_j"],
                energy_scope=f"Jetson module power, {energy['rail']}: CPU, GPU and SoC together",
                energy_method=f"mean of {energy['samples']} tegrastats instant readings "
                f"({self.INTERVAL_MS} ms interval) × the window",
            )
        used = [s.ram_used_mb for s in (parse_line(text) for _, text in self._lines) if s.ram_used_mb is not None]
        if used:
            self.data["system_ram_peak_mb"] = max(used)

    def close(self) -> None:
        if not self.unavailable:
            self._proc.terminate()
            self._proc.wait(timeout=5)
