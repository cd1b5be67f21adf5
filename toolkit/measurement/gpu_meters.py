"""GPU meters read in the inference process: NVIDIA through NVML (`nvidia-ml-py`), AMD through `amdsmi`.

Energy comes from the device's cumulative energy counter read before and after the timed window
(research profiling-modeling §3.2: counter deltas over a steady window, never a power sample times a
duration). NVML's counter is in mJ but updates only every few tens of ms on recent GPUs, so the
update interval is measured and stated, and the window is long enough to make it small. Device
memory is the process's own where the driver reports per-process use (it does not inside some
containers: then the device's used memory minus what was used before the session, said so).
Clocks, temperature and throttle reasons are read at the start and end of the process.
"""

from __future__ import annotations

import os
import time
from typing import Any

from tapeout.measurement.meters import Meter

# NVML clocks-event (throttle) reasons that mean the run was slowed (bits from nvml.h).
_SLOWDOWNS = {
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}
_OTHER_REASONS = {0x1: "idle", 0x2: "application clocks setting", 0x10: "sync boost", 0x100: "display clock setting"}


def throttle_reasons(mask: int) -> list[str]:
    return [name for bit, name in {**_SLOWDOWNS, **_OTHER_REASONS}.items() if mask & bit]


def slowdowns(mask: int) -> list[str]:
    return [name for bit, name in _SLOWDOWNS.items() if mask & bit]


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)  # older nvidia-ml-py returns bytes


def nvml_index(cuda_index: int, visible: str | None) -> int | str:
    """The NVML device for a CUDA device index: CUDA_VISIBLE_DEVICES renumbers what CUDA sees (by
    index or UUID); NVML always sees every GPU."""
    if not visible:
        return cuda_index
    entries = [v.strip() for v in visible.split(",") if v.strip()]
    if cuda_index >= len(entries):
        raise ValueError(f"device_id {cuda_index} but CUDA_VISIBLE_DEVICES={visible!r} shows {len(entries)} device(s)")
    entry = entries[cuda_index]
    return int(entry) if entry.isdigit() else entry


class NvmlMeter(Meter):
    name = "nvml"
    measures_energy = True

    def start(self) -> None:
        try:
            import pynvml
        except ImportError:
            self.unavailable = "NVML: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self.unavailable = f"NVML: {exc} (no NVIDIA driver on this machine?)"
            return
        self.nvml = pynvml
        which = nvml_index(self.device_index, os.environ.get("CUDA_VISIBLE_DEVICES"))
        self.handle = (
            pynvml.nvmlDeviceGetHandleByIndex(which)
            if isinstance(which, int)
            else pynvml.nvmlDeviceGetHandleByUUID(which)
        )
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(self.handle)
        self.data["device"] = {
            "name": _text(pynvml.nvmlDeviceGetName(self.handle)),
            "uuid": _text(pynvml.nvmlDeviceGetUUID(self.handle)),
            "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
            "compute_capability": f"{major}.{minor}",
            "power_limit_w": self._optional(pynvml.nvmlDeviceGetEnforcedPowerLimit, 1e-3),
            "memory_total_mb": pynvml.nvmlDeviceGetMemoryInfo(self.handle).total / 2**20,
        }
        self._used_before = pynvml.nvmlDeviceGetMemoryInfo(self.handle).used
        self._memory: list[float] = []
        self.data["state"] = {"start": self._state()}

    def _optional(self, read, scale: float = 1.0):
        try:
            return read(self.handle) * scale
        except self.nvml.NVMLError:
            return None

    def _state(self) -> dict[str, Any]:
        n, h = self.nvml, self.handle
        # "clocks event" is the newer name of the same call (nvidia-ml-py >= 12.535)
        reasons = self._optional(
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return {
            "sm_clock_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
            "memory_clock_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
            "temperature_c": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
            "throttle_reasons": throttle_reasons(int(reasons)) if reasons is not None else None,
            "slowdowns": slowdowns(int(reasons)) if reasons is not None else None,
        }

    def _sample_memory(self) -> None:
        pid = os.getpid()
        mine = [
            p.usedGpuMemory
            for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
            if p.pid == pid and p.usedGpuMemory is not None
        ]
        if mine:
            self._memory.append(mine[0] / 2**20)
            self.data["device_memory_scope"] = (
                "this process's GPU memory (NVML, per process): CUDA context, ORT's "
                "arena (it does not shrink), cuDNN/cuBLAS workspaces"
            )
        else:  # PID namespaces hide our pid from the driver: fall back to the device's delta
            used = self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used
            self._memory.append((used - self._used_before) / 2**20)
            self.data["device_memory_scope"] = (
                "device memory used minus before the session (the driver did not list "
                "this process; other processes' changes would count too)"
            )
        self.data["device_memory_mb"] = max(self._memory)

    def after_session(self) -> None:
        self._sample_memory()

    def _update_interval_ms(self, limit_s: float = 0.3) -> float | None:
        """How often the energy counter moves: poll it until it changed twice (or give up)."""
        read = self.nvml.nvmlDeviceGetTotalEnergyConsumption
        changes, last, t_end = [], read(self.handle), time.perf_counter() + limit_s
        while len(changes) < 3 and time.perf_counter() < t_end:
            value = read(self.handle)
            if value != last:
                changes.append(time.perf_counter())
                last = value
        return (changes[-1] - changes[0]) / (len(changes) - 1) * 1e3 if len(changes) >= 2 else None

    def window_start(self) -> None:
        try:
            self._interval = self._update_interval_ms()
            self._e0 = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        except self.nvml.NVMLError as exc:  # Volta and newer only; not on Jetson
            self._e0 = None
            self.data["energy_unavailable"] = f"NVML total energy counter: {exc}"

    def window_end(self, runs: int, seconds: float) -> None:
        if self._e0 is not None:
            joules = (self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) - self._e0) / 1e3
            self.data.update(
                energy_j=joules,
                window_s=seconds,
                runs=runs,
                power_avg_w=joules / seconds if seconds else None,
                # each of the two reads can lag by one update interval's energy
                energy_quantum_j=2 * (self._interval or 100.0) / 1e3 * (joules / seconds if seconds else 0.0),
                energy_counter_update_ms=self._interval,
                power_sampled_w=self._optional(self.nvml.nvmlDeviceGetPowerUsage, 1e-3),
                energy_scope="the whole GPU board as NVML reports it (GPU and its memory), not the host",
                energy_method="NVML total energy counter (mJ) read before and after the window"
                + (f"; it updates every ~{self._interval:.0f} ms" if self._interval else "; update interval not seen"),
            )
        self._sample_memory()
        self.data["state"]["end"] = self._state()
        throttled = sorted(
            set(
                (self.data["state"]["end"].get("slowdowns") or [])
                + (self.data["state"]["start"].get("slowdowns") or [])
            )
        )
        if throttled:
            self.data.setdefault("notes", []).append(f"the GPU was slowed during the run: {', '.join(throttled)}")

    def close(self) -> None:
        if not self.unavailable:
            self.nvml.nvmlShutdown()


