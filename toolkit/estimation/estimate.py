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
from tapeout.estimation import bottleneck, generation, host_drift, host_roof, roofline, strided
from tapeout.estimation import cost_units as kern
from tapeout.estimation import fit as calib
from tapeout.estimation import openvino_graph as ov_graph
from tapeout.estimation import predictor as predictors
from tapeout.estimation import runtime_graph as graphs
from tapeout.estimation.build_structure import kernels_of, phases_of

# the classes whose kernels read weights: their floor is the whole call's traffic's cache level (`_predicted`)
WEIGHTED = frozenset({"matmul", "conv", "recurrent"})
METHOD_BOUND = "roofline lower bound: Σ max(FLOPs / peak, bytes / bandwidth) per kernel, no overhead"
METHOD_CALIBRATED = ("calibrated roofline: per kernel, a fitted cost per kernel of its class plus a fitted "
                     "multiple of its roofline time; plus the fitted time outside the ops")
METHOD_PREDICTED = ("kernel predictors: per kernel, its class's predictor trained on a sweep of the device (never under "
                    "its roofline time); plus the runtime's time per run with no kernel")


@dataclass
class Estimate:
    device: str
    target: str
    precision: str
    roof: roofline.Roof
    kernels: list[kern.Kernel]
    lower_bound_s: float
    predicted_s: float | None = None
    band: tuple[float, float] | None = None     # relative error range from the calibration's held-out models
    tails: dict[str, float] = field(default_factory=dict)
    calibration: str | None = None              # its summary and file
    per_kernel_s: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    generation: Any = None                      # a generate workload's TTFT and TPOT (generation.GenerationEstimate)

    predictor: str | None = None                # its summary and file, where kernel predictors priced it
    unpredicted: list[str] = field(default_factory=list)  # `class@precision` no predictor priced (kernel predictors)
    learned_gflops: float | None = None         # the host's FP32 probe over the predictors' sweep (host_drift.py)

    @property
    def method(self) -> str:
        if self.predictor:
            return METHOD_PREDICTED
        return METHOD_CALIBRATED if self.predicted_s is not None else METHOD_BOUND

    def quantile_ms(self, q: str) -> tuple[float, float, float] | None:
        """(point, low, high) for p50/p90/p99 in ms, or None without a calibration."""
        if self.predicted_s is None or (q != "p50" and q not in self.tails):  # predictors without a tail: p50 only
            return None
        point = self.predicted_s * (1.0 if q == "p50" else self.tails.get(q, 1.0)) * 1e3
        lo, hi = self.band or (0.0, 0.0)
        # predicted = measured·(1 + error): the measured value lies in [point/(1+hi), point/(1+lo)]
        return point, point / (1 + hi), point / max(1 + lo, 0.01)  # a held-out prediction of ~0: 100x, not ∞

    def by_class(self) -> list[dict[str, Any]]:
        rows: dict[str, dict[str, Any]] = {}
        for k, seconds in zip(self.kernels, self.per_kernel_s or [0.0] * len(self.kernels), strict=True):
            row = rows.setdefault(k.cls, {"class": k.cls, "kernels": 0, "flops": 0, "bytes": 0.0, "roofline_us": 0.0,
                                          "predicted_us": 0.0})
            row["kernels"] += 1
            row["flops"] += k.flops
            row["bytes"] += k.bytes
            row["roofline_us"] += max(kern.roof_times(k, self.roof)) * 1e6
            row["predicted_us"] += seconds * 1e6
        return sorted(rows.values(), key=lambda r: -(r["predicted_us"] or r["roofline_us"]))

    def to_json(self, top: int = 15) -> dict[str, Any]:
        order = sorted(range(len(self.kernels)), key=lambda i: -max(kern.roof_times(self.kernels[i], self.roof)))
        return {
            "device": self.device, "target": self.target, "precision": self.precision, "method": self.method,
            "roof": self.roof.to_json(), "lower_bound_ms": self.lower_bound_s * 1e3,
            "predicted_ms": {q: dict(zip(("point", "low", "high"), v, strict=True))
                             for q in ("p50", "p90", "p99") if (v := self.quantile_ms(q))} or None,
            "band": list(self.band) if self.band else None, "calibration": self.calibration,
            **({"learned_fp32_gflops": self.learned_gflops} if self.learned_gflops else {}),
            "kernels": len(self.kernels), "by_class": self.by_class(),
            "top_kernels": [{**self.kernels[i].to_json(),
                             "compute_us": kern.roof_times(self.kernels[i], self.roof)[0] * 1e6,
                             "memory_us": kern.roof_times(self.kernels[i], self.roof)[1] * 1e6} for i in order[:top]],
            "notes": self.notes,
            **({"generation": self.generation.to_json()} if self.generation is not None else {}),
        }

    def line(self) -> str:
        if self.predicted_s is None:
            return (f"estimate for {self.device}: roofline lower bound {self.lower_bound_s * 1e3:.4g} ms "
                    f"({len(self.kernels)} kernels); no calibration for {self.device} × {self.target}")
        p50 = self.quantile_ms("p50")
        band = f" [{p50[1]:.4g}, {p50[2]:.4g}]" if self.band else " (no error band: too few models)"
        if self.predictor:
            return (f"estimate for {self.device}: p50 {p50[0]:.4g} ms{band}; roofline lower bound "
                    f"{self.lower_bound_s * 1e3:.4g} ms; {self.predictor}")
        return (f"estimate for {self.device}: p50 {p50[0]:.4g} ms{band}; roofline lower bound "
                f"{self.lower_bound_s * 1e3:.4g} ms; {self.calibration}")


