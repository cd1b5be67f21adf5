"""The meters read in the inference process (toolkit/meters.py, gpu_meters.py, tegrastats.py).

NVML, amdsmi and tegrastats need an NVIDIA driver, ROCm and a Jetson, none of which exists here.
Their real Python packages are installed (the [test] extra): the tests run the meters against them
for the "not available here" path, and otherwise against stand-ins that check our side of the
contract: a stand-in refuses any name the real package does not define (read from the installed
nvidia-ml-py module, and from the amdsmi wrapper's source, which cannot import without ROCm).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import stat
import sys
import time
import types
from pathlib import Path

import pytest

from tapeout.measurement import meters
from tapeout.measurement.gpu_meters import AmdSmiMeter, NvmlMeter, nvml_index, slowdowns, throttle_reasons
from tapeout.measurement.tegrastats import TegrastatsMeter, parse_line, window_energy

# Lines in the formats tegrastats prints (composed from its documented fields and logs published from
# boards; no Jetson ran here): Orin Nano/NX (JetPack 6), AGX Orin, and a Nano on L4T r32.
ORIN_NANO = (
    "11-20-2026 14:02:11 RAM 3120/7620MB (lfb 5x4MB) SWAP 0/3810MB (cached 0MB) CPU [21%@1510,9%@1510,"
    "4%@1510,3%@1510,off,off] EMC_FREQ 12%@2133 GR3D_FREQ 61%@[918] NVDEC off NVJPG off VIC off OFA off "
    "APE 200 cpu@52.4C soc2@49.9C soc0@50.7C gpu@53.1C tj@53.1C soc1@50.2C VDD_IN 9812mW/7344mW "
    "VDD_CPU_GPU_CV 4388mW/2911mW VDD_SOC 2540mW/2200mW"
)
AGX_ORIN = (
    "11-20-2026 14:05:40 RAM 11843/62841MB (lfb 1221x4MB) SWAP 0/31421MB (cached 0MB) CPU [3%@2201,1%@2201,"
    "off,off] EMC_FREQ 4%@3199 GR3D_FREQ 87%@[1300,1300] VIC off APE 174 CPU@49.9C GPU@51.3C tj@51.3C "
    "VDD_GPU_SOC 12870mW/9120mW VDD_CPU_CV 1598mW/1402mW VIN_SYS_5V0 4512mW/4460mW VDDQ_VDD2_1V8AO 803mW/781mW"
)
NANO_R32 = (
    "RAM 2917/3964MB (lfb 2x2MB) SWAP 0/1982MB (cached 0MB) IRAM 0/252kB(lfb 252kB) CPU [14%@1479,7%@1479,off,"
    "off] EMC_FREQ 9%@1600 GR3D_FREQ 76%@921 APE 25 PLL@37.5C CPU@40C GPU@38.5C POM_5V_IN 4102/3217 "
    "POM_5V_GPU 1487/880 POM_5V_CPU 612/540"
)


def test_tegrastats_lines_parse_in_every_board_format():
    nano = parse_line(ORIN_NANO)
    assert nano.rails_mw == {"VDD_IN": 9812, "VDD_CPU_GPU_CV": 4388, "VDD_SOC": 2540}  # instant values, not averages
    assert (nano.ram_used_mb, nano.ram_total_mb, nano.gpu_load_pct) == (3120, 7620, 61)
    assert nano.module_mw() == (9812.0, "VDD_IN (module input rail)")
    agx = parse_line(AGX_ORIN)  # no input rail: the sum, said so
    assert agx.module_mw()[0] == 12870 + 1598 + 4512 + 803 and agx.module_mw()[1].startswith("sum of rails")
    old = parse_line(NANO_R32)  # no units, IRAM in kB is not a rail
    assert old.rails_mw == {"POM_5V_IN": 4102, "POM_5V_GPU": 1487, "POM_5V_CPU": 612}
    assert old.module_mw()[0] == 4102 and parse_line("garbage").module_mw() is None


def test_window_energy_uses_the_samples_inside_the_window():
    lines = [
        (0.95, ORIN_NANO.replace("9812mW", "1000mW")),
        (1.1, ORIN_NANO),
        (1.2, ORIN_NANO.replace("9812mW", "10812mW")),
        (2.5, ORIN_NANO.replace("9812mW", "99999mW")),
    ]
    energy = window_energy(lines, 1.0, 2.0)
    assert energy["samples"] == 2 and energy["power_avg_w"] == pytest.approx(10.312)
    assert energy["energy_j"] == pytest.approx(10.312) and energy["energy_quantum_j"] > 0
    assert window_energy(lines, 3.0, 4.0) is None


def test_tegrastats_meter_samples_a_running_tegrastats(tmp_path, monkeypatch):
    """tegrastats exists only on Jetsons: a stand-in executable prints its lines at the requested interval."""
    script = tmp_path / "bin" / "tegrastats"
    script.parent.mkdir()
    script.write_text(
        f"#!{sys.executable}\nimport sys, time\nassert sys.argv[1:3] == ['--interval', '100'], sys.argv\n"
        f"while True:\n    print({ORIN_NANO!r}, flush=True)\n    time.sleep(0.1)\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    meter = TegrastatsMeter()
    meter.start()
    assert meter.unavailable is None
    meter.window_start()
    time.sleep(0.6)
    meter.window_end(runs=120, seconds=0.6)
    meter.close()
    result = meter.result()
    assert result["power_avg_w"] == pytest.approx(9.812) and result["runs"] == 120
    assert "VDD_IN" in result["energy_scope"] and result["system_ram_peak_mb"] == 3120
    assert meter._proc.poll() is not None  # the sampler is stopped


def test_tegrastats_missing_is_unavailable_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    meter = TegrastatsMeter()
    meter.start()
    assert "tegrastats: not found" in meter.unavailable


def test_nvml_without_a_driver_is_unavailable_not_an_error():
    """The real nvidia-ml-py on a host without libnvidia-ml: the meter says why, the measurement goes on."""
    pytest.importorskip("pynvml")
    meter = NvmlMeter()
    meters.safely(meter, "start")
    assert meter.unavailable.startswith("NVML: ") and "driver" in meter.unavailable
    assert meter.result() == {"unavailable": meter.unavailable}


def test_amdsmi_without_rocm_is_unavailable_not_an_error():
    pytest.importorskip("pynvml")  # the [test] extra installs both packages; amdsmi cannot import without ROCm
    if importlib.util.find_spec("amdsmi") is None:
        pytest.skip("amdsmi is not installed")
    meter = AmdSmiMeter()
    meters.safely(meter, "start")
    assert meter.unavailable.startswith("amdsmi: cannot import") and "ROCm" in meter.unavailable


class _StrictModule(types.ModuleType):
    """A stand-in that only answers names the real package defines."""

    def __init__(self, name: str, real_names: set[str], **attrs):
        super().__init__(name)
        self._real = real_names
        for key, value in attrs.items():
            assert key in real_names, f"the stand-in defines {key}, which the real {name} has not"
            setattr(self, key, value)

    def __getattr__(self, item):
        raise AttributeError(
            f"{item}: not in the real {self.__name__}"
            if item not in self._real
            else f"{item}: the stand-in does not implement it"
        )


def _fake_nvml(reasons: int, pid: int):
    real = pytest.importorskip("pynvml")
    clock = {"t0": time.perf_counter()}

    def energy(_h):  # 250 W, updating every 20 ms, in mJ
        ticks = int((time.perf_counter() - clock["t0"]) / 0.02)
        return 1_000_000 + ticks * 5000

    class Memory:
        used, total = 3 * 2**30, 24 * 2**30

    return _StrictModule(
        "pynvml",
        set(dir(real)),
        NVMLError=real.NVMLError,
        NVML_CLOCK_SM=real.NVML_CLOCK_SM,
        NVML_CLOCK_MEM=real.NVML_CLOCK_MEM,
        NVML_TEMPERATURE_GPU=real.NVML_TEMPERATURE_GPU,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: ("gpu", i),
        nvmlDeviceGetCudaComputeCapability=lambda h: (8, 9),
        nvmlDeviceGetName=lambda h: b"NVIDIA L4",
        nvmlDeviceGetUUID=lambda h: "GPU-1234",
        nvmlSystemGetDriverVersion=lambda: "580.1",
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 72000,
        nvmlDeviceGetMemoryInfo=lambda h: Memory,
        nvmlDeviceGetClockInfo=lambda h, kind: 2040 if kind == real.NVML_CLOCK_SM else 6251,
        nvmlDeviceGetTemperature=lambda h, sensor: 61,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: reasons,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [types.SimpleNamespace(pid=pid, usedGpuMemory=512 * 2**20)],
        nvmlDeviceGetTotalEnergyConsumption=energy,
        nvmlDeviceGetPowerUsage=lambda h: 250_000,
    )


def test_nvml_meter_reads_energy_memory_clocks_and_throttling(monkeypatch):
    """Our side of NVML: a stand-in with the real module's names (checked) and a counter that moves every 20 ms."""
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(reasons=0x40 | 0x1, pid=os.getpid()))
    meter = NvmlMeter(device_index=0)
    for step in ("start", "after_session", "window_start"):
        meters.safely(meter, step)
    time.sleep(0.5)
    meters.safely(meter, "window_end", 1000, 0.5)
    meters.safely(meter, "close")
    result = meter.result()
    assert meter.unavailable is None, meter.unavailable
    assert result["device"]["name"] == "NVIDIA L4" and result["device"]["compute_capability"] == "8.9"
    assert result["energy_counter_update_ms"] == pytest.approx(20, rel=0.5)
    # 5 J per 20 ms = 250 W over the window (the counter's quantization allows ±2 updates)
    assert result["energy_j"] == pytest.approx(125, rel=0.15) and result["power_avg_w"] == pytest.approx(250, rel=0.15)
    assert result["device_memory_mb"] == 512 and "this process" in result["device_memory_scope"]
    assert result["state"]["end"]["sm_clock_mhz"] == 2040
    assert any("hardware thermal slowdown" in note for note in result["notes"])


