"""`tapeout calibrate --sweep DEVICE [--minutes N] [--threads N] [--target T]`: sample each kernel class's
configurations, measure them on the device in fresh processes until the time budget is spent (resuming a sweep
stopped before), then train the kernel predictors from every point measured so far (docs/estimator.md, "Sweeps")."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tapeout.commands.output import print_json
from tapeout.core.console import UI
from tapeout.core.errors import BadInput, TargetUnavailable, first_line

TARGET = "onnxruntime"
# configurations per timing process: a process's start and its baselines cost ~0.4 s, which 12 a chunk made a third
# of a sweep's time
CHUNK = 24
MIN_S = 0.08          # of runs per configuration (at least 5)
# ONNX Runtime's NCHWc layout reorders (a lone FP32 Conv pays two, a CNN one), and around a lone static INT8 conv or
# Gemm the activation's QuantizeLinear and DequantizeLinear and the Transposes into and out of its NHWC QLinearConv
# (a CNN's graph runs those where it leaves INT8: the estimate counts them from the graph ONNX Runtime optimizes)
INSERTED = ("ReorderInput", "ReorderOutput", "QuantizeLinear", "DequantizeLinear", "Transpose")


@dataclass(frozen=True)
class SweptTarget:
    """What a sweep on one target takes out of a point's time: the op types of the nodes the runtime inserts around
    a lone kernel (layout reorders, which a model pays once, not per kernel), and which ops' points a profiled pass
    looks for them in (None: every point's)."""

    profile: str  # the shipped FP32 CPU profile whose options its kernels are timed with (but its threads)
    per_input: bool  # whether a run's inputs beyond the first are timed apart (TWO_INPUTS) and taken out of a point
    inserted: tuple[str, ...]
    profiled: tuple[str, ...] | None
    not_run: tuple[str, ...] = ()  # kernel classes the sweep draws that its builds do not run as drawn

    def options(self, threads: int) -> dict:
        """The target's options as its builds run: the profile's, at the sweep's thread count. OpenVINO's profile
        pins f32: left to itself its CPU plugin runs FP32 models in bf16 on a CPU with AVX512-BF16, as this host."""
        from tapeout.core.config import find_profile, resolve_extends

        return {**resolve_extends(find_profile(self.profile)).get("options", {}), "threads": threads}


# OpenVINO's CPU plugin puts a Reorder into and out of its blocked layouts around a lone conv (22 of a 98 µs 3×3
# conv here) and, smaller, around a FullyConnected; a model reorders once at its edges. Its INT8 is NNCF's
# (FakeQuantize), so it sweeps no QuantizeLinear.
# ONNX Runtime takes a numpy input as it is (~0.3 µs a second input here: its points keep it, as definition 2 did)
# A lone MaxPool whose channels ONNX Runtime blocks runs NCHWc between a ReorderInput and a ReorderOutput, as a lone
# conv does; in a CNN it follows a blocked conv and pays none (cnn-lstm-m's two FP32 pools: ~7 µs profiled, priced
# at 26 µs with them in)
TARGETS = {"onnxruntime": SweptTarget("cpu-fp32", False, INSERTED, ("Conv", "Gemm", "MaxPool"), ("attention",)),
           "openvino": SweptTarget("openvino-cpu", True, ("Reorder",), None, ("quantize",))}
HERE = ("host", "host-cpu")


def sweep(device: str, minutes: float, threads: int, out: Path | None, as_json: bool,
          classes: str | None = None, target: str = TARGET) -> int:
    from tapeout import __version__
    from tapeout.core.host import host_fingerprint, now
    from tapeout.core.host_speed import host_state
    from tapeout.estimation import estimate, fit, host_drift, predictor, roofline, sweep_draws, sweep_pricing
    from tapeout.estimation import sweep as sweeping

    if device not in HERE:
        raise TargetUnavailable(f"a sweep runs on the device it measures, and {device!r} is not this machine",
                                fix="run `tapeout calibrate --sweep host` on the device (or a farm worker holding it); "
                                    "here, this host's CPU is `host`")
    if not 0 <= minutes <= 24 * 60:
        raise BadInput(f"--minutes {minutes} is out of range", fix="give the sweep's time budget in minutes, e.g. 30 "
                       "(0: measure nothing, train again from the points measured before)")
    if threads < 0:
        raise BadInput(f"--threads {threads} is negative", fix="give the inference threads (0: one per core)")
    if target not in TARGETS:
        raise BadInput(f"a sweep cannot time kernels on target {target!r}",
                       fix=f"sweep one of: {', '.join(TARGETS)} (--target)")
    swept = TARGETS[target]
    offered = tuple(c for c in sweeping.CLASSES if c not in swept.not_run)
    chosen = tuple(c.strip() for c in (classes or ",".join(offered)).split(",") if c.strip())
    unknown = [c for c in chosen if c not in offered]
    if unknown or not chosen:
        raise BadInput(f"unknown kernel class {unknown[0] if unknown else '(none)'!r} for --classes"
                       + (f" on {target}" if target != TARGET else ""),
                       fix=f"use some of: {', '.join(offered)} (comma-separated)")
    from tapeout import targets

    targets.target_class(target).probe().require(target)  # a runtime not installed is one line, not a chunk's failure
    ui = UI()
    host = host_fingerprint()
    options = swept.options(threads)
    name = estimate.device_name(None, host, options)
    folder = out or fit.user_folder()
    path = sweeping.path_for(name, target, folder)
    found = sweeping.load(path)
    if found is not None and found.host != roofline.host_key(host):
        raise BadInput(f"the sweep file {path} was measured on another CPU ({found.host})",
                       fix="move it away and sweep again on this machine")
    if found is not None and found.target != target:
        raise BadInput(f"the sweep file {path} was measured on {found.target}, not {target}",
                       fix="move it away and sweep again")
    definition = sweeping.definition_for(target)
    if found is not None and found.definition != definition:
        raise BadInput(f"the sweep file {path} takes a kernel's time by another definition ({found.definition}; this "
                       f"tapeout's on {target} is {definition}: see DEFINITION in estimation/sweep.py), and its points "
                       "cannot be mixed with new ones", fix="move it away and sweep again")
    if found is None and minutes == 0:
        raise BadInput(f"--minutes 0 trains from a sweep measured before, and there is none at {path}",
                       fix="give the sweep a time budget, e.g. --minutes 30")
    if found is None:
        roof = estimate.roof_for(None, host, None, estimate.host_threads(host, options))
        found = sweeping.SweepFile(schema=sweeping.SCHEMA, definition=definition, pricing=sweep_pricing.PRICING,
                                   device=name, target=target, host=roofline.host_key(host),
                                   threads=threads, roof=roof.to_json())
    try:
        roof = roofline.Roof.from_json(found.roof, name)
    except (KeyError, TypeError, ValueError) as exc:  # a pydantic ValidationError is a ValueError
        raise BadInput(f"the sweep file {path}: its roof is malformed ({first_line(exc, 200)})",
                       fix="move it away and sweep again") from None
    if found.pricing != sweep_pricing.PRICING:
        # a predictor reads roof_s as a feature: priced one way in the file and another in an estimate, it would mislead
        ui.note(f"pricing the {len(found.points)} points measured before again: an earlier tapeout priced their "
                f"roofline times otherwise (~{len(found.points) / 100:.0f} s, once)")
        found, moved = sweep_pricing.repriced(found, roof)
        sweeping.save(found, path)
        ui.note(f"  {moved} points' roofline times moved")
    ov_config = _ov_config(options) if target == "openvino" else None  # its MHA: one kernel as the plugin runs it
    done = {p.key for p in found.points}
    rng = random.Random(len(found.points))  # a resumed sweep draws new configurations, not the same ones again
    cycle = itertools.cycle(chosen)
    deadline = time.monotonic() + minutes * 60
    if minutes:
        ui.note(f"sweeping {name} × {target} for {minutes:g} min ({len(found.points)} points measured before) → {path}")
    else:
        ui.note(f"training from the {len(found.points)} points measured before ({path}); measuring nothing")
    with tempfile.TemporaryDirectory(prefix="tapeout-sweep-") as scratch:
        chunk_no = 0
        while minutes and time.monotonic() < deadline - 2:
            chunk_no += 1
            chunk, started = [], time.monotonic()
            while len(chunk) < CHUNK:
                config = sweep_draws.sample(next(cycle), rng)
                if config.key in done or (sweeping.precision_of(config) != "fp32" and
                                           sweeping.quantization_of(config, target) is None):
                    continue  # an INT8 kernel this target's INT8 builds do not run (OpenVINO: no INT8 LSTM)
                done.add(config.key)
                proto, inputs = sweeping.model(config, len(done))
                feats = sweeping.features_of(proto, inputs, roof, sweeping.precision_of(config), ov_config)
                if feats is None or feats["cls"] != config.cls:
                    continue  # not one kernel of its class to the estimator: it would teach the wrong class
                chunk.append((config, sweeping.timed_model(config, proto, inputs, target), inputs, feats))
            got = _time_chunk(Path(scratch) / f"c{chunk_no}", chunk, options, deadline, target)
            if isinstance(got, str):
                ui.note(f"  a chunk's timings are not used ({got}); its {len(chunk)} configurations are skipped")
                continue
            baseline, dispatch, per_input, results = got
            found.host_speed.append(host_state(3))
            for config, _, inputs, feats in chunk:
                r = results.get(config.key)
                if r is None or "error" in r or (target in sweeping.PROFILED and "profiled" not in r):
                    continue
                if "profiled" in r:  # its nodes as profiled and one dispatch (definition 5)
                    kernel_s = r["profiled"] + dispatch
                else:  # the run less the run's cost without a node, what was inserted, its views and 2nd inputs
                    kernel_s = (r["p50"] - (baseline - dispatch) - sum(r["inserted"].values())
                                - feats["views"] * dispatch - (len(inputs) - 1) * per_input)
                found.points.append(sweeping.Point(
                    key=config.key, cls=config.cls, op=config.op, precision=feats["precision"],
                    quantization=sweeping.quantization_of(config, target),
                    config=dict(config.sizes), flops=feats["flops"],
                    bytes=feats["bytes"], nodes=feats["nodes"], launches=feats["launches"], roof_s=feats["roof_s"],
                    shape=feats["shape"], kernel_s=kernel_s, run_s=r["p50"],
                    baseline_s=baseline, dispatch_s=dispatch, inserted_s=r["inserted"], views=feats["views"],
                    inputs=len(inputs), input_s=per_input, profiled_s=r.get("profiled"),
                    spread=(r["p90"] - r["p10"]) / r["p50"], runs=r["runs"]))
            found.seconds += time.monotonic() - started
            sweeping.save(found, path)
            ui.note(f"  {len(found.points)} points ({', '.join(f'{c} {n}' for c, n in _counts(found).items())}); "
                    f"{max(0.0, deadline - time.monotonic()) / 60:.1f} min left")
    trained = _train(found, roof, target)
    if not trained:
        raise BadInput(f"the sweep has too few points per class to train a predictor ({_counts(found)})",
                       fix=f"sweep longer (each class needs {predictor.MIN_POINTS}); the points are kept and resumed")
    # the run's cost without a node: what an estimate adds once to the sum of its kernels (each has its dispatch)
    baseline = sorted(p.baseline_s - p.dispatch_s for p in found.points)[len(found.points) // 2]
    per_input = sorted(p.input_s for p in found.points)[len(found.points) // 2]  # what a model's 2nd input adds
    dispatch = sorted(p.dispatch_s for p in found.points)[len(found.points) // 2]  # what a view costs a run
    data = predictor.PredictorFile(schema=predictor.SCHEMA, device=name, target=target, host=found.host,
                                   threads=threads, created=now(), baseline_s=baseline, input_s=per_input,
                                   dispatch_s=dispatch, roof=found.roof, points=len(found.points), classes=trained,
                                   host_speed=host_drift.summary(found.host_speed))
    saved = predictor.save(data, folder)
    rows = [{"class": c, "points": m.points, "band": list(m.band), "held_out_within_15": m.held_out_within_15}
            for c, m in trained.items()]
    if target not in predictor.PRICED:
        ui.note(f"estimates do not price {target} builds by this predictor yet: it over-predicts small models (their "
                "sub-µs kernels read to the counters' whole µs, a lone model's run cost; docs/estimator.md); "
                "`python bench/estimator.py --predictors FOLDER --all-targets` scores it")
    if as_json:
        print_json({"device": name, "target": target, "predictor": str(saved), "sweep": str(path),
                    "points": len(found.points), "seconds": found.seconds, "classes": rows, "version": __version__})
        return 0
    for r in rows:
        ui.out.print(f"{r['class']}: {r['points']} points, held out within ±15 %: {r['held_out_within_15']:.0%}, "
                     f"band [{r['band'][0]:+.0%}, {r['band'][1]:+.0%}]", markup=False)
    ui.out.print(f"predictor for {name} × {target} → {saved}", markup=False)
    return 0


def _ov_config(options: dict) -> dict:
    """OpenVINO's compile configuration for the sweep's options, as its builds compile with it."""
    from tapeout.targets import ov as ov_target

    return ov_target.compile_config(ov_target.Options(**options))


def _train(found, roof, target: str) -> dict:
    """The predictors of every class, a point's kernel trained on its time less what ONNX Runtime ran around it as
    the `quantize` and movement predictors price it (`wrappers`): the Q, DQ and Transposes around a static INT8
    kernel (a QLinearConv, a QGemm), the layout reorders around a blocked FP32 conv or MaxPool. The profiler records
    each such node at 1-2 µs where a small one runs in ~0.3 (whole µs and its own cost), and taken out as profiled
    they left a small kernel's time at nothing or below (a toy ResNet's QLinearConvs predicted at 0.06-0.33 µs, its
    FP32 convs 20 % under its measured run)."""
    from tapeout.estimation import cost_units as kern
    from tapeout.estimation import kernel_shape, predictor, wrappers
    from tapeout.estimation import sweep as sweeping

    points = [{**p.model_dump(), "shape": sweeping.point_shape(p.model_dump())} for p in found.points]
    dispatch = sorted(p["dispatch_s"] for p in points)[len(points) // 2]  # each class learns its time over roof + it
    first = predictor.train(points, roof=roof, target=target, dispatch_s=dispatch)
    around_each = [wrappers.wrapper_kernels(p, target) for p in points]
    # a point whose wrappers' classes have no predictor (a sweep of some classes only) keeps its time as profiled
    around_each = [w if {cls for cls, *_ in w} <= set(first) else [] for w in around_each]
    if not any(around_each):
        return first
    pred = predictor.Predictor(predictor.PredictorFile(
        schema=predictor.SCHEMA, device=found.device, target=target, host=found.host, threads=found.threads,
        created="", baseline_s=0.0, roof=found.roof, points=len(points), classes=first), Path("training"))
    for p, around_kernel in zip(points, around_each, strict=True):
        if not around_kernel:
            continue
        around = 0.0
        for cls, flops, bytes_, op in around_kernel:
            k = kern.Kernel("wrapper", cls, "fp32", int(flops), bytes_, 1)
            around += pred.kernel_s(cls, flops, bytes_, max(kern.roof_times(k, roof)), 1, 1,
                                    dict(kernel_shape.inserted_shape(cls, op)),
                                    floor_s=predictor.cache_floor_s(flops, bytes_, roof)) or 0.0
        profiled = sum(v for op, v in p["inserted_s"].items() if op in wrappers.OPS)
        p["kernel_s"] += profiled - around
    return predictor.train(points, roof=roof, target=target, dispatch_s=dispatch)


def _counts(found) -> dict[str, int]:
    from tapeout.estimation import predictor

    counts: dict[str, int] = {}
    for p in found.points:
        key = predictor.class_key(p.cls, p.precision, p.quantization, found.target)
        counts[key] = counts.get(key, 0) + 1
    return counts


def _time_chunk(folder: Path, chunk: list, options: dict, deadline: float,
                target: str = TARGET) -> tuple[float, float, float, dict] | str:
    """The chunk's configurations timed in one fresh process between the baselines, timed before and after them
    (the Identity model where kernels are not profiled, the short and the long dispatch chain, and where the target sets its inputs per call a
    two-input Add): (the run's cost without a node, one node's dispatch, a second input's cost or 0, results by key);
    or why not, where the process failed or ran past the budget. Where the target's kernels are timed by its profiler
    (`sweeping.PROFILED`), every model is profiled too, and the baselines' costs are their runs beyond their nodes'
    profiled time: the one-node chain's is the run's cost (`Point.baseline_s`)."""
    from tapeout.estimation import sweep as sweeping

    folder.mkdir(parents=True)
    swept, chain_op = TARGETS[target], sweeping.PROFILED.get(target)
    # a profiled target's run cost is its one-node chain's (Identity's is not used there: not timed)
    kinds = (*(() if chain_op else (sweeping.IDENTITY,)), *sweeping.chain(chain_op or "Neg"),
             *((sweeping.TWO_INPUTS,) if swept.per_input else ()))
    baselines = [(f"base-{c.op}-{dict(c.sizes).get('nodes', 1)}", c) for c in kinds]
    models = []
    order = [*baselines, *((c.key, c) for c, _, _, _ in chunk), *reversed(baselines)]
    protos = {c.key: (p, ins) for c, p, ins, _ in chunk}
    for i, (key, config) in enumerate(order):
        proto, inputs = protos.get(key) or sweeping.model(config)
        path = sweeping.save_model(proto, folder / f"m{i}")
        models.append({"key": key if key in protos else f"{key}#{i}", "path": str(path), "inputs": inputs,
                       "dtypes": {n: sweeping.INPUT_DTYPES[n] for n, _ in inputs if n in sweeping.INPUT_DTYPES},
                       "profile": bool(chain_op) or (key in protos and (swept.profiled is None
                                                                        or config.op in swept.profiled)),
                       **({"vocab": config["vocab"]} if config.op == "Gather" else {}),
                       **({"masked": config["masked"]} if "masked" in dict(config.sizes) else {})})
    request, result = folder / "request.json", folder / "result.json"
    request.write_text(json.dumps({"target": target, "options": options, "min_s": MIN_S, "models": models,
                                   "inserted": swept.inserted, "profile_runs": 20 if chain_op else 10,
                                   "layer_times": bool(chain_op)}))
    try:
        done = subprocess.run([sys.executable, "-m", "tapeout.measurement.kernel_timer", str(request), str(result)],
                              capture_output=True, text=True, timeout=max(10.0, deadline - time.monotonic() + 30))
    except subprocess.TimeoutExpired:
        return "it ran past the sweep's time budget"
    if done.returncode != 0 or not result.is_file():
        return f"exit {done.returncode}: {(done.stderr.strip().splitlines() or ['no message'])[-1][:200]}"
    rows = {r["key"]: r for r in json.loads(result.read_text())}

    def mean_p50(name: str) -> float | None:
        """The baseline's mean p50 over its two runs; where kernels are profiled, its run beyond its nodes' time."""
        got = [r["p50"] - r.get("profiled", 0.0) for k, r in rows.items() if k.startswith(name + "#") and "p50" in r
               and (not chain_op or "profiled" in r)]
        return sum(got) / len(got) if got else None

    got = [mean_p50(key) for key, _ in baselines]
    if None in got:
        return (f"the runtime could not run the {'' if chain_op else 'Identity, '}{chain_op or 'Neg'} and Add models "
                "the kernels' times are measured against")
    costs = sweeping.run_costs(got, chain_op)
    return costs if isinstance(costs, str) else (*costs, rows)