def roof_for(device_spec, host: dict, cal: calib.Calibration | None = None, threads: int | None = None) -> roofline.Roof:
    """The device spec's roofs, or this host's CPU (with the bandwidth its calibration measured, if any) at
    `threads` inference threads where that is fewer than its cores (`host_threads`); as its JSON records it
    (`Roof.as_recorded`), so a build priced again at the roof its report recorded gives the same figure."""
    return _roof_for(device_spec, host, cal, threads).as_recorded()


def _roof_for(device_spec, host: dict, cal: calib.Calibration | None, threads: int | None) -> roofline.Roof:
    if device_spec is not None:
        return roofline.from_spec(device_spec)
    # a calibration's records were priced against its roof: estimates with it use the same one
    bandwidth = (cal.roof.get("bandwidth_gbs") or 0) * 1e9 if cal else None
    fp32 = ((cal.roof.get("peaks_tops") or {}).get("fp32") or 0) * 1e12 if cal else None
    int8 = ((cal.roof.get("peaks_tops") or {}).get("int8") or 0) * 1e12 if cal else None
    # a calibration from before the cache was measured priced its records without it: so do its estimates
    cache = tuple((size, rate * 1e9) for size, rate in cal.roof.get("cache_bandwidth_gbs", ())) if cal else None
    # and so its strided loop, or none where it was made before the loop was measured
    looped = (strided.Strided.from_json(cal.roof.get("strided")) or strided.UNMEASURED) if cal else None
    # without a calibration: what was measured on this host once and kept, so every estimate prices alike (another
    # CPU's build is priced at the roof it recorded, `for_build`; anything else measures here, now)
    kept = host_roof.kept_or_measured(host) if cal is None and host_roof.is_here(host) else None
    roof = roofline.for_host(host, bandwidth or None, fp32 or None, threads, cache, kept, looped, int8 or None)
    # one thread's read stream past the caches: the calibration's, or the kept one's (never measured in passing,
    # so an estimate prices as the one before it; none where neither has it, and DRAM's bandwidth stands in). Only
    # for a device of one inference thread: more threads stream more, and that is not measured
    stream = ((cal.roof.get("stream_gbs") or 0) * 1e9 or None) if cal else (kept.stream_bytes if kept else None)
    one_thread = threads == 1 or (threads is None and (host.get("cpu_affinity") or host.get("physical_cores")) == 1)
    if not stream or not one_thread:
        return roof
    note = (f"bytes past the caches are read at {stream / 1e9:.1f} GB/s, one thread's stream measured here (a "
            "decode step's weights), not at the copy bandwidth")
    return dataclasses.replace(roof, stream=stream, notes=[*roof.notes, note])


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
    priced = {"cpu"} if device_spec.kind == "cpu" else {"gpu"} if device_spec.kind == "gpu" else \
        set(device_spec.compute_units) - {"cpu"}
    runs_on = set(targets.info(target).device_classes) - {"phone"}  # a form factor, not a compute unit
    if runs_on & priced:
        return None
    return (f"{target} runs on a {' or '.join(sorted(runs_on))}, and {device_spec.name}'s spec gives the peaks of its "
            f"{', '.join(sorted(priced))} only")