def test_nvml_meter_falls_back_to_the_device_delta_when_the_driver_hides_our_pid(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(reasons=0, pid=-1))
    meter = NvmlMeter()
    meters.safely(meter, "start")
    meters.safely(meter, "after_session")
    assert (
        meter.result()["device_memory_mb"] == 0 and "minus before the session" in meter.result()["device_memory_scope"]
    )


def _amdsmi_source_names() -> set[str]:
    spec = importlib.util.find_spec("amdsmi")
    if spec is None:
        pytest.skip("amdsmi is not installed")
    source = Path(spec.submodule_search_locations[0]) / "amdsmi_interface.py"
    tree = ast.parse(source.read_text())
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


def test_amdsmi_meter_reads_energy_and_vram(monkeypatch):
    """Our side of amdsmi: a stand-in whose every name exists in the real wrapper's source."""
    names = _amdsmi_source_names()
    counts = iter([1000, 251_000])  # accumulator at the window start and end; 15.3 µJ per count
    enum = types.SimpleNamespace(GFX="gfx", MEM="mem", HOTSPOT="hot", CURRENT="cur")
    smi = _StrictModule(
        "amdsmi",
        names,
        amdsmi_init=lambda: None,
        amdsmi_shut_down=lambda: None,
        amdsmi_get_processor_handles=lambda: ["h0"],
        amdsmi_get_gpu_asic_info=lambda h: {"market_name": "AMD Instinct MI300X", "target_graphics_version": "gfx942"},
        amdsmi_get_gpu_device_bdf=lambda h: "0000:0c:00.0",
        amdsmi_get_gpu_vram_usage=lambda h: {"vram_total": 196592, "vram_used": 300},
        amdsmi_get_power_info=lambda h: {"current_socket_power": 410, "average_socket_power": "N/A"},
        amdsmi_get_clock_info=lambda h, kind: {"clk": 2100 if kind == "gfx" else 1300},
        amdsmi_get_temp_metric=lambda h, sensor, metric: 55,
        amdsmi_get_gpu_process_list=lambda h: [{"pid": os.getpid(), "memory_usage": {"vram_mem": 700 * 2**20}}],
        amdsmi_get_energy_count=lambda h: {
            "energy_accumulator": next(counts),
            "counter_resolution": 15.3,
            "timestamp": 0,
        },
        AmdSmiClkType=enum,
        AmdSmiTemperatureType=enum,
        AmdSmiTemperatureMetric=enum,
    )
    monkeypatch.setitem(sys.modules, "amdsmi", smi)
    meter = AmdSmiMeter()
    for step in ("start", "after_session", "window_start"):
        meters.safely(meter, step)
    meters.safely(meter, "window_end", 500, 2.0)
    result = meter.result()
    assert meter.unavailable is None, meter.unavailable
    assert result["energy_j"] == pytest.approx(250_000 * 15.3e-6) and result["power_avg_w"] == pytest.approx(1.9125)
    assert result["device"]["name"] == "AMD Instinct MI300X" and result["device_memory_mb"] == 700
    assert result["state"]["start"]["power_w"] == 410 and result["state"]["end"]["gfx_clock_mhz"] == 2100


