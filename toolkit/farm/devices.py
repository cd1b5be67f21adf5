"""Which devices a node may advertise: `host-cpu` (its own CPU), or a shipped device spec it really holds — a GPU
whose driver reports a name the spec lists, or a device whose profiles' targets run here, and not as an emulator.
A worker never advertises a device it cannot run."""

from __future__ import annotations

import contextlib
import platform
from pathlib import Path

from tapeout.core.config import list_devices, list_profiles, load_device
from tapeout.core.errors import BadInput
from tapeout.farm.plan import HOST_CPU


def reported_devices() -> list[str]:
    """The names this machine's drivers report: NVIDIA GPUs (NVML), AMD GPUs (amdsmi), a Jetson's device tree."""
    from tapeout.farm.runtime import hide_broken_amdsmi

    hide_broken_amdsmi()  # an amdsmi without ROCm prints to stdout as it fails: quiet, and hidden from Ray
    names: list[str] = []
    with contextlib.suppress(Exception):  # no driver, no library: nothing to report
        import pynvml

        pynvml.nvmlInit()
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                names.append(name.decode() if isinstance(name, bytes) else name)
        finally:
            pynvml.nvmlShutdown()
    with contextlib.suppress(Exception):
        import amdsmi

        amdsmi.amdsmi_init()
        try:
            names += [amdsmi.amdsmi_get_gpu_asic_info(h)["market_name"] for h in amdsmi.amdsmi_get_processor_handles()]
        finally:
            amdsmi.amdsmi_shut_down()
    with contextlib.suppress(OSError):
        names.append(Path("/proc/device-tree/model").read_text(errors="replace").strip("\0 \n"))
    return [n for n in names if n]


def why_not(device: str, reported: list[str] | None = None) -> str | None:
    """None where this node can run `device`; otherwise why not, in words."""
    if device == HOST_CPU:
        return None
    if device not in list_devices():
        raise BadInput(
            f"unknown device {device!r}", fix=f"use {HOST_CPU} or a device spec: {', '.join(list_devices())}"
        )
    spec = load_device(device)
    reported = reported_devices() if reported is None else reported
    if spec.identifiers:
        if any(spec.matches(name) for name in reported):
            return None
        return (
            f"no {device} here: its driver names ({', '.join(spec.identifiers)}) match none this node reports "
            f"({', '.join(reported) or 'none: no NVML, amdsmi or device tree'})"
        )
    return _runnable_profile(device)


def _runnable_profile(device: str) -> str | None:
    """For a device its driver cannot name (an NPU, a phone's SoC): None where a shipped profile for it has a target
    that runs here natively."""
    from tapeout import targets
    from tapeout.steps.setup import load_profile

    machine = platform.machine().lower()
    seen = []
    for name in list_profiles():
        profile = load_profile(name)
        if profile.device != device:
            continue
        info = targets.TARGETS[profile.target]
        if not targets.target_class(profile.target).probe().available:
            seen.append(f"{profile.target}: not installed")
        elif info.capabilities.emulated_on.get(machine):
            seen.append(f"{profile.target}: an emulator on {machine}")
        else:
            return None
    return f"no {device} here ({'; '.join(seen) or 'no shipped profile targets it'})"


def usable(devices: list[str]) -> list[str]:
    """`devices`, each checked; the first this node cannot run is one line (exit 4)."""
    from tapeout.core.errors import TargetUnavailable

    reported = reported_devices()
    for device in devices:
        problem = why_not(device, reported)
        if problem:
            raise TargetUnavailable(
                f"this node cannot advertise {device}: {problem}",
                fix="advertise only the devices `tapeout targets` shows usable here",
            )
    return devices


def found_here() -> list[str]:
    """Every device this node holds: host-cpu, and each device spec its drivers name."""
    from tapeout.core.config import device_matching

    specs = [device_matching(name) for name in reported_devices()]
    return [HOST_CPU, *dict.fromkeys(spec.name for spec in specs if spec is not None)]