def nothing_to_estimate(target: str, device_spec, emulated) -> bool:
    """No device to estimate for: no spec (nor one matching the GPU that ran), and the target either
    emulated here or never on the host's CPU, so the host's roof would be the wrong device."""
    return device_spec is None and bool(emulated or off_host(target))


def _device_roof(device_spec, host: dict, options: Any, target: str, cal) -> tuple[Any, roofline.Roof]:
    """(calibration, roof) for the device `device_name` gives: `cal=True` looks its calibration up. The roof is
    named like the device, so a fewer-thread host run keeps its own name through the estimate and its records,
    and its compute peak is that of the cores it runs on."""
    device = device_name(device_spec, host, options)
    if cal is True:
        cal = calib.find(device, target)
    threads = None if device_spec is not None else host_threads(host, options)
    return cal, dataclasses.replace(roof_for(device_spec, host, cal[0] if cal else None, threads), name=device)


def estimate(kernels: list[kern.Kernel], roof: roofline.Roof, target: str, precision: str,
             cal: tuple[calib.Calibration, Path] | None, pred: predictors.Predictor | None = None,
             executed: int | None = None, inputs: int = 1) -> Estimate:
    # fsum: correctly rounded whatever the kernels' order, which a build dir's reader need not keep (a set's order
    # changes with the hash seed), so the same build estimated twice gives the same figure to the last bit
    bound = math.fsum(max(kern.roof_times(k, roof)) for k in kernels)
    est = Estimate(roof.name, target, precision, roof, kernels, bound)
    if roof.bandwidth is None:
        est.notes.append("the device spec gives no memory bandwidth: the bound counts compute only")
    if not roof.cache and any(k.reread and k.launches > 1 for k in kernels):
        est.notes.append("the recurrent weights a cell re-reads every time step are not priced: the device spec "
                         "gives no cache bandwidth")
    missing = sorted({k.precision for k in kernels if roof.peak(k.precision)[0] is None})
    if missing:
        est.notes.append(f"the device spec gives no peak for {', '.join(missing)}: those kernels count bandwidth only")
    if pred is not None:
        return _predicted(est, kernels, roof, pred, cal, (executed, inputs))
    if cal is None:
        est.per_kernel_s = [max(kern.roof_times(k, roof)) for k in kernels]
        return est
    c, path = cal
    f = c.fit
    est.per_kernel_s = [f.kernel_s(k.cls, precision, max(kern.roof_times(k, roof)), k.launches) for k in kernels]
    est.predicted_s = f.fixed_s + math.fsum(est.per_kernel_s)
    est.band, est.tails = c.band, f.tails
    est.calibration = f"calibration {path.name}: {c.summary()}"
    return est