def test_cuda_visible_devices_maps_to_nvml_devices():
    assert nvml_index(0, None) == 0 and nvml_index(1, "") == 1
    assert nvml_index(0, "2,3") == 2 and nvml_index(1, "GPU-aaa, GPU-bbb") == "GPU-bbb"
    with pytest.raises(ValueError, match="shows 1 device"):
        nvml_index(1, "0")
    assert throttle_reasons(0x41) == ["hardware thermal slowdown", "idle"] and slowdowns(0x41) == [
        "hardware thermal slowdown"
    ]


def test_rapl_meter_reads_the_package_counter_and_handles_wraparound(tmp_path):
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "max_energy_range_uj").write_text("1000000\n")
    (zone / "energy_uj").write_text("900000\n")
    meter = meters.RaplMeter(zone=zone)
    meter.start()
    meter.window_start()
    (zone / "energy_uj").write_text("100000\n")  # wrapped: 100 000 µJ to the top, 100 000 after
    meter.window_end(runs=10, seconds=0.1)
    assert meter.result()["energy_j"] == pytest.approx(0.2) and meter.result()["power_avg_w"] == pytest.approx(2.0)
    missing = meters.RaplMeter(zone=tmp_path / "absent")
    missing.start()
    assert "not readable" in missing.unavailable


def test_a_meter_that_breaks_mid_run_becomes_unavailable():
    class Broken(meters.Meter):
        name = "broken"

        def window_end(self, runs, seconds):
            raise OSError("sensor went away")

    meter = Broken()
    meters.safely(meter, "window_end", 1, 1.0)
    assert meter.unavailable == "broken: window_end failed (OSError: sensor went away)"
