"""Measurement on this machine: fresh inference processes for latency, cold start, memory, energy, parity.

Each repeat is a new `tapeout.runner` process (run-to-run variation is real and must show in the
bounds); the per-op profile is one more process with the profiler on, never mixed into the timings.
What a process reads besides time is the target's meters; this module merges their results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tapeout.core.artifact import Artifact
from tapeout.core.errors import BadInput, TapeoutError, TargetUnavailable
from tapeout.core.host_speed import host_state
from tapeout.core.profile_schema import CheckSettings
from tapeout.measurement import stats
from tapeout.targets.base import Target

_ERRORS = {cls.__name__: cls for cls in (BadInput, TargetUnavailable, TapeoutError)}


@dataclass(frozen=True)
class Energy:
    """Energy per inference and average power over the timed window, from one meter, across processes."""

    meter: str
    j_per_inference: float  # median over processes
    bounds: tuple[float, float]  # worst processes, widened by the counter's granularity per inference
    power_avg_w: float
    power_bounds: tuple[float, float]
    scope: str
    method: str
    window_s: list[float]
    runs: list[int]

    def to_json(self) -> dict:
        return {
            "meter": self.meter,
            "mj_per_inference": self.j_per_inference * 1e3,
            "mj_bounds": [b * 1e3 for b in self.bounds],
            "power_avg_w": self.power_avg_w,
            "power_bounds_w": list(self.power_bounds),
            "scope": self.scope,
            "method": self.method,
            "window_s": self.window_s,
            "runs": self.runs,
        }


@dataclass
class Measurement:
    latency: stats.LatencySummary
    samples: list[np.ndarray]
    cold_start_ms: list[float]
    runtime_import_ms: list[float]
    create_ms: list[float]
    first_inference_ms: list[float]
    warmup_iters: list[int]
    peak_rss_mb: list[float]
    rss_start_mb: list[float]
    rss_after_session_mb: list[float]
    outputs: list[dict[str, np.ndarray]]
    latency_e2e: stats.LatencySummary | None = None  # with host copies, where I/O lives in device memory
    energy: Energy | None = None
    device_memory_mb: list[float] = field(default_factory=list)  # per process
    device_memory_scope: str = ""
    device: dict[str, Any] | None = None  # what ran it (GPU name, driver, ...), from the meters
    unmeasured: dict[str, str] = field(default_factory=dict)  # "energy", "device_memory": why not
    meters: dict[str, list[dict]] = field(default_factory=dict)  # per meter, per process: raw results
    op_profile: dict | None = None
    notes: list[str] = field(default_factory=list)
    host_state: dict[str, float] | None = None  # core.host_speed.host_state() right after the timed processes
    processes: list[dict] = field(default_factory=list, repr=False)  # raw per-process results

    def to_json(self) -> dict:
        return {
            "latency_ms": self.latency.to_json(),
            "latency_e2e_ms": self.latency_e2e.to_json() if self.latency_e2e else None,
            "latency_histogram": histogram(self.samples),
            "cold_start_ms": {
                "per_repeat": self.cold_start_ms,
                "max": max(self.cold_start_ms),
                "median": float(np.median(self.cold_start_ms)),
            },
            "runtime_import_ms": self.runtime_import_ms,
            "session_create_ms": self.create_ms,
            "first_inference_ms": self.first_inference_ms,
            "warmup_iters": self.warmup_iters,
            "memory_mb": {
                "peak_rss": max(self.peak_rss_mb),
                "peak_rss_per_repeat": self.peak_rss_mb,
                "rss_before_session": float(np.median(self.rss_start_mb)),
                "rss_after_session": float(np.median(self.rss_after_session_mb)),
                "scope": "peak resident set of the inference process (interpreter + runtime + model + activations)",
                "device_peak": max(self.device_memory_mb) if self.device_memory_mb else None,
                "device_peak_per_repeat": self.device_memory_mb,
                "device_scope": self.device_memory_scope or None,
            },
            "energy": self.energy.to_json() if self.energy else None,
            "device": self.device,
            "unmeasured": self.unmeasured,
            "meters": self.meters,
            "op_profile": self.op_profile,
            "notes": self.notes,
            "host_state": self.host_state,
        }


def histogram(samples: list[np.ndarray], bins: int = 40) -> dict | None:
    """The pooled timed samples as log-spaced bins (ms), per process: what the HTML report draws."""
    pooled = np.concatenate([np.asarray(s, dtype=float) for s in samples]) if samples else np.array([])
    pooled = pooled[pooled > 0]
    if pooled.size < 2 or pooled.min() == pooled.max():
        return None
    edges = np.geomspace(pooled.min(), pooled.max(), bins + 1)
    return {
        "edges_ms": edges.tolist(),
        "counts": [np.histogram(np.asarray(s, dtype=float), edges)[0].tolist() for s in samples],
    }


def death(code: int, output: str) -> str:
    """How an inference process ended, in one line: the signal that killed it, with the innermost Python frame of the
    faulthandler dump the runner prints on a crash (native code crashed under that call), or its last line."""
    import signal

    lines = output.strip().splitlines()
    if code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
        # faulthandler's dump: "Fatal Python error: Segmentation fault", then frames, innermost first
        frames = [line.strip() for line in lines if line.strip().startswith('File "')]
        return f"{how}, in {frames[0]}" if frames else f"{how}: {lines[-1] if lines else 'no output'}"
    return f"exit {code}: {lines[-1] if lines else 'no output'}"


def run_child(request: dict, timeout_s: float, env: dict[str, str] | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="tapeout-run-") as tmp:
        req, res = Path(tmp) / "request.json", Path(tmp) / "result.json"
        if request.get("want_outputs"):
            request = {**request, "outputs_path": str(Path(tmp) / "outputs.npz")}
        req.write_text(json.dumps(request))
        # The inference process runs under the same interpreter and site isolation (-S) as this one.
        flags = ["-S"] if sys.flags.no_site else []
        proc = subprocess.run(
            [sys.executable, *flags, "-m", "tapeout.measurement.runner", str(req), str(res)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, **(env or {})},
        )
        if proc.returncode != 0 or not res.is_file():
            raise RuntimeError(f"the inference process died ({death(proc.returncode, proc.stderr or proc.stdout)})")
        result = json.loads(res.read_text())
        if "error" in result:
            raise _ERRORS.get(result["kind"], TapeoutError)(result["error"])
        if request.get("outputs_path"):
            with np.load(request["outputs_path"]) as data:
                result["outputs"] = _unflatten({k: data[k] for k in data.files})
        return result


def _unflatten(flat: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    samples: dict[int, dict[str, np.ndarray]] = {}
    for key, value in flat.items():
        index, _, name = key.partition(".")
        samples.setdefault(int(index), {})[name] = value
    return [samples[i] for i in sorted(samples)]


def _run_processes(
    base: dict,
    count: int,
    progress: Callable[[str], None],
    timeout_s: float,
    want_outputs: bool,
    op_profile_last: int = 0,
) -> list[dict]:
    """`count` fresh timing processes; the last also runs the per-op profile (`op_profile_last` runs) after its
    timed runs, where asked."""
    results = []
    for r in range(count):
        last = op_profile_last if r == count - 1 else 0
        progress(
            f"timing: process {r + 1}/{count}, {base['iterations']} runs"
            + (", then the per-op profile (profiler on, a session of its own)" if last else "")
        )
        request = {**base, "want_outputs": want_outputs and r == 0, **({"then_op_profile": last} if last else {})}
        results.append(run_child(request, timeout_s))
    return results


def _energy(readings: dict[str, list[dict]]) -> tuple[Energy | None, str]:
    """The first meter whose energy every process read; else why none did."""
    why = []
    for name, per_process in readings.items():
        if all("energy_j" in r for r in per_process):
            per_inf = [r["energy_j"] / r["runs"] for r in per_process]
            q = [r.get("energy_quantum_j", 0.0) / r["runs"] for r in per_process]
            watts = [r["power_avg_w"] for r in per_process]
            dw = [r.get("energy_quantum_j", 0.0) / r["window_s"] for r in per_process]
            first = per_process[0]
            return Energy(
                name,
                float(np.median(per_inf)),
                (
                    min(e - d for e, d in zip(per_inf, q, strict=True)),
                    max(e + d for e, d in zip(per_inf, q, strict=True)),
                ),
                float(np.median(watts)),
                (
                    min(w - d for w, d in zip(watts, dw, strict=True)),
                    max(w + d for w, d in zip(watts, dw, strict=True)),
                ),
                first["energy_scope"],
                first["energy_method"],
                [r["window_s"] for r in per_process],
                [r["runs"] for r in per_process],
            ), ""
        reason = next(
            (
                r.get("unavailable") or r.get("energy_unavailable")
                for r in per_process
                if r.get("unavailable") or r.get("energy_unavailable")
            ),
            None,
        )
        if reason is not None:
            why.append(reason)
    return None, "; ".join(why)


def _summarize(results: list[dict], settings: CheckSettings, meter_names: tuple[str, ...]) -> Measurement:
    """Per-process results → one Measurement (pure: merging runs is summarizing their union)."""
    samples = [np.asarray(r["samples_ms"]) for r in results]
    readings = {name: [r["meters"][name] for r in results] for name in meter_names}
    rss = readings["rss"]
    m = Measurement(
        latency=stats.summarize(samples, settings.confidence),
        samples=samples,
        cold_start_ms=[r["create_ms"] + r["first_ms"] for r in results],
        runtime_import_ms=[r["import_ms"] for r in results],
        create_ms=[r["create_ms"] for r in results],
        first_inference_ms=[r["first_ms"] for r in results],
        warmup_iters=[r["warmup_iters"] for r in results],
        peak_rss_mb=[r["peak_rss_mb"] for r in rss],
        rss_start_mb=[r["rss_start_mb"] for r in rss],
        rss_after_session_mb=[r["rss_after_session_mb"] for r in rss],
        outputs=next((r["outputs"] for r in results if "outputs" in r), []),
        processes=results,
        meters={name: per for name, per in readings.items() if name != "rss"},
    )
    if all("samples_e2e_ms" in r for r in results):
        m.latency_e2e = stats.summarize([np.asarray(r["samples_e2e_ms"]) for r in results], settings.confidence)
    energy_meters = [n for n in meter_names if n not in ("rss",)]
    m.energy, why = _energy({n: readings[n] for n in energy_meters})
    if m.energy is None:
        m.unmeasured["energy"] = why or f"this target reads no energy counter (its meters: {', '.join(meter_names)})"
    for name in energy_meters:
        per = readings[name]
        if all("device_memory_mb" in r for r in per):
            m.device_memory_mb = [r["device_memory_mb"] for r in per]
            m.device_memory_scope = per[0]["device_memory_scope"]
            break
    if not m.device_memory_mb:
        gpu = [per[0].get("unavailable") for name, per in readings.items() if name in ("nvml", "amdsmi")]
        m.unmeasured["device_memory"] = (
            ("; ".join(r for r in gpu if r) or "the GPU meter read no memory")
            if gpu
            else "this target has no device memory apart from the host's (see peak RSS)"
        )
    m.device = next((per[0]["device"] for name, per in readings.items() if name != "rss" and "device" in per[0]), None)
    for per in readings.values():
        for note in dict.fromkeys(n for r in per for n in r.get("notes", [])):
            m.notes.append(note)
    if m.latency.cv_between_repeats > 0.05:
        m.notes.append(
            f"run-to-run spread is high (CV of per-process medians {m.latency.cv_between_repeats:.1%}): "
            "the machine is noisy; bounds are widened to cover it"
        )
    return m


def measure(
    target: Target,
    artifact: Artifact,
    golden_path: Path,
    settings: CheckSettings,
    *,
    undecided: Callable[[Measurement], bool] = lambda _m: False,
    progress: Callable[[str], None] = lambda _msg: None,
    timeout_s: float = 900,
) -> Measurement:
    """Time `settings.repeats` fresh processes, the last of which then runs the op profile (a profiler needing a
    process environment of its own gets a process of its own, after); if `undecided(m)`, double the samples once
    (DESIGN §4: an inconclusive latency is re-measured before it is reported)."""
    caps = target.capabilities
    options = target.options.model_dump(mode="json")
    base = {
        **artifact_request(target, artifact),
        "golden": str(golden_path),
        "iterations": settings.iterations,
        "warmup_min_iters": settings.warmup_min_iters,
        "warmup_min_s": settings.warmup_min_s,
        "warmup_max_s": settings.warmup_max_s,
        "energy_window_s": settings.energy_window_s,
        "device_index": options.get("device_id", 0),  # GPU targets name their device `device_id`
    }
    profiled = settings.op_profile and caps.op_profiler
    # the op profile runs in the last timing process after its timed runs, unless the profiler needs a process
    # environment of its own (CUDA_LAUNCH_BLOCKING for the CUDA EP's per-kernel times)
    inline = settings.op_profile_iterations if profiled and not caps.op_profile_env else 0
    results = _run_processes(base, settings.repeats, progress, timeout_s, want_outputs=True, op_profile_last=inline)
    inline_profile = results[-1].pop("op_profile", None)
    m = _summarize(results, settings, caps.meters)
    if undecided(m):
        more = _run_processes(base, settings.repeats, progress, timeout_s, want_outputs=False)
        m = _summarize(results + more, settings, caps.meters)
        m.notes.append("latency was inconclusive; sampling was doubled once")
    m.host_state = host_state()
    if inline_profile is not None:
        m.op_profile = inline_profile
    elif profiled:
        progress("per-op profile (separate pass, profiler on)")
        prof = run_child(
            {**base, "mode": "op_profile", "iterations": settings.op_profile_iterations},
            timeout_s,
            env=dict(caps.op_profile_env),
        )
        m.op_profile = prof["op_profile"]
    return m


def artifact_request(target: Target, artifact: Artifact) -> dict:
    """What a measuring process opens: the target with its options and the artifact."""
    return {
        "target": artifact.target,
        "artifact_dir": str(artifact.directory),
        "main_file": artifact.main_file,
        "options": target.options.model_dump(mode="json"),
    }


LOOP_TIMEOUT_S = 1800  # one process's whole loop: every prompt length's generations, every timed stream


def measure_loop(
    request: dict,
    repeats: int,
    first_wants: str,
    summarize: Callable[[list[dict]], Any],
    undecided: Callable[[Any], bool],
    ui: Any,
    what: str,
    emulated: str | None,
) -> Any:
    """A workload's loop (runner mode = its kind, in `request`) in `repeats` fresh processes, the first asked for
    `first_wants` (the tokens or outputs its accuracy is judged on), summarized; where a timing budget is then
    undecided (never through an emulator), as many processes more, once (DESIGN §4). `what`: the step's line."""
    label, results = request["mode"], []
    with ui.step(what):
        for r in range(repeats):
            ui.detail(f"{label}: process {r + 1}/{repeats}")
            results.append(run_child({**request, first_wants: r == 0}, timeout_s=LOOP_TIMEOUT_S))
    result = summarize(results)
    if not emulated and undecided(result):
        with ui.step(f"{label}: a timing budget is inconclusive, {repeats} processes more"):
            for r in range(repeats):
                ui.detail(f"{label}: process {repeats + r + 1}/{2 * repeats}")
                results.append(run_child({**request, first_wants: False}, timeout_s=LOOP_TIMEOUT_S))
        result = summarize(results)
        result.notes.append("a timing budget was inconclusive; sampling was doubled once")
    if emulated:
        result.notes.append(f"emulated: {emulated}; timings not judged")
    return result