def _predicted(est: Estimate, kernels: list[kern.Kernel], roof: roofline.Roof, pred: predictors.Predictor,
               cal: tuple[calib.Calibration, Path] | None, graph: tuple[int | None, int] = (None, 1)) -> Estimate:
    """Each kernel at its class's predictor at its precision (`matmul@int8` for an INT8 MatMul); a kernel no
    predictor covers (a precision or class the sweep has too few points of) at the calibration's fit where there is
    one, else its roofline time. `graph`: (the nodes the runtime's optimized graph runs (`runtime_graph.executed_nodes`), the model's
    inputs); the nodes beyond the kernels each cost a dispatch, as a view does (the sweep's measured `dispatch_s`;
    for a file trained before it was kept, the movement predictor's time for a kernel moving nothing) — on the toy transformers here, ONNX Runtime ran 67–77 nodes
    for 43–48 kernels, and leaving them out under-predicted those models by a third."""
    per, left, priced, inside = [], set(), set(), 0
    # the floor under a prediction: the kernel's roofline time with its bytes at the rate of the cache level the
    # whole call's traffic fits in (DRAM past the last level). The sweep's one-kernel models run cache-hot, and the
    # predictors learned that; a floor at DRAM bandwidth put every small model's matmuls on it (tiny-lm's decode
    # step: 25 matmuls priced at 175 µs of a 190 µs step whose matmuls the profiler put at about a fifth)
    # — for a kernel with weights. One of activations only (an elementwise op, a norm, a softmax, a reorder, OpenVINO's
    # MHA) reads what the kernel before it just wrote: its floor is the cache level its own traffic fits in
    # (distilbert-m on OpenVINO: each mask Where floored at 21 µs by the call's 39 MB, where it ran in 6.5)
    rate = roof.bandwidth_at(math.fsum(k.bytes for k in kernels))
    for k in kernels:
        roof_s = max(kern.roof_times(k, roof))  # the feature, as the sweep priced its points
        own = rate if k.cls in WEIGHTED else roof.bandwidth_at(k.bytes)
        if kern.quantized_kernel(k) in priced:
            # a predicted INT8 kernel's activation quantization: swept inside its time (DynamicQuantizeMatMul, an
            # NNCF kernel's FakeQuantize); a static QDQ build's are its graph's Q and DQ nodes (`runtime_graph.quantized_kernels`)
            per.append(0.0)
            inside += 1
            continue
        key = predictors.class_key(k.cls, k.precision)
        if k.cls == "movement" and not k.bytes and not k.flops and pred.data.dispatch_s:
            per.append(pred.data.dispatch_s * k.launches)  # a view: one dispatch, as the sweep took views out
            continue
        seconds = pred.kernel_s(key, k.flops, k.bytes, roof_s, k.launches, k.nodes, dict(k.shape),
                                floor_s(k, roof, own))
        if seconds is None and k.cls == "strided" and roof.strided and roof.strided.table:
            # no sweep draws OpenVINO's generic reorder: its time is the strided loop the host's roof measured at
            # its conflicts (its roofline time), with a node's dispatch
            seconds = roof_s + pred.data.dispatch_s
        if seconds is None:
            left.add(f"{k.cls}@{k.precision}")
            seconds = cal[0].fit.kernel_s(k.cls, k.precision, roof_s, k.launches) if cal else roof_s
        elif k.precision != "fp32":
            priced.add(k.name)
        per.append(seconds)
    est.per_kernel_s = per
    executed, inputs = graph
    est.predicted_s = pred.data.baseline_s + math.fsum(per) + max(0, inputs - 1) * pred.data.input_s
    if inputs > 1 and pred.data.input_s:
        est.notes.append(f"the model's {inputs} inputs: each beyond the first adds {pred.data.input_s * 1e6:.2f} µs a run "
                         "(the runtime sets each input per call; swept apart)")
    # a kernel's activation quantization priced inside it runs inside its node too (DynamicQuantizeMatMul)
    extra = (executed or 0) - (len(kernels) - inside)
    # a view's and an extra node's dispatch: the sweep's own measure of it, or (a predictor file trained before it was
    # kept) the movement predictor asked about a kernel of no bytes, which no point has: it read a leaf of the smallest
    # points, 0.30 µs from one 30-minute sweep and 1.70 from the next (two outliers among them), and a toy ViT's 21
    # views and 30 extra nodes took it from +3 % to +143 %
    view = (pred.data.dispatch_s or pred.kernel_s("movement", 0, 0, 0.0, 1, 1)) if extra > 0 else None
    source = ("one node's dispatch as the sweep measured it" if pred.data.dispatch_s
              else "the movement predictor's time for a view")
    if view is not None:
        est.predicted_s += extra * view
        est.notes.append(f"ONNX Runtime's optimized graph runs {executed} nodes for the model's "
                         f"{len(kernels) - inside} kernels: the {extra} more are priced as one dispatch each "
                         f"({view * 1e6:.2f} µs, {source}), outside the per-class "
                         "figures")
    est.band = pred.band({predictors.class_key(k.cls, k.precision) for k in kernels})
    est.tails = cal[0].fit.tails if cal else {}
    est.predictor = (f"kernel predictors {pred.path.name}: {len(pred.data.classes)} classes from {pred.data.points} "
                     f"swept points ({pred.data.created})")
    est.calibration = est.predictor
    est.learned_gflops = pred.data.host_speed.fp32_gflops if pred.data.host_speed else None
    if inside:
        est.notes.append(f"{inside} activation quantizations priced inside their INT8 kernels' predicted times, as "
                         "the sweep timed them (ONNX Runtime's DynamicQuantizeMatMul and DynamicQuantizeLSTM quantize "
                         "their input themselves; OpenVINO fuses a FakeQuantize into the op before it)")
    est.unpredicted = sorted(left)
    if left:
        est.notes.append(f"no predictor for {', '.join(est.unpredicted)}: " + (
            "priced by the calibration's fit" if cal else "priced at the roofline (a bound)"))
    if not cal:
        est.notes.append("p90 and p99 are not predicted: the sweep times single kernels, not a model's tail")
    return est


