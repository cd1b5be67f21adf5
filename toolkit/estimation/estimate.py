"""Latency estimate for a device that is not here: roofline per kernel, calibrated where measured.

Per kernel (`cost_units.py`): the roofline time max(FLOPs / peak at its precision, bytes / bandwidth).
The sum is a lower bound (research/profiling-modeling.md §1.4: rooflines are optimistic at batch 1).
With a calibration for the device and target (`fit.py`), each kernel costs its class's
fitted time per kernel plus a fitted multiple of its roofline time, and the fitted time outside the
ops is added; the error band is the calibration's held-out error. Without one, only the lower bound is known, and that is what the estimate says.

Budgets judged on an estimate get `estimated-pass` / `estimated-fail` (DESIGN §4): never a silent
pass, turned into failures by `--strict`, replaced by measured verdicts at `tapeout check`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapeout.builds.reader import BuildDir
from tapeout.core.errors import BadInput
from tapeout.core.host import host_fingerprint
from tapeout.core.schemas import Budgets
from tapeout.core.verdict import BudgetResult, Verdict
from tapeout.estimation import bottleneck, generation, host_probes, roofline
from tapeout.estimation import cost_units as kern
from tapeout.estimation import fit as calib
from tapeout.estimation.build_structure import kernels_of, phases_of

METHOD_BOUND = "roofline lower bound: Σ max(FLOPs / peak, bytes / bandwidth) per kernel, no overhead"
METHOD_CALIBRATED = (
    "calibrated roofline: per kernel, a fitted cost per kernel of its class plus a fitted "
    "multiple of its roofline time; plus the fitted time outside the ops"
)


@dataclass
class Estimate:
    device: str
    target: str
    precision: str
    roof: roofline.Roof
    kernels: list[kern.Kernel]
    lower_bound_s: float
    predicted_s: float | None = None
    band: tuple[float, float] | None = None  # relative error range from the calibration's held-out models
    tails: dict[str, float] = field(default_factory=dict)
    calibration: str | None = None  # its summary and file
    per_kernel_s: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    generation: Any = None  # a generate workload's TTFT and TPOT (generation.GenerationEstimate)

    @property
    def method(self) -> str:
        return METHOD_CALIBRATED if self.predicted_s is not None else METHOD_BOUND

    def quantile_ms(self, q: str) -> tuple[float, float, float] | None:
        """(point, low, high) for p50/p90/p99 in ms, or None without a calibration."""
        if self.predicted_s is None:
            return None
        point = self.predicted_s * (1.0 if q == "p50" else self.tails.get(q, 1.0)) * 1e3
        lo, hi = self.band or (0.0, 0.0)
        # predicted = measured·(1 + error): the measured value lies in [point/(1+hi), point/(1+lo)]
        return point, point / (1 + hi), point / max(1 + lo, 0.01)  # a held-out prediction of ~0: 100x, not ∞

    def by_class(self) -> list[dict[str, Any]]:
        rows: dict[str, dict[str, Any]] = {}
        times = kern.model_times(self.kernels, self.roof)
        for k, seconds, t in zip(self.kernels, self.per_kernel_s or [0.0] * len(self.kernels), times, strict=True):
            row = rows.setdefault(
                k.cls, {"class": k.cls, "kernels": 0, "flops": 0, "bytes": 0.0, "roofline_us": 0.0, "predicted_us": 0.0}
            )
            row["kernels"] += 1
            row["flops"] += k.flops
            row["bytes"] += k.bytes
            row["roofline_us"] += max(t) * 1e6
            row["predicted_us"] += seconds * 1e6
        return sorted(rows.values(), key=lambda r: -(r["predicted_us"] or r["roofline_us"]))

    def to_json(self, top: int = 15) -> dict[str, Any]:
        times = kern.model_times(self.kernels, self.roof)
        order = sorted(range(len(self.kernels)), key=lambda i: -max(times[i]))
        return {
            "device": self.device,
            "target": self.target,
            "precision": self.precision,
            "method": self.method,
            "roof": self.roof.to_json(),
            "lower_bound_ms": self.lower_bound_s * 1e3,
            "predicted_ms": {
                q: dict(zip(("point", "low", "high"), v, strict=True))
                for q in ("p50", "p90", "p99")
                if (v := self.quantile_ms(q))
            }
            or None,
            "band": list(self.band) if self.band else None,
            "calibration": self.calibration,
            "kernels": len(self.kernels),
            "by_class": self.by_class(),
            "top_kernels": [
                {**self.kernels[i].to_json(), "compute_us": times[i][0] * 1e6, "memory_us": times[i][1] * 1e6}
                for i in order[:top]
            ],
            "notes": self.notes,
            **({"generation": self.generation.to_json()} if self.generation is not None else {}),
        }

    def line(self) -> str:
        if self.predicted_s is None:
            return (
                f"estimate for {self.device}: roofline lower bound {self.lower_bound_s * 1e3:.4g} ms "
                f"({len(self.kernels)} kernels); no calibration for {self.device} × {self.target}"
            )
        p50 = self.quantile_ms("p50")
        band = f" [{p50[1]:.4g}, {p50[2]:.4g}]" if self.band else " (no error band: too few models)"
        return (
            f"estimate for {self.device}: p50 {p50[0]:.4g} ms{band}; roofline lower bound "
            f"{self.lower_bound_s * 1e3:.4g} ms; {self.calibration}"
        )


def roof_for(
    device_spec, host: dict, cal: calib.Calibration | None = None, threads: int | None = None
) -> roofline.Roof:
    """The device spec's roofs; or this host's CPU at `threads` inference threads where that is fewer than its cores
    (`host_threads`): the roof a calibration made for this very device was priced at, else its ceilings from the
    probes kept for it (measured now where none are kept; none for another machine's CPU: its flags alone). As its
    JSON records it (`Roof.as_recorded`), so a build priced again at the roof its report recorded gives the same
    figure."""
    if device_spec is not None:
        return roofline.from_spec(device_spec).as_recorded()
    if cal is not None and cal.device == roofline.host_name(host) + (f"-{threads}t" if threads else ""):
        return roofline.Roof.from_json(cal.roof).as_recorded()
    probes = host_probes.kept(host) if host_probes.is_here(host) else None
    return roofline.for_host(host, probes, threads).as_recorded()


def host_threads(host: dict, options: Any) -> int | None:
    """The target's `threads` option where it runs fewer inference threads than the host has cores, else None
    (0 or unset is one thread per core; a report from elsewhere may carry anything: ints only)."""
    threads = options.get("threads") if isinstance(options, dict) else getattr(options, "threads", None)
    cores = host.get("cpu_affinity") or host.get("physical_cores")
    if isinstance(threads, int) and not isinstance(threads, bool) and isinstance(cores, int) and 0 < threads < cores:
        return threads
    return None


def device_name(device_spec, host: dict, options: Any = None) -> str:
    """The device spec's name; for this machine's CPU, `host-<key>`, and `host-<key>-<N>t` where the target's
    `threads` option runs fewer inference threads than the host has cores: a calibration is fitted per thread
    count (one thread's per-op costs are not two threads'), so each count is its own device to the estimator."""
    if device_spec is not None:
        return device_spec.name
    threads = host_threads(host, options)
    return roofline.host_name(host) + (f"-{threads}t" if threads else "")


def off_host(target: str) -> bool:
    """The target never runs on the host's CPU (a GPU): its estimate needs a device spec, never the host's roof."""
    from tapeout import targets

    return "cpu" not in targets.info(target).device_classes


def spec_for_run(target: str, device_spec, reported: str | None):
    """The device to estimate for: the profile's spec; for a target off the host's CPU with none, the shipped
    spec the device that ran it matches (None where none does); else None, meaning this host's CPU."""
    from tapeout.core.config import device_matching

    if device_spec is None and off_host(target):
        return device_matching(reported)
    return device_spec


def why_not_priced(target: str, device_spec) -> str | None:
    """Why `device_spec` cannot price a build of `target`, or None: a spec's peaks are those of its accelerator
    (a GPU's; an SoC's GPU, NPU or DLA), so a target that runs elsewhere on the device (on its CPU) is not priced
    by them."""
    from tapeout import targets

    if device_spec is None:
        return None
    priced = (
        {"cpu"}
        if device_spec.kind == "cpu"
        else {"gpu"}
        if device_spec.kind == "gpu"
        else set(device_spec.compute_units) - {"cpu"}
    )
    runs_on = set(targets.info(target).device_classes) - {"phone"}  # a form factor, not a compute unit
    if runs_on & priced:
        return None
    return (
        f"{target} runs on a {' or '.join(sorted(runs_on))}, and {device_spec.name}'s spec gives the peaks of its "
        f"{', '.join(sorted(priced))} only"
    )


def nothing_to_estimate(target: str, device_spec, emulated) -> bool:
    """No device to estimate for: no spec (nor one matching the GPU that ran), and the target either
    emulated here or never on the host's CPU, so the host's roof would be the wrong device."""
    return device_spec is None and bool(emulated or off_host(target))


def find_calibration(device: str, target: str, host: dict | None, device_spec) -> tuple[calib.Calibration, Path] | None:
    """The calibration for (device, target); for this host's CPU with none of its own, its CPU class's
    (`roofline.cpu_class`, with the same thread suffix), whose efficiencies carry to it at its own roof."""
    found = calib.find(device, target)
    if found is not None or device_spec is not None or host is None:
        return found
    suffix = device[len(roofline.host_name(host)) :] if device.startswith(roofline.host_name(host)) else ""
    return calib.find(roofline.cpu_class(host) + suffix, target)


def _device_roof(device_spec, host: dict, options: Any, target: str, cal) -> tuple[Any, roofline.Roof]:
    """(calibration, roof) for the device `device_name` gives: `cal=True` looks its calibration up. The roof is
    named like the device, so a fewer-thread host run keeps its own name through the estimate and its records,
    and its compute peak is that of the cores it runs on."""
    device = device_name(device_spec, host, options)
    if cal is True:
        cal = find_calibration(device, target, host, device_spec)
    threads = None if device_spec is not None else host_threads(host, options)
    return cal, dataclasses.replace(roof_for(device_spec, host, cal[0] if cal else None, threads), name=device)


def float_runs_in(target: str, options: Any, host: dict | None, device_spec, float_precision: str) -> str:
    """The precision a build's float kernels run in: OpenVINO on a CPU host runs FP32 models in BF16 where the CPU
    has BF16 units and no inference precision says otherwise (its CPU plugin's default), and a bound priced at FP32
    there is beaten."""
    if target != "openvino" or device_spec is not None or host is None or float_precision != "fp32":
        return float_precision
    hint = (
        options.get("inference_precision")
        if isinstance(options, dict)
        else getattr(options, "inference_precision", None)
    )
    device = options.get("device") if isinstance(options, dict) else getattr(options, "device", "CPU")
    if (device or "CPU") != "CPU":
        return float_precision
    flags = set(host.get("cpu_flags") or [])
    if hint == "bf16" or (hint in (None, "default") and flags & {"avx512_bf16", "amx_bf16"}):
        return "bf16"
    return "fp16" if hint == "f16" else float_precision


def estimate(
    kernels: list[kern.Kernel],
    roof: roofline.Roof,
    target: str,
    precision: str,
    cal: tuple[calib.Calibration, Path] | None,
) -> Estimate:
    # fsum: correctly rounded whatever the kernels' order, which a build dir's reader need not keep (a set's order
    # changes with the hash seed), so the same build estimated twice gives the same figure to the last bit
    times = kern.model_times(kernels, roof)
    bound = math.fsum(max(t) for t in times)
    est = Estimate(roof.name, target, precision, roof, kernels, bound)
    if roof.bandwidth is None:
        est.notes.append("no memory bandwidth is known for this device: the bound counts compute only")
    if not roof.cache and any(k.reread and k.launches > 1 for k in kernels):
        est.notes.append(
            "the recurrent weights a cell re-reads every time step are not priced: the device spec "
            "gives no cache bandwidth"
        )
    missing = sorted({k.precision for k in kernels if roof.peak(k.precision)[0] is None})
    if missing:
        est.notes.append(f"the device spec gives no peak for {', '.join(missing)}: those kernels count bandwidth only")
    if cal is None:
        est.per_kernel_s = [max(t) for t in times]
        return est
    c, path = cal
    f = c.fit
    est.per_kernel_s = [f.kernel_s(k.cls, precision, max(t), k.launches) for k, t in zip(kernels, times, strict=True)]
    est.predicted_s = f.fixed_s + math.fsum(est.per_kernel_s)
    est.band, est.tails = c.band, f.tails
    carried = f" (carried from {c.device}: no calibration of this very device)" if c.device != roof.name else ""
    est.calibration = f"calibration {path.name}{carried}: {c.summary()}"
    return est


def _priced_kernels(
    structure: list[kern.Kernel],
    plan: dict | None,
    precision: str,
    target: str,
    options: Any,
    host: dict | None,
    device_spec,
    est_notes: list[str],
) -> list[kern.Kernel]:
    float_precision = kern.float_precision(precision, plan)
    runs_in = float_runs_in(target, options, host, device_spec, float_precision)
    if runs_in != float_precision:
        est_notes.append(f"OpenVINO runs this CPU's float kernels in {runs_in} (its inference precision): priced so")
    return kern.at_precision(structure, plan, runs_in)


def for_build(
    build: BuildDir,
    cal: tuple[calib.Calibration, Path] | bool | None = True,
    host: dict | None = None,
    device_spec=None,
    reported: str | None = None,
    target: str | None = None,
    recorded_roof: bool = True,
) -> Estimate:
    """The estimate for a build dir's model on its profile's device, or on `device_spec`. Where neither names
    one: for a GPU target, the shipped spec matching the device that ran it (`reported`, by default the build's);
    for a CPU target, the CPU of `host` (by default the one the build ran on), at the roof the build recorded
    when no calibration applies (`recorded_roof`), so a build estimated twice gives one figure. `target`: price it
    as that target would run it (a device the build's own target cannot run on). Everything is read through the
    verified reader. `cal=True` looks the calibration up; pass one (or None) instead."""
    report, man, directory = build.report, build.manifest, build.directory
    explicit = device_spec is not None
    device_spec = device_spec or build.device_spec
    target = target or report.target.name
    why = why_not_priced(target, device_spec)
    if why and explicit:
        raise BadInput(
            f"{directory}: {why}: they cannot price this build",
            fix="add --target T to price the model as a target that runs there would (`tapeout targets` "
            "lists them), or leave --device out for the build's own device",
        )
    if why:
        raise BadInput(
            f"{directory}: {why}: the profile's device cannot price this build",
            fix="name a device its target runs on: tapeout estimate BUILD_DIR --device NAME",
        )
    structure = kernels_of(build)
    if structure is None:
        raise BadInput(
            f"{directory} holds neither structure.json nor export/model.onnx",
            fix="point at a folder `tapeout build` wrote",
        )
    host = host or report.host.model_dump()
    reported = reported or (report.device.reported if report.device else None)
    device_spec = spec_for_run(target, device_spec, reported)
    workload = build.workload_settings()
    if device_spec is None and off_host(target):
        raise BadInput(
            f"{directory}: {target} ran on {reported or 'a device the meters did not name'}, "
            "which no shipped device spec matches, and the profile names none",
            fix="name the device: tapeout estimate BUILD_DIR --device NAME (tapeout profiles show lists them)",
        )
    options = (man.profile or {}).get("options")
    name = device_name(device_spec, host, options)
    if cal is True:
        cal = find_calibration(name, target, host, device_spec)
    kept = _recorded_roof(report, name) if recorded_roof and not cal else None
    if device_spec is None and not cal and kept is None and not host_probes.is_here(host):
        raise BadInput(
            f"{directory} ran on another CPU ({roofline.host_key(host)}), its report records no roof, and "
            "no calibration for it is here",
            fix="estimate it on that machine, or name a device (--device)",
        )
    if kept is not None:
        roof = kept
    else:
        cal, roof = _device_roof(device_spec, host, options, target, cal)
    plan = report.quantization.plan.model_dump(mode="json") if report.quantization else None
    precision = report.profile.precision
    notes: list[str] = []
    kernels = _priced_kernels(structure, plan, precision, target, options, host, device_spec, notes)
    est = estimate(kernels, roof, target, precision, cal or None)
    est.notes += notes
    if target != report.target.name:
        est.notes.append(f"priced as {target} would run the model (the build is for {report.target.name})")
    phases = phases_of(build)
    if phases and workload is not None:  # the calls of a decoder's loop (analyze: Workload.phases)
        runs_in = float_runs_in(target, options, host, device_spec, kern.float_precision(precision, plan))
        est.generation = generation.price(phases, roof, target, precision, plan, cal or None, workload, runs_in)
    return est


def _recorded_roof(report, device: str) -> roofline.Roof | None:
    """The host roof the build's own estimate priced at, where it was for `device` (this CPU, this thread count)."""
    recorded = report.estimate.roof if report.estimate is not None else None
    if recorded is None or recorded.name != device or recorded.kind != "cpu" or not recorded.name.startswith("host-"):
        return None
    return roofline.Roof.from_json(recorded.model_dump(), note="the roof this build recorded when it was built")


def for_model(
    setup,
    structure: list[kern.Kernel],
    plan: dict | None,
    reported: str | None = None,
    phases: list[generation.Phase] | None = None,
    workload: Any = None,
) -> Estimate | None:
    """The estimate for a build or check in progress (`setup`: its profile, target, device spec and emulation),
    from the kernels `cost_units.structure` found at analysis and the precision plan: the profile's device; for a
    GPU target, the shipped spec matching the device that ran it (`reported`); or this host's CPU where a CPU
    target runs here. None where there is no device to estimate for: an emulated target, or a GPU no shipped
    spec matches, on a profile naming no device."""

    device = spec_for_run(setup.target.name, setup.device, reported)
    if nothing_to_estimate(setup.target.name, device, setup.emulated) or why_not_priced(setup.target.name, device):
        return None
    host = host_fingerprint()
    cal, roof = _device_roof(device, host, setup.target.options, setup.target.name, True)
    precision = setup.profile.precision
    notes: list[str] = []
    kernels = _priced_kernels(structure, plan, precision, setup.target.name, setup.target.options, host, device, notes)
    est = estimate(kernels, roof, setup.target.name, precision, cal)
    est.notes += notes
    if phases and workload is not None:  # the calls of a decoder's loop (analyze: Workload.phases)
        runs_in = float_runs_in(
            setup.target.name, setup.target.options, host, device, kern.float_precision(precision, plan)
        )
        est.generation = generation.price(phases, roof, setup.target.name, precision, plan, cal, workload, runs_in)
    return est


def with_measured(
    est: Estimate, measured_p50_ms: float | None, measured_generation: dict | None = None
) -> dict[str, Any]:
    """The estimate's JSON, with the measured p50 and the prediction's error where this run measured it (and the
    generation loop's, for a generate workload)."""
    data = est.to_json()
    predicted = est.quantile_ms("p50")
    data["measured_p50_ms"] = measured_p50_ms
    data["error"] = predicted[0] / measured_p50_ms - 1 if predicted and measured_p50_ms else None
    if est.generation is not None:
        data["generation"] = generation.with_measured(est.generation, measured_generation)
    return data


# ---------------------------------------------------------------- verdicts on an estimate


def judge(budgets: Budgets, est: Estimate, why_not_measured: str) -> list[BudgetResult]:
    """Latency budgets decided on the estimate: estimated-pass when even the band's slow end is under the
    limit, estimated-fail when its fast end (or the roofline bound) is over it; a band straddling the
    limit decides on the point and says so. Without a calibration only a failure can be estimated."""
    results = []
    for q, limit in budgets.latency_quantiles().items():
        name, key = f"latency_p{q * 100:g}_ms", f"p{q * 100:g}"
        bound = est.lower_bound_s * 1e3
        if bound > limit:
            results.append(
                BudgetResult(
                    name,
                    limit,
                    "ms",
                    Verdict.ESTIMATED_FAIL,
                    bound,
                    None,
                    f"{why_not_measured}; even the roofline lower bound on {est.device} is {bound:.4g} ms > limit",
                )
            )
            continue
        value = est.quantile_ms(key)
        if value is None:
            results.append(
                BudgetResult(
                    name,
                    limit,
                    "ms",
                    Verdict.UNMEASURED,
                    None,
                    None,
                    f"{why_not_measured}; the roofline lower bound on {est.device} is {bound:.4g} ms"
                    f" (under the limit) and there is no calibration for {est.device} × "
                    f"{est.target} to estimate more: `tapeout calibrate` with builds checked there",
                )
            )
            continue
        point, low, high = value
        if est.band is None:
            verdict = Verdict.ESTIMATED_PASS if point <= limit else Verdict.ESTIMATED_FAIL
            how = "no error band (the calibration has too few models to hold one out)"
        elif high <= limit:
            verdict, how = Verdict.ESTIMATED_PASS, f"band [{low:.4g}, {high:.4g}] ms under the limit"
        elif low > limit:
            verdict, how = Verdict.ESTIMATED_FAIL, f"band [{low:.4g}, {high:.4g}] ms over the limit"
        else:
            verdict = Verdict.ESTIMATED_PASS if point <= limit else Verdict.ESTIMATED_FAIL
            how = f"band [{low:.4g}, {high:.4g}] ms straddles the limit: decided on the point"
        results.append(
            BudgetResult(
                name,
                limit,
                "ms",
                verdict,
                point,
                (low, high) if est.band else None,
                f"{why_not_measured}; estimated {key} {point:.4g} ms on {est.device}, {how}; "
                "`tapeout check` on the device measures it",
            )
        )
    return results


# ---------------------------------------------------------------- records for calibration


def profiled_classes(profile: dict, kernels: list[kern.Kernel], scale: float = 1.0) -> dict[str, float]:
    """Seconds per inference the profiler spent per kernel class (times `scale`): each profiled layer in the class of
    its op type."""
    out: dict[str, float] = {}
    for row in profile["op_types"]:
        cls = kern.op_class(row["op_type"])
        out[cls] = out.get(cls, 0.0) + row["total_us"] / profile["runs"] * scale * 1e-6
    return out


def measured_record(build: BuildDir) -> tuple[calib.Record, dict] | str:
    """A build (or its check) measured on the device itself, as a calibration record with its device,
    target and host; or why it cannot be one."""
    directory, report = build.directory, build.report
    measured, _ = build.measured()
    if measured.target.emulated:
        return f"{directory}: emulated ({measured.target.emulated}); its timings are not the device's"
    m = measured.to_json()["measurement"]
    q = (m.get("latency_ms") or {}).get("quantiles") or {}
    profile = m.get("op_profile")
    if not q.get("p50") or not profile or not profile.get("runs") or not profile.get("mean_run_us"):
        return f"{directory}: no measured latency with a per-op profile"
    p50 = q["p50"]["point"]
    tails = {k: q[k]["point"] / p50 for k in ("p90", "p99") if k in q and p50}
    est = for_build(
        build,
        cal=None,
        host=measured.host.model_dump(),
        recorded_roof=False,  # the calibration's roof
        reported=measured.device.reported if measured.device else None,
    )  # a GPU: the one that ran
    measured_s = profiled_classes(profile, est.kernels, bottleneck.profiler_scale(profile, p50))
    record = calib.Record(
        model=report.project.name,
        precision=report.profile.precision,
        source=str(directory),
        created=measured.created,
        p50_s=p50 / 1e3,
        tails=tails,
        roof_s=kern.class_roofs(est.kernels, est.roof),
        measured_s=measured_s,
        kernels=len(est.kernels),
        counts=kern.class_counts(est.kernels),
    )
    return record, {
        "device": est.device,
        "target": measured.target.name,
        "kind": est.roof.kind,
        "roof": est.roof.to_json(),
        "host_key": roofline.host_key(measured.host.model_dump()),
    }