def placement_from_profile(profile: dict | None, accelerator: str) -> dict | None:
    """Which nodes ran on the target's own provider, from the per-op profile: an ORT execution provider
    hands what it has no kernel for to the CPU EP without a word. Counted per op type (calls per run)."""
    if not profile or not profile.get("op_types"):
        return None
    runs = profile.get("runs") or 1
    total = on = 0
    off = []
    for row in profile["op_types"]:
        nodes = max(1, round(row["calls"] / runs))
        total += nodes
        if row["provider"] == accelerator:
            on += nodes
        else:
            off.append({"node": f"{nodes} node(s)", "op_type": row["op_type"], "reason": f"ran on {row['provider']}"})
    return {
        "accelerator": accelerator,
        "total_nodes": total,
        "on_accelerator": on,
        "off_share": (total - on) / total if total else 0.0,
        "off": off,
        "subgraphs": None,
        "source": "the per-op profile's provider per node (shape computations on the CPU EP are usual; "
        "compute ops there are not)",
    }


EMULATED_ITERATIONS = 10


def for_emulator(settings: CheckSettings) -> CheckSettings:
    """An emulator's timings are never judged: run enough for parity and a labelled figure, no more
    (an emulated transformer takes seconds per inference)."""
    return settings.model_copy(
        update={
            "iterations": min(settings.iterations, EMULATED_ITERATIONS),
            "repeats": 1,
            "op_profile": False,
            "warmup_min_iters": 1,
            "warmup_min_s": 0.0,
            "warmup_max_s": 1.0,
            "energy_window_s": 0.0,
        }
    )