def _for_plan(pred: predictors.Predictor | None, plan: dict | None) -> predictors.Predictor | None:
    """The predictor for a build of this plan: its INT8 classes are each the kernel one method makes on its target
    (ONNX Runtime: a dynamic plan's DynamicQuantizeMatMul and DynamicQuantizeLSTM, a static plan's QLinearConv;
    OpenVINO: NNCF's convs and MatMuls; `predictor.QUANTIZED_BY`; a static plan's QGemm from `matmul@int8~static`),
    so a kernel a plan quantized as no swept one was is priced by the calibration or its roofline."""
    if pred is None or not plan:
        return pred
    return pred.for_method(plan.get("method"))


def floor_s(kernel: kern.Kernel, roof: roofline.Roof, rate: float | None) -> float:
    """The kernel's roofline time with its bytes moved at `rate` (the cache level its model's traffic fits in, or
    past the caches one thread's read stream, where measured: slower than a copy, which the roof's bandwidth is)
    in place of the roof's DRAM bandwidth."""
    compute, memory = kern.roof_times(kernel, roof)
    if rate and roof.bandwidth and rate != roof.bandwidth:
        memory -= kernel.bytes / roof.bandwidth - kernel.bytes / rate
    return max(compute, memory)


def for_build(build: BuildDir, cal: tuple[calib.Calibration, Path] | bool | None = True, host: dict | None = None,
              device_spec=None, reported: str | None = None, target: str | None = None,
              recorded_roof: bool = True, any_predictor: bool = False) -> Estimate:
    """The estimate for a build dir's model on its profile's device, or on `device_spec`. Where neither names
    one: for a GPU target, the shipped spec matching the device that ran it (`reported`, by default the build's);
    for a CPU target, the CPU of `host` (by default the one the build ran on), at the roof the build recorded
    when no calibration applies (`recorded_roof`), so a build estimated twice gives one figure. `target`: price it
    as that target would run it (a device the build's own target cannot run on). Everything is read through the
    verified reader. `cal=True` looks the calibration up; pass one (or None) instead. `any_predictor`: use the
    target's kernel predictor even where estimates do not yet (`predictor.PRICED`), to score it."""
    report, man, directory = build.report, build.manifest, build.directory
    explicit = device_spec is not None
    device_spec = device_spec or build.device_spec
    target = target or report.target.name
    why = why_not_priced(target, device_spec)
    if why and explicit:
        raise BadInput(f"{directory}: {why}: they cannot price this build",
                       fix="add --target T to price the model as a target that runs there would (`tapeout targets` "
                           "lists them), or leave --device out for the build's own device")
    if why:
        raise BadInput(f"{directory}: {why}: the profile's device cannot price this build",
                       fix="name a device its target runs on: tapeout estimate BUILD_DIR --device NAME")
    structure = kernels_of(build)
    if structure is None:
        raise BadInput(f"{directory} holds neither structure.json nor export/model.onnx",
                       fix="point at a folder `tapeout build` wrote")
    host = host or report.host.model_dump()
    reported = reported or (report.device.reported if report.device else None)
    device_spec = spec_for_run(target, device_spec, reported)
    workload = build.workload_settings()
    if device_spec is None and off_host(target):
        raise BadInput(f"{directory}: {target} ran on {reported or 'a device the meters did not name'}, "
                       "which no shipped device spec matches, and the profile names none",
                       fix="name the device: tapeout estimate BUILD_DIR --device NAME (tapeout profiles show lists them)")
    options = (man.profile or {}).get("options")
    name = device_name(device_spec, host, options)
    pred = predictors.find(name, target, any_predictor) if cal is True and device_spec is None else None
    if cal is True:
        cal = calib.find(name, target)
    kept = _recorded_roof(report, name) if recorded_roof and not cal else None
    if pred is not None:
        kept = dataclasses.replace(pred.roof(), name=name)  # its roofline feature is only comparable at its roof
    if device_spec is None and not cal and kept is None and not host_roof.is_here(host):
        raise BadInput(f"{directory} ran on another CPU ({roofline.host_key(host)}), its report records no roof, and "
                       "no calibration for it is here", fix="estimate it on that machine, or name a device (--device)")
    if kept is not None:
        roof = kept
    else:
        cal, roof = _device_roof(device_spec, host, options, target, cal)
    plan = report.quantization.plan.model_dump(mode="json") if report.quantization else None
    pred = _for_plan(pred, plan)
    precision = report.profile.precision
    kernels = kern.at_precision(structure, plan, kern.float_precision(precision, plan))
    executed, inserted = None, []
    main = man.artifact.main_file
    found, line = None, None
    if target == report.target.name == "openvino" and device_spec is None:  # the artifact hashed where it is read
        found, line = ov_graph.kernels_for(build.artifact() / main, build.exported_model(), man.project, options,
                                           kernels)
    kernels = found or kernels
    if pred is not None and target == report.target.name and (graphs.counts_executed(target, precision, main)
                                                              or graphs.static_quantized(target, plan, main)
                                                              or graphs.dynamic_quantized(target, plan, main)):
        # the artifact is verified (every file hashed) only where its graph is read
        float_model = build.exported_model() if graphs.static_quantized(target, plan, main) else None  # hashed if read
        kernels, executed, inserted = graphs.runtime_graph(target, precision, plan, build.artifact() / main,
                                                           float_model, kernels, man.project.dims)
    est = estimate(kernels, roof, target, precision, cal or None, pred, executed, _inputs(man.project))
    _note_inserted(est, inserted)
    if line:
        est.notes.append(line)
    if target != report.target.name:
        est.notes.append(f"priced as {target} would run the model (the build is for {report.target.name})")
    phases = phases_of(build, structure)
    if phases and workload is not None and workload.kind == "generate":
        est.generation = generation.price(phases, roof, target, precision, plan, cal or None, workload,
                                          (pred, executed) if pred else None)
    return est