class AmdSmiMeter(Meter):
    """AMD GPUs through amdsmi (ROCm's library; the Python wrapper cannot import without it)."""

    name = "amdsmi"
    measures_energy = True

    def start(self) -> None:
        try:
            import amdsmi
        except Exception as exc:  # ImportError, or the wrapper's own error when libamd_smi.so is missing
            self.unavailable = (
                f"amdsmi: cannot import ({type(exc).__name__}: {str(exc)[:150]}); ROCm's amd-smi-lib is needed"
            )
            return
        try:
            amdsmi.amdsmi_init()
            handles = amdsmi.amdsmi_get_processor_handles()
        except Exception as exc:
            self.unavailable = f"amdsmi: {exc}"
            return
        if self.device_index >= len(handles):
            self.unavailable = f"amdsmi: device {self.device_index} not found ({len(handles)} GPU(s))"
            return
        self.smi, self.handle = amdsmi, handles[self.device_index]
        asic = amdsmi.amdsmi_get_gpu_asic_info(self.handle)
        self.data["device"] = {
            "name": asic.get("market_name"),
            "gfx": asic.get("target_graphics_version"),
            "bdf": amdsmi.amdsmi_get_gpu_device_bdf(self.handle),
        }
        self._used_before = amdsmi.amdsmi_get_gpu_vram_usage(self.handle)["vram_used"]  # MB
        self._memory: list[float] = []
        self.data["state"] = {"start": self._state()}

    def _state(self) -> dict[str, Any]:
        smi, h = self.smi, self.handle
        power = smi.amdsmi_get_power_info(h)
        watts = power.get("current_socket_power")
        if watts in (None, "N/A", 0):  # MI300 and newer report the current value; older GPUs the average
            watts = power.get("average_socket_power")
        return {
            "gfx_clock_mhz": smi.amdsmi_get_clock_info(h, smi.AmdSmiClkType.GFX)["clk"],
            "memory_clock_mhz": smi.amdsmi_get_clock_info(h, smi.AmdSmiClkType.MEM)["clk"],
            "temperature_c": smi.amdsmi_get_temp_metric(
                h, smi.AmdSmiTemperatureType.HOTSPOT, smi.AmdSmiTemperatureMetric.CURRENT
            ),
            "power_w": None if watts == "N/A" else watts,
        }

    def _sample_memory(self) -> None:
        pid = os.getpid()
        mine = [
            p["memory_usage"]["vram_mem"] for p in self.smi.amdsmi_get_gpu_process_list(self.handle) if p["pid"] == pid
        ]
        if mine:
            self._memory.append(mine[0] / 2**20)
            self.data["device_memory_scope"] = "this process's VRAM (amdsmi process list)"
        else:
            used = self.smi.amdsmi_get_gpu_vram_usage(self.handle)["vram_used"]
            self._memory.append(float(used - self._used_before))
            self.data["device_memory_scope"] = "device VRAM used minus before the session (this process was not listed)"
        self.data["device_memory_mb"] = max(self._memory)

    def after_session(self) -> None:
        self._sample_memory()

    def _energy_j(self) -> tuple[float, float]:
        count = self.smi.amdsmi_get_energy_count(self.handle)
        resolution_uj = float(count["counter_resolution"])  # µJ per count
        return count["energy_accumulator"] * resolution_uj / 1e6, resolution_uj / 1e6

    def window_start(self) -> None:
        self._e0, _ = self._energy_j()

    def window_end(self, runs: int, seconds: float) -> None:
        e1, quantum = self._energy_j()
        joules = e1 - self._e0
        self.data.update(
            energy_j=joules,
            window_s=seconds,
            runs=runs,
            power_avg_w=joules / seconds if seconds else None,
            energy_quantum_j=2 * quantum,
            energy_scope="the GPU socket as amdsmi reports it",
            energy_method=f"amdsmi energy accumulator × counter resolution ({quantum * 1e6:.3g} µJ per count)",
        )
        self._sample_memory()
        self.data["state"]["end"] = self._state()

    def close(self) -> None:
        if not self.unavailable:
            self.smi.amdsmi_shut_down()