def _inputs(project) -> int:
    """The model's inputs, as its project declares them (1 where it declares none: an ONNX file's own)."""
    return max(1, len(getattr(project, "inputs", None) or ()))


def _note_inserted(est: Estimate, inserted: list[kern.Kernel]) -> None:
    quantize = sum(k.cls == "quantize" for k in inserted)
    if quantize:
        est.notes.append(f"ONNX Runtime's graph of this static QDQ model runs {quantize} QuantizeLinear/DequantizeLinear "
                         f"and {len(inserted) - quantize} Transposes and layout reorders around its quantized kernels: "
                         "each priced as a kernel, in place of one activation quantization per quantized kernel")
    elif inserted:
        est.notes.append(f"ONNX Runtime inserts {len(inserted)} layout reorder(s) around its blocked (NCHWc) convs on "
                         "this host: priced as movement kernels")


def _recorded_roof(report, device: str) -> roofline.Roof | None:
    """The host roof the build's own estimate priced at, where it was for `device` (this CPU, this thread count)."""
    recorded = report.estimate.roof if report.estimate is not None else None
    if recorded is None or recorded.name != device or recorded.kind != "cpu" or not recorded.name.startswith("host-"):
        return None
    return roofline.Roof.from_json(recorded.model_dump(), note="the roof this build recorded when it was built")


def for_model(setup, structure: list[kern.Kernel], plan: dict | None, reported: str | None = None,
              phases: list[generation.Phase] | None = None, workload: Any = None,
              artifact: Path | None = None, float_model: Path | None = None) -> Estimate | None:
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
    pred = _for_plan(predictors.find(roof.name, setup.target.name) if device is None else None, plan)
    if pred is not None:
        roof = dataclasses.replace(pred.roof(), name=roof.name)
    precision = setup.profile.precision
    kernels = kern.at_precision(structure, plan, kern.float_precision(precision, plan))
    executed, inserted = None, []
    found, line = None, None
    if setup.target.name == "openvino" and device is None and artifact is not None and float_model is not None:
        found, line = ov_graph.kernels_for(artifact, float_model, setup.project, setup.target.options, kernels)
    kernels = found or kernels
    if pred is not None:
        kernels, executed, inserted = graphs.runtime_graph(setup.target.name, precision, plan, artifact, float_model,
                                                           kernels, setup.project.dims)
    est = estimate(kernels, roof, setup.target.name, precision, cal, pred, executed, _inputs(getattr(setup, "project", None)))
    _note_inserted(est, inserted)
    if line:
        est.notes.append(line)
    if phases and workload is not None and workload.kind == "generate":
        est.generation = generation.price(phases, roof, setup.target.name, precision, plan, cal, workload,
                                          (pred, executed) if pred else None)
    return est


def with_measured(est: Estimate, measured_p50_ms: float | None, measured_generation: dict | None = None,
                  host_state: dict | None = None) -> dict[str, Any]:
    """The estimate's JSON, with the measured p50 and the prediction's error where this run measured it (and the
    generation loop's, for a generate workload), and beside them, where the predictors' sweep and the measurement
    each probed the host (`host_state`), the estimate at the measurement's host speed (host_drift.py)."""
    data = est.to_json()
    predicted = est.quantile_ms("p50")
    data["measured_p50_ms"] = measured_p50_ms
    data["error"] = predicted[0] / measured_p50_ms - 1 if predicted and measured_p50_ms else None
    if predicted and (at := host_drift.at_measured_speed(predicted[0], est.learned_gflops, host_state, measured_p50_ms)):
        data["at_measured_speed"] = at
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
            results.append(BudgetResult(name, limit, "ms", Verdict.ESTIMATED_FAIL, bound, None,
                                        f"{why_not_measured}; even the roofline lower bound on {est.device} is "
                                        f"{bound:.4g} ms > limit"))
            continue
        value = est.quantile_ms(key)
        if value is None and est.predictor:
            results.append(BudgetResult(name, limit, "ms", Verdict.UNMEASURED, None, None,
                                        f"{why_not_measured}; the roofline lower bound on {est.device} is {bound:.4g} ms"
                                        f" (under the limit); the kernel predictors predict the p50 only, and no "
                                        f"calibration for {est.device} × {est.target} gives its tail"))
            continue
        if value is None:
            results.append(BudgetResult(name, limit, "ms", Verdict.UNMEASURED, None, None,
                                        f"{why_not_measured}; the roofline lower bound on {est.device} is {bound:.4g} ms"
                                        f" (under the limit) and there is no calibration for {est.device} × "
                                        f"{est.target} to estimate more: `tapeout calibrate` with builds checked there"))
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
        results.append(BudgetResult(name, limit, "ms", verdict, point, (low, high) if est.band else None,
                                    f"{why_not_measured}; estimated {key} {point:.4g} ms on {est.device}"
                                    f"{' by its kernel predictors' if est.predictor else ''}, {how}; "
                                    "`tapeout check` on the device measures it"))
    return results


# ---------------------------------------------------------------- records for calibration


def profiled_classes(profile: dict, kernels: list[kern.Kernel], scale: float = 1.0) -> dict[str, float]:
    """Seconds per inference the profiler spent per kernel class (times `scale`): each profiled layer in the class of
    the kernel the runtime's compiled graph says it ran (`Kernel.runs_as`: OpenVINO's MHA "Subgraph" is attention
    where its type alone says elementwise), else by its type and the implementation that ran it."""
    ran = {k.runs_as: k.cls for k in kernels if k.runs_as}
    out: dict[str, float] = {}
    for row in (profile.get("ops") if ran and profile.get("ops") else profile["op_types"]):
        cls = ran.get(row.get("node", "")) or kern.op_class(row["op_type"], row.get("provider") or "")
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
    est = for_build(build, cal=None, host=measured.host.model_dump(), recorded_roof=False,  # the calibration's roof
                    reported=measured.device.reported if measured.device else None)  # a GPU: the one that ran
    measured_s = profiled_classes(profile, est.kernels, bottleneck.profiler_scale(profile, p50))
    record = calib.Record(model=report.project.name, precision=report.profile.precision, source=str(directory),
                          created=measured.created, p50_s=p50 / 1e3, tails=tails,
                          roof_s=kern.class_roofs(est.kernels, est.roof), measured_s=measured_s,
                          kernels=len(est.kernels), counts=kern.class_counts(est.kernels))
    return record, {"device": est.device, "target": measured.target.name,
                    "kind": est.roof.kind, "roof": est.roof.to_json(),
                    "host_key": roofline.host_key(measured.host.model_dump())}
