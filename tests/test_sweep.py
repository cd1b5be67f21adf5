"""Sweeps and kernel predictors (issue 34): a sweep bounded to seconds measures toy kernels in fresh processes
and trains a predictor file, resumes where it stopped, and the estimate uses the predictor only for the device
and target it was swept on, with its band carried into estimated verdicts. Real ONNX Runtime, real timings."""

from __future__ import annotations

import json
import shutil
import statistics
from collections import Counter
from pathlib import Path

import pytest

from conftest import FAST_PROFILE, SAMPLES, one_line_error, run_cli
from tapeout.core.errors import BadInput
from tapeout.core.schemas import Budgets
from tapeout.core.verdict import Verdict
from tapeout.estimation import build_structure, estimate, predictor, runtime_graph, sweep_draws


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep")
    first = run_cli("calibrate", "--sweep", "host", "--minutes", "0.4", "--classes", "matmul,elementwise",
                    "--out", folder, "--json")
    assert first.code == 0, first.err
    return folder, first.json()


def test_a_sweep_bounded_to_seconds_trains_a_predictor_per_class_and_resumes(swept):
    folder, first = swept
    points = json.loads((folder / "sweeps" / f"{first['device']}--onnxruntime.json").read_text())["points"]
    keys = Counter(predictor.class_key(p["cls"], p["precision"], p["quantization"]) for p in points)
    # a predictor per class and precision with enough points: an INT8 MatMul is its own (`matmul@int8`), and a static
    # one (a QGemm) its own again
    assert {c["class"] for c in first["classes"]} == {k for k, n in keys.items() if n >= predictor.MIN_POINTS}
    assert {"matmul", "elementwise"} <= set(keys) <= {"matmul", "matmul@int8", "matmul@int8~static", "elementwise"}
    assert first["seconds"] < 40 and all(c["points"] >= predictor.MIN_POINTS for c in first["classes"])
    data = json.loads((folder / predictor.file_name(first["device"], "onnxruntime")).read_text())
    assert data["schema"] == predictor.SCHEMA and data["device"] == first["device"] and data["baseline_s"] > 0
    # a view's price: the dispatch the points' views were taken out at, their median
    dispatches = sorted(p["dispatch_s"] for p in json.loads(
        (folder / "sweeps" / f"{first['device']}--onnxruntime.json").read_text())["points"])
    assert data["dispatch_s"] == dispatches[len(dispatches) // 2] > 0
    sweep = json.loads((folder / "sweeps" / f"{first['device']}--onnxruntime.json").read_text())
    points = sweep["points"]
    assert len(points) == first["points"] and {p["cls"] for p in points} == {"matmul", "elementwise"}
    assert all(p["roof_s"] > 0 and p["runs"] >= 5 and p["run_s"] > 0 for p in points)
    # each kernel keeps its own dispatch: its time is the run's less the run's cost without any node
    assert all(p["dispatch_s"] > 0 for p in points)
    assert all(p["input_s"] == 0 for p in points)  # ONNX Runtime's points keep a second input's ~0.3 µs (definition 2)
    # (less a view's dispatch where the model needed one beside its kernel: a GELU ONNX Runtime fuses)
    # (and the Q and DQ around a static INT8 Gemm, as profiled: the trainer prices them again, below)
    assert all(p["kernel_s"] == pytest.approx(p["run_s"] - (p["baseline_s"] - p["dispatch_s"]) -
                                              p["views"] * p["dispatch_s"] - sum(p["inserted_s"].values()))
               for p in points)
    assert all(p["views"] == (1 if p["op"] == "GeluTanh" else 0) for p in points)
    assert data["baseline_s"] < sorted(p["baseline_s"] for p in points)[len(points) // 2]
    assert sweep["host_speed"] and "bandwidth_gbs" in sweep["host_speed"][0]
    # the host's speed the points were measured at, for an estimate at a measurement's own speed (host_drift.py)
    rates = sorted(h["fp32_gflops"] for h in sweep["host_speed"])
    assert data["host_speed"]["probes"] == len(rates)
    assert data["host_speed"]["fp32_gflops"] == pytest.approx(statistics.median(rates))
    # the same configuration is never measured twice, and a second run goes on from the first
    assert len({p["key"] for p in points}) == len(points)
    again = run_cli("calibrate", "--sweep", "host", "--minutes", "0.1", "--classes", "matmul", "--out", folder, "--json")
    assert again.code == 0, again.err
    assert again.json()["points"] > first["points"]
    kept = json.loads((folder / "sweeps" / f"{first['device']}--onnxruntime.json").read_text())["points"]
    assert kept[: len(points)] == points


def test_the_estimate_uses_the_predictor_and_its_band_reaches_the_verdicts(swept, digits_build, monkeypatch):
    folder, first = swept
    got = run_cli("estimate", digits_build, "--json", env={"TAPEOUT_CALIBRATION": str(folder)})
    assert got.code == 0, got.err
    est = got.json()
    assert est["device"] == first["device"] and est["method"] == estimate.METHOD_PREDICTED
    p50 = est["predicted_ms"]["p50"]
    assert p50["low"] <= p50["point"] <= p50["high"]
    assert "p90" not in est["predicted_ms"]   # single kernels give no tail: not claimed
    # the digits model's conv and reduce kernels have no predictor in this sweep: said, and priced at the bound
    assert any("no predictor for conv@fp32" in n for n in est["notes"])
    # estimated verdicts carry the predictor's band
    from tapeout.builds.reader import open_build

    monkeypatch.setenv("TAPEOUT_CALIBRATION", str(folder))
    made = estimate.for_build(open_build(digits_build))
    assert made.predictor and made.band
    # never under its floor: each kernel's roofline time, its bytes at the cache level the call's traffic fits in
    rate = made.roof.bandwidth_at(sum(k.bytes for k in made.kernels))
    assert made.predicted_s >= sum(estimate.floor_s(k, made.roof, rate) for k in made.kernels) * (1 - 1e-9)
    assert made.predicted_s * 1e3 == pytest.approx(p50["point"])
    _, low, high = made.quantile_ms("p50")
    [p50_verdict, p90_verdict] = estimate.judge(Budgets(latency_p50_ms=high * 2, latency_p90_ms=high * 2), made,
                                                "not measured here")
    assert p50_verdict.verdict == Verdict.ESTIMATED_PASS and p50_verdict.bound == (low, high)
    assert "by its kernel predictors" in p50_verdict.reason and f"band [{low:.4g}, {high:.4g}]" in p50_verdict.reason
    assert p90_verdict.verdict == Verdict.UNMEASURED and "predict the p50 only" in p90_verdict.reason


def test_a_check_on_a_host_with_a_predictor_estimates_at_the_builds_recorded_dims(swept, digits_build, tmp_path):
    """`tapeout check` has no project, only the build dir: the predictors read ONNX Runtime's graph at the dims the
    manifest recorded (a check on a host holding a predictor file crashed with an internal error, exit 70)."""
    import shutil

    folder, first = swept
    build = shutil.copytree(digits_build, tmp_path / "digits")  # the check writes beside the shared build
    done = run_cli("check", build, "--json", env={"TAPEOUT_CALIBRATION": str(folder)})
    assert done.code == 0, done.err
    checked = json.loads((build / "check.json").read_text())
    est = checked["estimate"]
    assert est["method"] == estimate.METHOD_PREDICTED and est["device"] == first["device"]
    # beside the plain error, the estimate at the speed the check's own probe read: times the sweep's FP32 rate over it
    learned = json.loads((folder / predictor.file_name(first["device"], "onnxruntime")).read_text())["host_speed"]
    measured = checked["measurement"]["host_state"]["fp32_gflops"]
    at = est["at_measured_speed"]
    assert est["learned_fp32_gflops"] == at["learned_fp32_gflops"] == learned["fp32_gflops"]
    assert at["p50_ms"] == pytest.approx(est["predicted_ms"]["p50"]["point"] * learned["fp32_gflops"] / measured)
    assert at["error"] == pytest.approx(at["p50_ms"] / est["measured_p50_ms"] - 1)
    assert "At the host speed this measurement ran at" in (build / "check.md").read_text()


def test_the_dispatch_chain_survives_onnx_runtimes_optimizer(tmp_path):
    """The per-node dispatch is measured on Neg chains because ONNX Runtime removes Identity nodes: the long chain
    must still run nine kernels after the optimizer, or the difference would measure nothing."""
    import onnx
    import onnxruntime as ort

    from tapeout.estimation import sweep

    for config, want in zip(sweep.NEGS, sweep.NEG_CHAIN, strict=True):
        proto, _ = sweep.model(config)
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / f"neg{want}.onnx")
        ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
        kept = onnx.load(options.optimized_model_filepath).graph.node
        assert [n.op_type for n in kept] == ["Neg"] * want
    assert sweep.dispatch_s(10e-6, 18e-6) == pytest.approx(1e-6) and sweep.dispatch_s(10e-6, 9e-6) == 0.0


def test_a_chunk_whose_long_chain_ran_no_slower_than_its_short_one_is_not_used():
    """A chunk's baselines give its run cost, its dispatch and a second input's cost; both targets run their chains
    node by node, so a nine-node chain no slower than the one-node chain measured a busy host (seen in CI, two test
    workers on two cores): the chunk says why and is skipped, where a dispatch of 0 would be kept in every point.
    So is a chunk whose inputs are timed apart (OpenVINO) and whose second input read no cost."""
    from tapeout.estimation import sweep

    # ONNX Runtime: Identity, the one- and nine-Neg chains; OpenVINO: its Softmax chains and the two-input Add
    assert sweep.run_costs([5e-6, 6e-6, 14e-6]) == pytest.approx((5e-6, 1e-6, 0.0))
    assert sweep.run_costs([5e-6, 6e-6, 14e-6, 7.5e-6]) == pytest.approx((5e-6, 1e-6, 0.5e-6))
    assert sweep.run_costs([6e-6, 14e-6, 11e-6], "Softmax") == pytest.approx((6e-6, 1e-6, 5e-6))
    for p50s, chain_op in (([5e-6, 6e-6, 6e-6], None), ([5e-6, 6.4e-6, 6.1e-6, 7e-6], None),
                           ([6e-6, 5.9e-6], "Softmax")):
        why = sweep.run_costs(p50s, chain_op)
        assert isinstance(why, str) and f"9-node {chain_op or 'Neg'} chain ran no slower than its 1-node one" in why
        assert "the host was busy" in why and "\n" not in why
    # OpenVINO sets each input per call (~5 µs): a two-input Add no slower than the one-node chain is noise too
    why = sweep.run_costs([6e-6, 14e-6, 5.8e-6], "Softmax")
    assert isinstance(why, str) and "two-input Add ran no slower than its 1-node Softmax chain" in why


def test_the_timer_reports_the_layout_reorders_the_runtime_put_around_a_lone_conv(tmp_path):
    """A lone Conv on ONNX Runtime's CPU EP pays reorders into and out of its NCHWc layout (on x86 with AVX2 or
    AVX-512), which a CNN pays once: the timer's profiled pass reports their time so the sweep takes it out. What it
    reports must be what ONNX Runtime's optimized graph holds: no reorder where there is none."""
    import platform
    import subprocess
    import sys

    import onnx
    import onnxruntime as ort

    from tapeout.commands.sweep import INSERTED
    from tapeout.estimation import sweep

    config = sweep.Config("conv", "Conv", (("c", 40), ("co", 40), ("hw", 63), ("k", 7), ("stride", 1), ("groups", 40),
                                           ("relu", 0)))
    proto, inputs = sweep.model(config)
    onnx.save(proto, str(tmp_path / "conv.onnx"))
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.intra_op_num_threads = 1
    ort.InferenceSession(str(tmp_path / "conv.onnx"), options, providers=["CPUExecutionProvider"])
    planted = {n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node} & set(INSERTED)
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert planted  # every x86 host here has AVX2: ONNX Runtime's NCHWc transformer runs, so the check bites
    request = {"target": "onnxruntime", "options": {"threads": 1}, "min_s": 0.02, "inserted": INSERTED,
               "profile_runs": 5, "models": [{"key": config.key, "path": str(tmp_path / "conv.onnx"), "inputs": inputs,
                                              "profile": True}]}
    (tmp_path / "request.json").write_text(json.dumps(request))
    done = subprocess.run([sys.executable, "-m", "tapeout.measurement.kernel_timer", str(tmp_path / "request.json"),
                           str(tmp_path / "result.json")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [row] = json.loads((tmp_path / "result.json").read_text())
    assert set(row["inserted"]) == planted, (row, planted)
    assert all(0 <= s < row["p50"] for s in row["inserted"].values())


def test_the_timer_takes_every_model_in_windows_round_robin_and_pools_their_runs():
    """`kernel_timer._rounds`: each model's runs come from every window, the windows alternate over the chunk (every
    other round reversed), the first after three warm-up runs and each later one after one, at least five runs in
    all however short the time; a model whose run raises loses its point alone."""
    from tapeout.measurement import kernel_timer

    calls, order = {}, []
    for key in ("identity", "kernel", "bad"):
        def run(key=key):
            order.append(key)
            if key == "bad" and order.count("bad") > 5:  # fails in its second window (five runs in its first)
                raise RuntimeError("the runtime refused\nsecond line")
        calls[key] = run
    times, failed = kernel_timer._rounds(calls, 0.0, 4)
    windows = [k for i, k in enumerate(order) if i == 0 or order[i - 1] != k]  # a round's last model opens the next
    assert windows == ["identity", "kernel", "bad", "kernel", "identity", "kernel", "identity"]
    # round 1 forward; 2 back, "bad" failing at once; 3 forward and 4 back without it
    assert order[:5] == ["identity"] * 5                      # three warm-ups, then two timed runs (5 over 4 windows)
    assert order.count("kernel") == 3 + 2 + 3 * (1 + 2)       # later windows: one warm-up, two timed runs
    assert set(times) == {"identity", "kernel"} and len(times["kernel"]) == 8 and (times["kernel"] >= 0).all()
    assert failed == {"bad": "RuntimeError: the runtime refused"}


def test_a_predictor_is_never_read_for_another_device_or_target(swept, tmp_path):
    folder, first = swept
    source = folder / predictor.file_name(first["device"], "onnxruntime")
    assert predictor.load(source, first["device"], "onnxruntime").data.classes
    for device, target in ((first["device"] + "-1t", "onnxruntime"), (first["device"], "openvino")):
        with pytest.raises(BadInput, match="is used only for the device and target it was swept on"):
            predictor.load(source, device, target)
    # renamed as another thread count's file, it is still refused: the file says which device it is
    other = tmp_path / predictor.file_name(first["device"] + "-1t", "onnxruntime")
    shutil.copy(source, other)
    with pytest.raises(BadInput, match=r"is for host-\w+ × onnxruntime, not host-\w+-1t"):
        predictor.load(other, first["device"] + "-1t", "onnxruntime")


def test_a_malformed_predictor_file_is_one_line(swept, tmp_path):
    folder, first = swept
    data = json.loads((folder / predictor.file_name(first["device"], "onnxruntime")).read_text())
    tree = data["classes"]["matmul"]["trees"][0]
    cyclic = json.loads(json.dumps(data))
    cyclic["classes"]["matmul"]["trees"][0]["left"][0] = 0   # a walk that never ends
    wrong_feature = json.loads(json.dumps(data))
    wrong_feature["classes"]["matmul"]["trees"][0]["feature"][0] = 99
    short = json.loads(json.dumps(data))
    short["classes"]["matmul"]["trees"][0]["value"] = tree["value"][:1]
    unknown_features = json.loads(json.dumps(data))     # features this tapeout does not compute for the class
    unknown_features["classes"]["matmul"]["features"] = [*predictor.FEATURES, "groups"]
    for body in ("{nope", json.dumps({**data, "schema": "tapeout.predictor/0"}), json.dumps(cyclic),
                 json.dumps(wrong_feature), json.dumps(short), json.dumps({**data, "roof": {}}),
                 json.dumps(unknown_features)):
        path = tmp_path / "p.json"
        path.write_text(body)
        with pytest.raises(BadInput) as caught:
            predictor.load(path)
        assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_a_conv_predictor_reads_the_kernels_shape_from_the_sweep_and_the_build(digits_build):
    """FLOPs and bytes do not tell a 7×7 depthwise conv from a 1×1 dense one: the conv predictor also reads the
    kernel's shape, which the sweep's points and a build's structure.json both carry; a conv kernel without one (a
    build made before) gets no prediction rather than a wrong one."""
    import random

    from tapeout.estimation import sweep
    from tapeout.estimation.roofline import Roof

    structure = json.loads((digits_build / "structure.json").read_text())
    convs = [k for k in structure["kernels"] if k["class"] == "conv"]
    # the build keeps what the model says; what the runtime decides (the layout) is asked of it when priced
    assert convs and all(set(k["shape"]) == set(predictor.SHAPE_FEATURES["conv"]) - set(predictor.DERIVED)
                         for k in convs)
    assert all(k["shape"]["per_group"] >= 1 and k["shape"]["area"] == 9 for k in convs)  # digits-cnn: 3×3 convs
    roof = Roof(name="test", kind="cpu", peaks={"fp32": 1e11}, bandwidth=2e10, source="a stand-in roof")
    rng, rows = random.Random(0), []
    while len(rows) < predictor.MIN_POINTS + 4:
        proto, inputs = sweep.model(sweep_draws.sample("conv", rng))
        feats = sweep.features_of(proto, inputs, roof)
        if feats and feats["cls"] == "conv":
            # a time that depends on the kernel area, which FLOPs alone would not give
            rows.append({**feats, "kernel_s": feats["roof_s"] * (1 + feats["shape"]["area"])})
    model = predictor.train(rows)["conv"]
    assert model.features == [*predictor.FEATURES, *predictor.SHAPE_FEATURES["conv"]]
    pred = predictor.Predictor(predictor.PredictorFile(schema=predictor.SCHEMA, device="d", target="t", host="h",
                                                       threads=1, created="now", baseline_s=1e-6,
                                                       roof=roof.to_json(), points=len(rows), classes={"conv": model}),
                               digits_build)
    first = rows[0]
    args = (first["flops"], first["bytes"], first["roof_s"], first["launches"], first["nodes"])
    assert pred.kernel_s("conv", *args, first["shape"]) > 0
    assert pred.kernel_s("conv", *args) is None and pred.kernel_s("conv", *args, {"area": 9}) is None


def test_a_sweep_file_of_the_first_definition_is_not_resumed(swept, tmp_path):
    """Its points took a kernel's time as the run less Identity's: mixed with new points, one class would learn two
    definitions at once. Refused in one line, before anything is measured."""
    folder, first = swept
    shutil.copytree(folder / "sweeps", tmp_path / "sweeps")
    path = tmp_path / "sweeps" / f"{first['device']}--onnxruntime.json"
    old = json.loads(path.read_text())
    assert old["definition"] == 4
    del old["definition"]
    path.write_text(json.dumps(old))
    done = run_cli("calibrate", "--sweep", "host", "--minutes", "0.1", "--classes", "matmul", "--out", tmp_path)
    assert done.code == 2 and "another definition (1" in one_line_error(done), done.err
    assert json.loads(path.read_text()) == old


def test_a_class_named_twice_is_drawn_twice_as_often(tmp_path):
    """`--classes` is drawn in turn, so a class named twice gets twice the draws (a sweep's time spent where its
    held-out error is: the conv class needed more points than the others)."""
    done = run_cli("calibrate", "--sweep", "host", "--minutes", "0.1", "--classes", "elementwise,elementwise,movement",
                   "--out", tmp_path, "--json")
    assert done.code == 0, done.err
    points = json.loads((tmp_path / "sweeps" / f"{done.json()['device']}--onnxruntime.json").read_text())["points"]
    drawn = {c: sum(p["cls"] == c for p in points) for c in ("elementwise", "movement")}
    assert drawn["movement"] >= 4 and drawn["elementwise"] >= 1.6 * drawn["movement"], drawn


def test_sweep_refusals_are_one_line():
    for args, code, words in ((("--sweep", "jetson-orin-nano-super"), 4, "is not this machine"),
                              (("--sweep", "host", "--classes", "tensor"), 2, "unknown kernel class 'tensor'"),
                              (("--sweep", "host", "--minutes", "0"), 2, "--minutes 0"),
                              ((), 2, "needs build dirs measured on the device, or --sweep")):
        done = run_cli("calibrate", *args)
        assert done.code == code and words in one_line_error(done), done.err


def test_nodes_onnx_runtimes_optimized_graph_runs_beyond_the_kernels_each_cost_a_dispatch(swept, digits_build,
                                                                                         tmp_path, monkeypatch):
    """ONNX Runtime's optimizer adds nodes the cost units do not count (a Reshape on each side of a Gemm it fused from
    a 3-D MatMul and Add): each priced as a view, one dispatch as the sweep measured it (a predictor file from before
    it was kept: the movement predictor's time for a kernel moving nothing); the artifact (ORT's own optimized graph)
    says how many run. Counted for FP32 onnxruntime builds only."""
    import math

    import onnx

    from tapeout.builds.reader import open_build
    from tapeout.estimation import cost_units as kern

    folder, first = swept
    path = folder / predictor.file_name(first["device"], "onnxruntime")
    data = json.loads(path.read_text())
    view_s = 3e-7  # a one-leaf movement model: every movement kernel 0.3 µs
    data["classes"]["movement"] = {**data["classes"]["matmul"], "init": math.log(view_s), "rate": 1.0,
                                   "relative_to_roof_plus_s": None, "features": list(predictor.FEATURES), "trees": [{"feature": [-2], "threshold": [-2.0], "left": [-1], "right": [-1],
                                              "value": [0.0]}]}
    made = tmp_path / path.name
    made.write_text(json.dumps({**data, "dispatch_s": 0.0}))   # as trained before the dispatch was kept
    pred = predictor.load(made)
    build = open_build(digits_build)
    artifact = build.artifact() / build.manifest.artifact.main_file
    graph = onnx.load(str(artifact), load_external_data=False).graph
    ran = sum(1 for n in graph.node if n.op_type not in ("Shape", "Size", "Constant"))
    assert runtime_graph.executed_nodes("onnxruntime", "fp32", artifact) == ran
    assert runtime_graph.executed_nodes("onnxruntime", "int8", artifact) is None
    assert runtime_graph.executed_nodes("openvino", "fp32", artifact) is None
    kernels = kern.at_precision(build_structure.kernels_of(build), None, "fp32")
    roof = pred.roof()
    plain = estimate.estimate(kernels, roof, "onnxruntime", "fp32", None, pred)
    more = estimate.estimate(kernels, roof, "onnxruntime", "fp32", None, pred, executed=len(kernels) + 10)
    assert more.predicted_s == pytest.approx(plain.predicted_s + 10 * view_s)
    assert any("runs" in n and "the 10 more are priced as one dispatch each" in n for n in more.notes)
    fewer = estimate.estimate(kernels, roof, "onnxruntime", "fp32", None, pred, executed=len(kernels) - 1)
    assert fewer.predicted_s == plain.predicted_s and not any("more are priced" in n for n in fewer.notes)
    # with the sweep's dispatch kept, an extra node and a view (a Reshape: one dispatch, ~0.18 µs here, as a Neg's)
    # cost that, whatever the movement predictor says of a kernel of no bytes, which no sweep point is
    kept = tmp_path / "kept" / path.name
    kept.parent.mkdir()
    kept.write_text(json.dumps({**data, "dispatch_s": 2e-7}))
    timed = predictor.load(kept)
    views = [kern.Kernel("v", "movement", "fp32", 0, 0.0, 1)] * 3
    base = estimate.estimate(kernels, roof, "onnxruntime", "fp32", None, timed)
    both = estimate.estimate(kernels + views, roof, "onnxruntime", "fp32", None, timed, executed=len(kernels) + 3 + 10)
    assert both.predicted_s == pytest.approx(base.predicted_s + 13 * 2e-7)
    assert any("priced as one dispatch each (0.20 µs, one node's dispatch as the sweep measured it)" in n
               for n in both.notes)

    # `tapeout estimate`'s path reads the verified artifact's graph: here its count stands for ORT adding ten nodes
    counted = []
    real = runtime_graph.executed_nodes

    def ten_more(target, precision, path, graph=None):
        counted.append(path)
        found = real(target, precision, path, graph)
        return None if found is None else len(kernels) + 10

    monkeypatch.setattr(runtime_graph, "executed_nodes", ten_more)
    monkeypatch.setattr(predictor, "find", lambda device, target, *_: pred if target == "onnxruntime" else None)
    made = estimate.for_build(build)
    assert counted == [artifact] and any("the 10 more are priced as one dispatch each" in n for n in made.notes)


def test_the_layout_reorders_onnx_runtime_inserts_are_priced_as_kernels(swept, digits_build, tmp_path, monkeypatch):
    """ONNX Runtime blocks digits-cnn's convs (NCHWc) and puts a ReorderOutput where its plain ops read them: a kernel
    the model has none of and no one-kernel sweep point holds. The estimate asks the runtime for them (the graph it
    optimizes on this host) and prices each as a movement kernel reading and writing its tensor."""
    import math

    from tapeout.builds.reader import open_build
    from tapeout.core.host import host_fingerprint
    from tapeout.estimation import runtime_kernels

    if "avx2" not in host_fingerprint().get("cpu_flags", ""):
        pytest.skip("ONNX Runtime blocks convs only on x86 with AVX2 or AVX-512")
    build = open_build(digits_build)
    artifact = build.artifact() / build.manifest.artifact.main_file
    reorders = runtime_kernels.inserted_reorders(artifact, build.manifest.project.dims)
    assert reorders and all(op in runtime_kernels.REORDERS and size > 0 for op, _, size in reorders)
    kernels = build_structure.kernels_of(build)  # an INT8 build's graph is not read for them (no plan: as it is)
    assert runtime_graph.runtime_graph("onnxruntime", "int8", None, artifact, None, kernels, {}) == (kernels, None, [])

    folder, first = swept
    path = folder / predictor.file_name(first["device"], "onnxruntime")
    data = json.loads(path.read_text())
    move_s = 3e-7
    leaf = [{"feature": [-2], "threshold": [-2.0], "left": [-1], "right": [-1], "value": [0.0]}]
    data["classes"]["movement"] = {**data["classes"]["matmul"], "init": math.log(move_s), "rate": 1.0, "trees": leaf,
                                   "relative_to_roof_plus_s": None,  # seconds, not a ratio to the roofline
                                   "features": list(predictor.FEATURES)}
    # every other class at 0.1 ms a kernel, far over any floor: a floor moves with the whole call's traffic (its
    # cache level), which the reorders' bytes add to, and a swept predictor's kernels can sit on theirs
    for name in set(data["classes"]) - {"movement"}:
        data["classes"][name] = {**data["classes"][name], "init": math.log(1e-4), "rate": 1.0, "trees": leaf,
                                 "relative_to_roof_plus_s": None}
    (tmp_path / path.name).write_text(json.dumps(data))
    pred = predictor.load(tmp_path / path.name)
    monkeypatch.setattr(predictor, "find", lambda device, target, *_: pred if target == "onnxruntime" else None)
    priced = estimate.for_build(build)
    names = [k.name for k in priced.kernels if k.name.startswith(runtime_kernels.REORDERS)]
    assert len(names) == len(reorders) and any("layout reorder" in n for n in priced.notes)
    monkeypatch.setattr(runtime_kernels, "reorders_in", lambda graph, dims: [])
    without = estimate.for_build(build)
    each = dict(zip([k.name for k in priced.kernels], priced.per_kernel_s, strict=True))
    assert all(each[n] == pytest.approx(move_s) for n in names)  # each reorder at the movement predictor
    assert priced.predicted_s == pytest.approx(without.predicted_s + len(reorders) * move_s)


def test_a_residual_add_and_its_relu_a_blocked_conv_runs_inside_itself_are_no_kernels(tmp_path):
    """ONNX Runtime's NCHWc transformer folds an Add of a conv's output (a residual) into the conv as its Sum input,
    and the Relu after it as the conv's activation: a toy ResNet's profile lists neither, where a kernel each added
    ~1 µs to its ~20. The estimate asks the runtime's own graph: those two are no kernels and no nodes it runs; an
    Add of two plain tensors stays."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from tapeout.core.host import host_fingerprint
    from tapeout.estimation import cost_units as kern
    from tapeout.estimation import runtime_kernels

    if "avx2" not in host_fingerprint().get("cpu_flags", ""):
        pytest.skip("ONNX Runtime blocks convs only on x86 with AVX2 or AVX-512")
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32), f"w{i}")
               for i in (0, 1, 2)]
    # the residual's other side blocked too (a conv's output, as a ResNet block's input is): ONNX Runtime folds an
    # Add of two blocked tensors only
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1] * 4),
             helper.make_node("Conv", ["c0", "w1"], ["c1"], name="conv1", pads=[1] * 4),
             helper.make_node("Add", ["c1", "c0"], ["sum"], name="residual"),
             helper.make_node("Relu", ["sum"], ["act"], name="relu"),
             helper.make_node("Conv", ["act", "w2"], ["c2"], name="conv2", pads=[1] * 4),
             helper.make_node("Add", ["x", "x"], ["twice"], name="plain"),
             helper.make_node("Concat", ["c2", "twice"], ["y"], name="cat", axis=1)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 8, 8])
    proto = helper.make_model(helper.make_graph(nodes, "g", [x], [y], weights),
                              opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    artifact = tmp_path / "model.onnx"
    onnx.save(proto, str(artifact))
    folded = runtime_kernels.folded_into_convs(proto.graph, runtime_kernels.optimized_graph(artifact))
    assert folded == {"residual", "relu"}

    kernels = [kern.Kernel(name, cls, "fp32", flops, bytes_, 1) for name, cls, flops, bytes_ in (
        ("conv0", "conv", 10**6, 1e4), ("conv1", "conv", 10**6, 1e4), ("residual", "elementwise", 1024, 12288.0),
        ("relu", "elementwise", 1024, 8192.0), ("conv2", "conv", 10**6, 1e4), ("plain", "elementwise", 1024, 12288.0),
        ("cat", "movement", 0, 16384.0))]
    priced, executed, inserted = runtime_graph.runtime_graph("onnxruntime", "fp32", None, artifact, None, kernels, {})
    assert [k.name for k in priced if k not in inserted] == ["conv0", "conv1", "conv2", "plain", "cat"]
    assert executed == runtime_graph.executed_nodes("onnxruntime", "fp32", artifact) - 2 + len(inserted)


def test_a_generation_loop_is_priced_by_the_predictors_phase_by_phase_with_their_band(swept):
    """Each phase of a generate loop (prefill per prompt length, the decode step at two positions) is priced as one
    call by the device's kernel predictors, as a forward build is, and the loop's TTFT and TPOT carry their band."""
    from types import SimpleNamespace

    from tapeout.estimation import cost_units as kern
    from tapeout.estimation import generation

    folder, first = swept
    pred = predictor.load(folder / predictor.file_name(first["device"], "onnxruntime"))
    roof = pred.roof()

    def phase(kind, seq, past):  # a small decoder: 4 projections of 256 × 256 and an attention over the cache
        proj = kern.Kernel("proj", "matmul", "fp32", 2 * 256 * 256 * seq * 4, 4 * (4 * 256 * 256 + 2 * 256 * seq), 4,
                           lead="proj")
        attn = kern.Kernel("attn", "elementwise", "fp32", 4 * 256 * seq * (past + seq), 4 * 512 * (past + seq), 1)
        return generation.Phase(kind, seq, past, [proj, attn])

    workload = SimpleNamespace(kind="generate", prompt_lengths=[16, 64], new_tokens=9, max_context=128, batch=1)
    phases = [phase(*s) for s in generation.shapes(workload.prompt_lengths, workload.new_tokens, workload.max_context)]
    est = generation.price(phases, roof, "onnxruntime", "fp32", None, None, workload, (pred, None))
    for p, cost in zip(phases, est.prefill + est.decode, strict=True):
        single = estimate.estimate(p.kernels, roof, "onnxruntime", "fp32", None, pred)
        rate = roof.bandwidth_at(sum(k.bytes for k in p.kernels))  # the floor: the cache level the call fits in
        floor = sum(estimate.floor_s(k, roof, rate) for k in p.kernels)
        assert cost.predicted_s == single.predicted_s and cost.predicted_s >= floor * (1 - 1e-9)
    assert est.how == "kernel predictors" and est.band == pred.band({"matmul", "elementwise"})
    point, low, high = est.ttft_ms(64)
    assert low <= point <= high and est.tpot_ms("p50") is not None
    assert est.tpot_ms("p90") is None and est.tpot_ms("p99") is None  # single kernels give no tail: not claimed
    data = est.to_json()
    assert "kernel predictors" in data["method"] and "predictors' spread" in data["band_from"]
    assert est.line().endswith("(kernel predictors)")
    # without them, the same phases are roofline bounds: nothing predicted, nothing claimed
    bare = generation.price(phases, roof, "onnxruntime", "fp32", None, None, workload)
    assert bare.how == "roofline lower bound" and bare.ttft_ms(64) is None and bare.tpot_ms("p50") is None


def test_a_models_kernels_are_floored_at_the_cache_level_its_traffic_fits_in():
    """The floor under a predicted kernel with weights is its roofline time with its bytes at the rate of the cache
    level the whole call's traffic fits in: a small model's matmuls are not priced at DRAM bandwidth (the sweep's
    one-kernel models, which the predictors learned from, ran cache-hot), a model moving more than the largest cache
    is; a kernel of activations only at the level its own traffic fits in."""
    import math

    from tapeout.estimation import cost_units as kern
    from tapeout.estimation import roofline

    # DRAM 100 GB/s; up to 32 MB re-read at 500 GB/s (a 16 MB probe's copy: its two arrays)
    roof = roofline.Roof("test", "cpu", {"fp32": 1e15}, 1e11, "test", cache=((16 << 20, 5e11),))
    leaf = {"init": math.log(1e-6), "rate": 1.0, "band": [-0.1, 0.1], "points": 12, "held_out_within_15": 1.0,
            "trees": [{"feature": [-2], "threshold": [-2.0], "left": [-1], "right": [-1], "value": [0.0]}]}
    data = predictor.PredictorFile.model_validate({
        "schema": predictor.SCHEMA, "device": "test", "target": "onnxruntime", "host": "test", "threads": 1,
        "created": "test", "baseline_s": 0.0, "roof": roof.to_json(), "points": 12, "classes": {"matmul": leaf, "elementwise": leaf}})
    pred = predictor.Predictor(data, Path("made.predictor.json"))
    mib = 1 << 20

    def model(n: int) -> list:
        return [kern.Kernel(f"mm{i}", "matmul", "fp32", 1000, mib, 1) for i in range(n)]

    small = estimate.estimate(model(4), pred.roof(), "onnxruntime", "fp32", None, pred)        # 4 MB a call
    assert small.predicted_s == pytest.approx(4 * mib / 5e11)         # each at the cache's rate, over the 1 µs leaf
    assert small.lower_bound_s == pytest.approx(4 * mib / 1e11)       # the bound stays DRAM's
    large = estimate.estimate(model(40), pred.roof(), "onnxruntime", "fp32", None, pred)       # 40 MB: past the cache
    assert large.predicted_s == pytest.approx(40 * mib / 1e11)
    # a kernel of activations only reads what the kernel before it wrote: floored at its own traffic's cache level,
    # not the call's (an elementwise op of 1 MB beside 40 MB of weights)
    ew = estimate.estimate([*model(40), kern.Kernel("act", "elementwise", "fp32", 1000, mib, 1)], pred.roof(),
                           "onnxruntime", "fp32", None, pred)
    assert ew.per_kernel_s[-1] == pytest.approx(mib / 5e11) and ew.per_kernel_s[0] == pytest.approx(mib / 1e11)


def test_a_generic_reorder_no_sweep_draws_is_priced_at_the_hosts_strided_loop():
    """OpenVINO's generic reorder (`strided`, element by element) is no swept class: a predictor prices it at the
    strided loop its roof measured on this host at the reorder's conflicts, with a node's dispatch, not at its bytes
    and not as a kernel left to the calibration; a roof with no such loop leaves it unpriced, as before."""
    import math

    from tapeout.estimation import cost_units as kern
    from tapeout.estimation import roofline
    from tapeout.estimation.strided import Strided

    loop = Strided(64, 12, 64, ((0.5, 1e-9), (2.0, 3e-9)))
    roof = roofline.Roof("test", "cpu", {"fp32": 1e12}, 1e10, "test", strided=loop)
    leaf = {"init": math.log(1e-6), "rate": 1.0, "band": [-0.1, 0.1], "points": 12, "held_out_within_15": 1.0,
            "trees": [{"feature": [-2], "threshold": [-2.0], "left": [-1], "right": [-1], "value": [0.0]}]}

    def predictor_at(at) -> predictor.Predictor:
        return predictor.Predictor(predictor.PredictorFile.model_validate({
            "schema": predictor.SCHEMA, "device": "test", "target": "openvino", "host": "test", "threads": 1,
            "created": "test", "baseline_s": 0.0, "dispatch_s": 2e-7, "roof": at.to_json(), "points": 12,
            "classes": {"matmul": leaf}}), Path("made.predictor.json"))

    reorder = kern.Kernel("Reorder r", "strided", "fp32", 0, 2.0 * 4 * 64 * 4096, 1,
                          shape=(("elements", 64 * 4096), ("lines", 64), ("stride", 4096 * 4)), runs_as="r")
    pred = predictor_at(roof)
    est = estimate.estimate([reorder], pred.roof(), "openvino", "fp32", None, pred)
    loop_s = pred.roof().strided.seconds(64 * 4096, 64, 4096 * 4)
    assert loop_s > reorder.bytes / 1e10  # slower than its bytes: the conflicts, not the traffic
    assert est.predicted_s == pytest.approx(loop_s + 2e-7) and not est.unpredicted
    bare = predictor_at(roofline.Roof("test", "cpu", {"fp32": 1e12}, 1e10, "test"))
    assert estimate.estimate([reorder], bare.roof(), "openvino", "fp32", None, bare).unpredicted == ["strided@fp32"]


def test_onnx_runtime_itself_says_which_convs_it_runs_blocked():
    """The conv's layout is the installed runtime's decision on this CPU, read from the graph it optimizes: a conv
    whose input channels are not a multiple of 4 (past the block) runs plain everywhere; a 16 → 32 channel conv and
    a depthwise one run blocked (NCHWc) on every x86 CPU with AVX2, which every machine here has; ONNX Runtime 1.32
    blocks no 1-D conv."""
    from tapeout.core.host import host_fingerprint
    from tapeout.estimation import runtime_kernels as rk

    plain = {"per_group": 17, "out_channels": 32, "positions": 64, "area": 9, "groups": 1}
    assert rk.conv_layout(plain) == rk.PLAIN
    assert rk.conv_layout({"per_group": 17, "area": 9}) is None
    if "avx2" not in host_fingerprint().get("cpu_flags", ""):
        pytest.skip("ONNX Runtime blocks convs only on x86 with AVX2 or AVX-512")
    assert rk.conv_layout({**plain, "per_group": 16}) == rk.BLOCKED
    assert rk.conv_layout({"per_group": 1, "out_channels": 32, "positions": 64, "area": 9, "groups": 32}) == rk.BLOCKED
    # the same channels as a Conv1d (speech models' front ends): asked as a 1-D conv, which it runs plain
    assert rk.conv_layout({**plain, "per_group": 16, "rank": 1}) == rk.PLAIN


def test_the_conv_predictor_tells_a_blocked_conv_from_a_plain_one():
    """Trained on points whose time depends on the layout alone, the predictor prices two convs of one shape but
    for their input channels apart by the layout ONNX Runtime runs them in; a kernel's layout and channel fill are
    filled in when it is priced (a build's structure does not keep them), and a predictor file from before them
    still reads 2-D convs; a Conv1d is drawn too, runs plain, and a file trained before 1-D convs were swept leaves
    them unpriced rather than price them as 2-D ones."""
    import random

    from tapeout.core.host import host_fingerprint
    from tapeout.estimation import runtime_kernels as rk
    from tapeout.estimation import sweep
    from tapeout.estimation.roofline import Roof

    if "avx2" not in host_fingerprint().get("cpu_flags", ""):
        pytest.skip("ONNX Runtime blocks convs only on x86 with AVX2 or AVX-512")
    roof = Roof(name="test", kind="cpu", peaks={"fp32": 1e11}, bandwidth=2e10, source="a stand-in roof")
    rng, rows = random.Random(1), []
    while len(rows) < 120:  # a quarter 1-D, all plain: 80 were too few 2-D convs to learn the layout from
        proto, inputs = sweep.model(sweep_draws.sample("conv", rng))
        feats = sweep.features_of(proto, inputs, roof)
        if feats and feats["cls"] == "conv":
            assert feats["shape"]["layout"] in (rk.BLOCKED, rk.PLAIN)
            rows.append({**feats, "kernel_s": feats["roof_s"] * (1.0 if feats["shape"]["layout"] == rk.BLOCKED else 3.0)})
    assert {r["shape"]["layout"] for r in rows} == {rk.BLOCKED, rk.PLAIN}
    assert {r["shape"]["rank"] for r in rows} == {1, 2}  # Conv1d drawn beside the 2-D convs, its rank kept
    assert all(r["shape"]["layout"] == rk.PLAIN for r in rows if r["shape"]["rank"] == 1)
    model = predictor.train(rows)["conv"]
    assert model.features[-4:] == ["layout", "fill", "rank", "width"]

    def priced(classes, per_group, rank=2):
        pred = predictor.Predictor(predictor.PredictorFile(
            schema=predictor.SCHEMA, device="d", target="t", host="h", threads=1, created="now", baseline_s=1e-6,
            roof=roof.to_json(), points=len(rows), classes=classes), Path("p.json"))
        shape = {"per_group": per_group, "out_channels": 64, "positions": 256, "area": 9, "groups": 1,
                 "width": 256 if rank == 1 else 16, **({"rank": 1} if rank == 1 else {})}
        flops = 2 * 64 * 256 * 9 * per_group
        return pred.kernel_s("conv", flops, 4 * (per_group * 324 + 64 * 256), flops / 1e11, 1, 2, shape)

    assert priced({"conv": model}, 33) / priced({"conv": model}, 32) > 1.8  # 33 channels run plain, 32 blocked
    assert priced({"conv": model}, 32, rank=1) / priced({"conv": model}, 32) > 1.5  # a 1-D conv runs plain (3× here)
    old = model.model_copy(update={"features": model.features[:-4]}, deep=True)
    for tree in old.trees:  # a file from before the layout: its trees never read the derived features
        tree.feature = [f if f < len(old.features) else 0 for f in tree.feature]
    assert priced({"conv": old}, 33) > 0
    assert priced({"conv": old}, 32, rank=1) is None  # nor did it see a 1-D conv: it does not price one


def test_the_sweep_measures_the_kernels_onnx_runtime_fuses_as_one(tmp_path):
    """A residual Add feeding a LayerNormalization, a MatMul with its bias and Gelu, an RMSNorm and GPT-2's tanh GELU
    written out are one kernel each to the estimator, and ONNX Runtime runs them as one SkipLayerNormalization, a
    Gemm and a Gelu, one SimplifiedLayerNormalization and one FastGelu: the sweep measures them as such, not only their parts (whose times are not theirs:
    SkipLayerNormalization ran 8× LayerNormalization's here). The GELU needs a view after it (ONNX Runtime fuses
    none that writes a graph output), whose dispatch its point leaves out."""
    import random

    import onnx
    import onnxruntime as ort

    from tapeout.estimation import sweep
    from tapeout.estimation.roofline import Roof

    roof = Roof(name="test", kind="cpu", peaks={"fp32": 1e11}, bandwidth=2e10, source="a stand-in roof")
    rng, seen = random.Random(3), {}
    while len(seen) < 4:
        config = sweep_draws.sample(rng.choice(("reduce", "matmul", "elementwise")), rng)
        kind = {"Add+LayerNormalization": "skip", "GeluTanh": "fast", "RMSNorm": "rms"}.get(config.op)
        kind = kind or ("gelu" if dict(config.sizes).get("act") else None)
        if kind and kind not in seen and sweep_draws.rough_flops(config) < 5e7:
            seen[kind] = config
    expected = {"skip": (2, ["SkipLayerNormalization"]), "gelu": (3, None), "fast": (8, ["FastGelu", "Reshape"]),
                "rms": (6, ["SimplifiedLayerNormalization"])}
    for kind, config in seen.items():
        proto, inputs = sweep.model(config)
        feats = sweep.features_of(proto, inputs, roof)
        assert feats is not None and feats["cls"] == config.cls
        nodes, ops = expected[kind]
        assert feats["nodes"] == nodes and feats["views"] == (1 if kind == "fast" else 0)
        if ops:
            options = ort.SessionOptions()
            options.optimized_model_filepath = str(tmp_path / f"{kind}.onnx")
            ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
            assert [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node] == ops


def test_an_int8_matmul_is_swept_as_the_cpu_rules_quantize_it_and_priced_by_its_own_predictor(tmp_path):
    """A transformer's cpu-int8 build runs its MatMuls dynamically quantized (weights int8 per channel, activations
    per call), which ONNX Runtime runs as one DynamicQuantizeMatMul: the sweep times that, priced as the estimate
    prices an INT8 kernel (a quarter of the bytes, the INT8 peak), and trains it apart from FP32 MatMuls. The
    estimate prices an INT8 kernel by it and the activation quantization the plan adds beside it at nothing (inside
    the kernel's time, as swept); an INT8 kernel of a class with no INT8 predictor, or of a statically quantized
    build, is left to the calibration."""
    import math
    import random

    import onnx
    import onnxruntime as ort

    from tapeout.estimation import cost_units as kern
    from tapeout.estimation import sweep
    from tapeout.estimation.roofline import Roof

    roof = Roof(name="test", kind="cpu", peaks={"fp32": 1e11, "int8": 4e11}, bandwidth=2e10, source="a stand-in")
    rng = random.Random(5)
    config = next(c for c in iter(lambda: sweep_draws.sample("matmul", rng), None)
                  if sweep.quantization_of(c) == "dynamic" and sweep_draws.rough_flops(c) < 5e7)
    proto, inputs = sweep.model(config)
    fp32, int8 = sweep.features_of(proto, inputs, roof), sweep.features_of(proto, inputs, roof, "int8")
    assert (fp32["precision"], int8["precision"], int8["cls"]) == ("fp32", "int8", "matmul")
    assert int8["bytes"] == fp32["bytes"] / 4 and int8["flops"] == fp32["flops"]
    assert int8["roof_s"] == max(int8["flops"] / 4e11, int8["bytes"] / 2e10)
    # the GEMM's shape, as the predictor reads it: its rows, depth and columns, and how the depth and columns align
    assert int8["shape"] == {**{n: config[n] for n in ("m", "k", "n")}, "k_align": predictor.alignment(config["k"]),
                             "n_align": predictor.alignment(config["n"])}
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "int8.onnx")
    ort.InferenceSession(sweep.timed_model(config, proto).SerializeToString(), options,
                         providers=["CPUExecutionProvider"])
    assert [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node] == ["DynamicQuantizeMatMul"]

    rows = []
    for i in range(30):  # FP32 MatMuls at twice their roofline, INT8 ones at five times
        for precision, times in (("fp32", 2.0), ("int8", 5.0)):
            flops, bytes_ = 2e5 * (1 + i), 4e4 * (1 + i) * (0.25 if precision == "int8" else 1.0)
            roof_s = max(flops / roof.peak(precision)[0], bytes_ / 2e10)
            rows.append({"cls": "matmul", "precision": precision, "flops": flops, "bytes": bytes_, "nodes": 1,
                         "launches": 1, "roof_s": roof_s, "kernel_s": times * roof_s,
                         "shape": {"m": 100, "k": 100, "n": 10 * (1 + i)}})
    classes = predictor.train(rows)
    assert set(classes) == {"matmul", "matmul@int8"}
    pred = predictor.Predictor(predictor.PredictorFile(
        schema=predictor.SCHEMA, device="d", target="onnxruntime", host="h", threads=1, created="now",
        baseline_s=0.0, roof=roof.to_json(), points=len(rows), classes=classes), Path("p.json"))
    plan = {"groups": [{"nodes": ["mm"], "precision": "int8"}, {"nodes": ["cv"], "precision": "int8"}]}
    model = kern.at_precision([kern.Kernel("mm", "matmul", "fp32", 3e6, 6e5, 1, lead="mm", quantized_input=1000,
                                           shape=(("m", 100), ("k", 100), ("n", 150))),
                               kern.Kernel("cv", "conv", "fp32", 3e6, 6e5, 1, lead="cv", quantized_input=1000)],
                              plan, "fp32")
    assert [(k.cls, k.precision) for k in model] == [("matmul", "int8"), ("quantize", "int8"), ("conv", "int8"),
                                                     ("quantize", "int8")]
    est = estimate.estimate(model, roof, "onnxruntime", "int8", None, pred)
    mm_roof = max(kern.roof_times(model[0], roof))
    assert est.per_kernel_s[0] == pytest.approx(5.0 * mm_roof, rel=0.1)  # the INT8 predictor, not the FP32 one
    assert est.per_kernel_s[1] == 0.0                                      # its quantization: inside it
    assert est.per_kernel_s[2] == max(kern.roof_times(model[2], roof))     # no conv@int8: its roofline (no calibration)
    assert est.per_kernel_s[3] > 0                                         # the conv's quantization stays priced
    assert any("1 activation quantizations priced inside" in n for n in est.notes)
    assert est.unpredicted == ["conv@int8", "quantize@int8"]
    assert any(n.startswith("no predictor for conv@int8, quantize@int8") for n in est.notes)
    assert math.isfinite(est.predicted_s)
    # those INT8 classes are dynamic quantization's kernels: a statically quantized build (QLinearConv, QGemm) is
    # not priced by them
    assert set(estimate._for_plan(pred, {"method": "dynamic", **plan}).data.classes) == {"matmul", "matmul@int8"}
    assert set(estimate._for_plan(pred, {"method": "static", **plan}).data.classes) == {"matmul"}
    # an LSTM's cpu-int8 build runs it dynamically quantized too, as one DynamicQuantizeLSTM (ONNX Runtime quantizes
    # no GRU): swept so
    cell = next(c for c in iter(lambda: sweep_draws.sample("recurrent", rng), None) if sweep.precision_of(c) == "int8")
    assert cell.op == "LSTM" and sweep.quantization_of(cell) == "dynamic"
    assert [n.op_type for n in sweep.timed_model(cell, *sweep.model(cell)).graph.node] == ["DynamicQuantizeLSTM"]


def test_a_static_int8_conv_is_swept_as_a_qlinearconv_and_a_static_build_is_priced_by_its_runtimes_graph(
        tmp_path, digits_int8_build, monkeypatch):
    """A CNN's cpu-int8 build quantizes its convs statically (QDQ), which ONNX Runtime runs as QLinearConvs in NHWC
    with QuantizeLinear, DequantizeLinear and Transposes where its graph leaves INT8 or changes layout. The sweep times
    a lone QDQ conv, taking the Q, DQ and Transposes around it out of its time as it takes a lone conv's reorders
    (they are the graph's, not the conv's); the estimate of a static build reads those nodes from the graph ONNX
    Runtime optimizes and prices each as a kernel (a `quantize` one, swept too), in place of the cost units' one
    activation quantization per quantized kernel. conv@int8 is a static plan's, matmul@int8 a dynamic plan's."""
    import random

    import onnx
    import onnxruntime as ort

    from tapeout.builds.reader import open_build
    from tapeout.estimation import cost_units as kern
    from tapeout.estimation import sweep
    from tapeout.estimation.roofline import Roof

    rng = random.Random(3)
    config = next(c for c in iter(lambda: sweep_draws.sample("conv", rng), None)
                  if sweep.precision_of(c) == "int8" and sweep_draws.rough_flops(c) < 5e7)
    assert config.op == "Conv" and config["relu"] == 0 and sweep.quantization_of(config) == "static"
    proto, inputs = sweep.model(config)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "int8.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(sweep.timed_model(config, proto, inputs).SerializeToString(), options,
                         providers=["CPUExecutionProvider"])
    ran = [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]
    assert "QLinearConv" in ran and set(ran) <= {"QLinearConv", "QuantizeLinear", "DequantizeLinear", "Transpose"}
    from tapeout.commands.sweep import TARGETS

    assert {"QuantizeLinear", "DequantizeLinear", "Transpose"} <= set(TARGETS["onnxruntime"].inserted)
    quantize = sweep.Config("quantize", "DequantizeLinear", (("size", 4096),))
    q_proto, q_inputs = sweep.model(quantize)
    roof = Roof(name="test", kind="cpu", peaks={"fp32": 1e11, "int8": 4e11}, bandwidth=2e10, source="a stand-in")
    feats = sweep.features_of(q_proto, q_inputs, roof)
    assert (feats["cls"], feats["precision"], feats["flops"]) == ("quantize", "fp32", 4096)
    assert feats["bytes"] == pytest.approx(5 * 4096, abs=8)  # 1 byte in, 4 out: as the estimate prices a graph's DQ

    # digits-cnn at cpu-int8 (this host's static QDQ): ONNX Runtime runs its int8 conv as Q → Transpose → QLinearConv
    # → Transpose → DQ, and its Linear as a QGemm with a DQ after it
    build = open_build(digits_int8_build)
    executed, added, pools = runtime_graph.quantized_kernels(build.artifact() / build.manifest.artifact.main_file,
                                                             build.exported_model(), build.manifest.project.dims)
    assert len(pools) == 1  # its MaxPool, left between a Q and a DQ: ONNX Runtime runs it on uint8
    ops = Counter(k.name.split(" ")[0] for k in added)
    assert ops["QuantizeLinear"] >= 1 and ops["DequantizeLinear"] >= 1 and ops["Transpose"] == 2
    assert all(k.bytes > 0 for k in added) and executed > len(added)
    assert {k.cls for k in added if k.name.startswith("Transpose")} == {"movement"}
    transposes = [k for k in added if k.name.startswith("Transpose")]
    assert {k.bytes for k in transposes} == {2.0 * 16 * 8 * 8, 2.0 * 32 * 8 * 8}  # 8-bit: one byte an element

    rows = [{"cls": cls, "precision": precision, "quantization": method, "flops": 2e5 * (1 + i),
             "bytes": 4e4 * (1 + i), "nodes": 1, "launches": 1, "roof_s": 1e-6 * (1 + i), "kernel_s": times * (1 + i),
             "shape": {"per_group": 16, "out_channels": 32, "positions": 64, "area": 9, "groups": 1, "layout": 2,
                       "fill": 100, "rank": 2, "width": 8} if cls == "conv" else
             {"function": 1, **({"run": 64} if cls == "movement" else {})} if cls in kern.FUNCTION_CLASSES else
             {"m": 8, "k": 16 * (1 + i), "n": 32} if cls == "matmul" else {}}
            for i in range(20) for cls, precision, method, times in (
                ("conv", "int8", "static", 3e-6), ("matmul", "int8", "dynamic", 3e-6),
                ("matmul", "int8", "static", 9e-6), ("quantize", "fp32", None, 3e-6), ("conv", "fp32", None, 3e-6),
                ("matmul", "fp32", None, 3e-6), ("movement", "fp32", None, 3e-6), ("reduce", "fp32", None, 3e-6),
                ("reduce", "int8", "static", 3e-6), ("elementwise", "fp32", None, 3e-6))]
    classes = predictor.train(rows)
    assert {"conv@int8", "matmul@int8", "matmul@int8~static"} <= set(classes)  # a static QGemm is its own class
    pred = predictor.Predictor(predictor.PredictorFile(
        schema=predictor.SCHEMA, device="d", target="onnxruntime", host="h", threads=1, created="now",
        baseline_s=0.0, roof=roof.to_json(), points=len(rows), classes=classes), Path("p.json"))
    plan = build.report.quantization.plan.model_dump(mode="json")
    static = estimate._for_plan(pred, plan).data.classes
    # a static plan's INT8 MatMul answers from the static QGemm's class, a dynamic plan's from the dynamic one's
    assert "conv@int8" in static and static["matmul@int8"] is classes["matmul@int8~static"] and "quantize" in static
    dynamic = estimate._for_plan(pred, {**plan, "method": "dynamic"}).data.classes
    assert "conv@int8" not in dynamic and dynamic["matmul@int8"] is classes["matmul@int8"]
    assert not any("~" in k for k in (*static, *dynamic))
    kernels = kern.at_precision(kern.from_record(build.structure()), plan, "fp32")
    assert any(kern.quantized_kernel(k) for k in kernels)  # the cost units' own guess, which the graph replaces
    device = estimate.device_name(None, build.report.host.model_dump(), (build.manifest.profile or {}).get("options"))
    predictor.save(pred.data.model_copy(update={"device": device}), tmp_path)
    monkeypatch.setenv("TAPEOUT_CALIBRATION", str(tmp_path))
    est = estimate.for_build(build)
    assert est.predictor and not any(kern.quantized_kernel(k) for k in est.kernels)
    assert Counter(k.name.split(" ")[0] for k in est.kernels if k.cls in ("quantize", "movement")) >= ops
    assert any(f"runs {ops['QuantizeLinear'] + ops['DequantizeLinear']} QuantizeLinear/DequantizeLinear" in n
               for n in est.notes)
    assert est.unpredicted == []  # its QGemm priced by the static INT8 MatMul's class, its uint8 MaxPool by reduce@int8
    assert [k.cls for k in est.kernels if k.precision == "int8" and k.cls not in ("conv", "matmul")] == ["reduce"]


def test_a_lone_gru_on_openvino_is_profiled_at_the_pace_of_its_timed_runs(tmp_path):
    """OpenVINO's reference GRU (35 steps) ran its first ~18 profiled runs at ~1.5x its settled pace, and the old
    pass (three warm-ups, then the mean of 20) read its node at 303 µs in a 197 µs run (1.54x); timed on their own,
    its runs take its node and ~30 µs around it. The profiled pass now keeps the timed runs' pace (ov_profile.py) and
    reads its nodes at the pass's median run: 177 µs in a 208 µs run on a quiet host. CI's other worker can slow one
    pass more than the other by more than those 30 µs (296 in 288 there, 8ad6f6b), so the bound is 1.2x the run."""
    from tapeout.commands.sweep import TARGETS
    from tapeout.estimation import sweep
    from tapeout.measurement import kernel_timer

    gru = sweep.Config("recurrent", "GRU", (("steps", 35), ("input", 98), ("hidden", 9)))
    proto, inputs = sweep.model(gru)
    request = {"target": "openvino", "options": TARGETS["openvino"].options(1), "min_s": 0.08,
               "models": [{"key": gru.key, "path": str(sweep.save_model(proto, tmp_path / "gru")), "inputs": inputs,
                           "profile": True}],
               "inserted": list(TARGETS["openvino"].inserted), "profile_runs": 20, "layer_times": True}
    (tmp_path / "request.json").write_text(json.dumps(request))
    assert kernel_timer.main(str(tmp_path / "request.json"), str(tmp_path / "result.json")) == 0
    (got,) = json.loads((tmp_path / "result.json").read_text())
    assert "error" not in got, got
    assert 0 < got["profiled"] < 1.2 * got["p50"]


@pytest.mark.slow
def test_an_openvino_sweep_times_its_kernels_on_openvino_and_prices_only_openvino_builds(tmp_path, monkeypatch):
    """`--target openvino`: the kernels are timed as OpenVINO's CPU plugin runs them for an openvino-cpu build (f32
    pinned, as its profile does: left alone it runs bf16 on this host; its Reorders around a lone conv taken out),
    an INT8 conv or MatMul quantized by NNCF as the openvino-cpu-int8 rules do, into a predictor for (device,
    openvino) that prices an OpenVINO build and never an ONNX Runtime one."""
    folder = tmp_path / "cal"
    done = run_cli("calibrate", "--sweep", "host", "--target", "openvino", "--minutes", "0.6", "--classes",
                   "conv,matmul,elementwise", "--out", folder, "--json")
    assert done.code == 0, done.err
    got = done.json()
    assert got["target"] == "openvino" and {c["class"] for c in got["classes"]} >= {"conv", "matmul"}
    points = json.loads((folder / "sweeps" / f"{got['device']}--openvino.json").read_text())["points"]
    assert {p["precision"] for p in points} <= {"fp32", "int8"}
    assert {p["cls"] for p in points if p["precision"] == "int8"} <= {"conv", "matmul"}
    from tapeout.commands.sweep import TARGETS
    from tapeout.estimation import sweep

    assert TARGETS["openvino"].options(1)["inference_precision"] == "f32"
    conv = sweep.Config("conv", "Conv", (("c", 16), ("co", 32), ("hw", 14), ("k", 3), ("stride", 1), ("groups", 1),
                                         ("relu", 0), ("precision", "int8")))
    ir = sweep.timed_model(conv, *sweep.model(conv), "openvino")
    assert isinstance(ir, sweep.IrModel) and b"FakeQuantize" in ir.xml and ir.weights
    lstm = sweep.Config("recurrent", "LSTM", (("steps", 4), ("input", 8), ("hidden", 8), ("precision", "int8")))
    assert sweep.quantization_of(lstm, "openvino") is None and sweep.quantization_of(lstm) == "dynamic"
    convs = [p for p in points if p["op"] == "Conv"]
    assert convs and any(p["inserted_s"].get("Reorder", 0) > 0 for p in convs)
    # OpenVINO's Python API sets each input per call (~5 µs here): a second input's cost is timed apart (a one-element
    # Add) and taken out of a two-input point (a residual Add+LayerNormalization), as a model's inner Adds do not pay it
    assert all(p["input_s"] > 0 for p in points) and {p["inputs"] for p in points} == {1, 2}
    # its kernels timed by its own counters (definition 5): a point is its nodes' profiled time and a dispatch, and its
    # run the rest: the one-Softmax chain's run beyond its node (`baseline_s`) and its inputs beyond the first
    sweep_file = json.loads((folder / "sweeps" / f"{got['device']}--openvino.json").read_text())
    assert sweep_file["definition"] == sweep.PROFILED_DEFINITION == 5
    assert all(p["profiled_s"] is not None and p["kernel_s"] == pytest.approx(p["profiled_s"] + p["dispatch_s"])
               for p in points)
    # a share of its run, less by about the run's cost (`baseline_s`): over the points, the median (a point's profiled
    # pass and its timed runs are two passes, and CI's other worker can slow one more than the other by more than
    # that cost: point by point, 126 of 144 held it there (bec833a), and then not every point under 100 µs (8ad6f6b))
    assert statistics.median(p["run_s"] - p["profiled_s"] - 0.5 * p["baseline_s"] for p in points) > 0
    assert json.loads((folder / predictor.file_name(got["device"], "openvino")).read_text())["input_s"] > 0
    assert not (folder / predictor.file_name(got["device"], "onnxruntime")).exists()
    # an ONNX Runtime sweep file is not resumed as an OpenVINO one
    ort = folder / "sweeps" / f"{got['device']}--onnxruntime.json"
    shutil.copy(folder / "sweeps" / f"{got['device']}--openvino.json", ort)
    again = run_cli("calibrate", "--sweep", "host", "--minutes", "0", "--out", folder)
    assert again.code == 2 and "was measured on openvino, not onnxruntime" in one_line_error(again), again.err
    ort.unlink()
    profile = tmp_path / "ov.toml"
    profile.write_text(FAST_PROFILE.replace('extends = "cpu-fp32"', 'extends = "openvino-cpu"'))
    ov_build = tmp_path / "ov"
    built = run_cli("build", SAMPLES / "digits-cnn", "--profile", profile, "--out", ov_build)
    assert built.code == 0, built.err
    monkeypatch.setenv("TAPEOUT_CALIBRATION", str(folder))
    from tapeout.builds.reader import open_build

    # estimates do not price OpenVINO builds by it yet (it over-predicts small models): scored on request
    assert not estimate.for_build(open_build(ov_build)).predictor
    assert "estimates do not price openvino builds by this predictor yet" in done.err.replace("\n", " ")
    est = estimate.for_build(open_build(ov_build), any_predictor=True)
    assert est.predictor and "openvino" in est.predictor and est.band
    assert est.predicted_s > est.lower_bound_s


def test_a_sweep_on_a_target_it_cannot_time_is_one_line():
    done = run_cli("calibrate", "--sweep", "host", "--target", "tensorrt", "--minutes", "0.1")
    assert done.code == 2 and "cannot time kernels on target 'tensorrt'" in one_line_error(done), done.err


def test_a_maxpool_a_static_graph_runs_on_8_bits_is_swept_and_priced_as_one():
    """ONNX Runtime runs a MaxPool between a Q and a DQ on uint8 with a generic kernel (resnet-m's: 998 µs, against 33
    µs in FP32): the sweep times such a MaxPool as a uint8 model, its bytes one an element, class `reduce@int8`; an
    estimate puts a static build's 8-bit pools at INT8 and leaves every other kernel as it was."""
    import numpy as np
    import onnxruntime as ort

    from tapeout.estimation import cost_units, sweep
    from tapeout.estimation.roofline import Roof

    pool = sweep.Config("reduce", "MaxPool", (("c", 16), ("hw", 9), ("precision", "int8"), ("quantization", "static")))
    proto, inputs = sweep.model(pool)
    assert inputs == [("q8", [1, 16, 9, 9])]
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    out = session.run(None, {"q8": np.full((1, 16, 9, 9), 7, np.uint8)})[0]
    assert out.dtype == np.uint8 and out.shape == (1, 16, 5, 5) and (out == 7).all()
    roof = Roof(name="test", kind="cpu", peaks={"fp32": 1e11, "int8": 4e11}, bandwidth=2e10, source="a stand-in")
    feats = sweep.features_of(proto, inputs, roof, sweep.precision_of(pool))
    assert (feats["cls"], feats["precision"]) == ("reduce", "int8")
    assert feats["bytes"] == 16 * 9 * 9 + 16 * 5 * 5  # one byte an element in and out, not a quarter of that
    assert sweep.timed_model(pool, proto, inputs) is proto  # no quantizer: the model is 8-bit already
    # a static plan's kernel: OpenVINO's sweep draws none (NNCF leaves no MaxPool on 8 bits)
    assert predictor.class_key("reduce", "int8", sweep.quantization_of(pool)) == "reduce@int8~static"
    assert sweep.quantization_of(pool, "openvino") is None

    kernels = [cost_units.Kernel("pool", "reduce", "fp32", 100, 400.0, 1, lead="pool"),
               cost_units.Kernel("mean", "reduce", "fp32", 100, 400.0, 1, lead="mean")]
    priced = runtime_graph.at_eight_bits(kernels, {"pool"})
    assert (priced[0].precision, priced[0].bytes) == ("int8", 100.0) and priced[1] == kernels[1]
    assert len(priced) == 2  # no activation quantization of its own: it reads the Q's output


def test_a_definition_2_sweep_file_loads_without_its_maxpools_whose_flops_left_out_the_window(swept, tmp_path):
    """Definition 3 counts a MaxPool's FLOPs per window element (a 2×2 pool is not a 3×3 one at the same output):
    a definition-2 file's points are kept but its MaxPools, all 3×3 stride 2 with FLOPs of one an output, which
    would teach the pool's predictor a window of 1."""
    folder, first = swept
    path = tmp_path / "sweep.json"
    data = json.loads((folder / "sweeps" / f"{first['device']}--onnxruntime.json").read_text())
    stale = {**data["points"][0], "key": "MaxPool:c=16,hw=9", "cls": "reduce", "op": "MaxPool",
             "config": {"c": 16, "hw": 9}}
    path.write_text(json.dumps({**data, "definition": 2, "points": [*data["points"], stale]}))
    from tapeout.estimation import sweep

    found = sweep.load(path)
    assert found.definition == sweep.DEFINITION == 4
    assert [p.key for p in found.points] == [p["key"] for p in data["points"]]


def test_a_definition_3_sweep_file_loads_without_its_uint8_maxpools_timed_on_uniform_bytes(swept, tmp_path):
    """Definition 4 times a uint8 MaxPool on quantized feature maps: a definition-3 file's uint8 MaxPools (uniform
    bytes, a third to a half slower than a CNN's own maps) are left out, its FP32 MaxPools and every other point
    kept."""
    folder, first = swept
    path = tmp_path / "sweep.json"
    data = json.loads((folder / "sweeps" / f"{first['device']}--onnxruntime.json").read_text())
    pool = {**data["points"][0], "key": "MaxPool:c=16,hw=9,k=3,stride=2", "cls": "reduce", "op": "MaxPool",
            "config": {"c": 16, "hw": 9, "k": 3, "stride": 2}}
    stale = {**pool, "key": pool["key"] + ",precision=int8", "precision": "int8", "quantization": "static"}
    path.write_text(json.dumps({**data, "definition": 3, "points": [*data["points"], pool, stale]}))
    from tapeout.estimation import sweep

    found = sweep.load(path)
    assert found.definition == sweep.DEFINITION
    assert [p.key for p in found.points] == [p["key"] for p in data["points"]] + [pool["key"]]


def test_a_sweep_file_priced_by_an_earlier_tapeout_is_priced_again_before_it_trains(swept, tmp_path):
    """A predictor reads a point's roofline time as a feature, and an estimate prices a build's kernels by this
    code: a file whose points an earlier tapeout priced otherwise (pricing 1, before a cache probe's working set
    counted its copy's two arrays) gets every roof_s priced again from its configurations, once, and is kept so."""
    from tapeout.estimation import sweep_pricing as sweep

    folder, first = swept
    name = f"{first['device']}--onnxruntime.json"
    data = json.loads((folder / "sweeps" / name).read_text())
    assert data["pricing"] == sweep.PRICING  # a new file is priced by this code
    stale = [{**p, "roof_s": p["roof_s"] * 10} for p in data["points"]]
    (tmp_path / "sweeps").mkdir()
    old = {k: v for k, v in data.items() if k != "pricing"}  # absent in a file from before: the first pricing
    (tmp_path / "sweeps" / name).write_text(json.dumps({**old, "points": stale}))
    done = run_cli("calibrate", "--sweep", "host", "--minutes", "0", "--out", tmp_path)
    assert done.code == 0, done.err
    assert f"pricing the {len(stale)} points measured before again" in done.err
    assert f"{len(stale)} points' roofline times moved" in done.err
    again = json.loads((tmp_path / "sweeps" / name).read_text())
    assert again["pricing"] == sweep.PRICING
    for before, after in zip(data["points"], again["points"], strict=True):
        assert after["roof_s"] == pytest.approx(before["roof_s"], rel=1e-6)
    # once: the next training reads the file as it is
    assert "pricing the" not in run_cli("calibrate", "--sweep", "host", "--minutes", "0", "--out", tmp_path).err


def test_a_uint8_image_is_timed_as_quantized_feature_maps():
    """ONNX Runtime's 8-bit MaxPool follows its data (uniform bytes ran a third slower than a CNN's own maps): an
    image-shaped uint8 input is a quantized conv's output, its channels anywhere from all 0 to none, neighbours
    alike; any other uint8 input stays uniform bytes."""
    import numpy as np

    from tapeout.measurement import kernel_timer

    maps = kernel_timer.feature_maps([1, 64, 32, 32], np.random.default_rng(0))
    assert maps.shape == (1, 64, 32, 32) and maps.dtype == np.uint8 and maps.max() == 255
    zeros = (maps[0] == 0).reshape(64, -1).mean(axis=1)
    assert 0.3 < zeros.mean() < 0.7 and zeros.min() < 0.1 and zeros.max() > 0.9  # channels differ, as a CNN's do
    live = maps[0][zeros < 0.1].astype(float)  # within a live channel, a pixel is like its neighbour (a 3×3 window)
    assert np.corrcoef(live[:, :, 1:].ravel(), live[:, :, :-1].ravel())[0, 1] > 0.3
    # what the timing process feeds a swept uint8 MaxPool ([1, C, H, W], `sweep.model`): those maps, not uniform bytes
    image = type("Spec", (), {"dtype": "uint8", "shape": [1, 64, 32, 32]})
    fed = kernel_timer._feed(image, {}, np.random.default_rng(0))
    assert np.array_equal(fed, maps) and (fed == 0).mean() > 0.3  # uniform bytes: 1 in 256 is 0
    spec = type("Spec", (), {"dtype": "uint8", "shape": [1000]})
    flat = kernel_timer._feed(spec, {}, np.random.default_rng(0))
    assert flat.dtype == np.uint8 and abs(float(flat.mean()) - 127.5) < 10


def test_a_pools_flops_count_its_window_and_the_sweep_draws_windows():
    """ONNX Runtime's generic 8-bit MaxPool costs outputs × window: a 2×2 pool priced as a 3×3 one read 263 µs for
    ~80 (cnn-lstm-m cpu-int8). Its FLOPs count a comparison per window element, and the sweep draws 2×2 and 3×3
    windows at strides 1 and 2, so the predictor sees what the window costs."""
    import random

    from tapeout.estimation import sweep
    from tapeout.estimation.roofline import Roof

    roof = Roof(name="test", kind="cpu", peaks={"fp32": 1e11}, bandwidth=2e10, source="a stand-in")
    for k, stride in ((2, 2), (3, 2), (3, 1)):
        proto, inputs = sweep.model(sweep.Config("reduce", "MaxPool", (("c", 8), ("hw", 12), ("k", k),
                                                                       ("stride", stride))))
        side = (12 + (2 if k == 3 else 0) - k) // stride + 1
        assert sweep.features_of(proto, inputs, roof)["flops"] == 8 * side * side * k * k
    drawn = {(c["k"], c["stride"]) for c in (sweep_draws.sample("reduce", random.Random(i)) for i in range(400))
             if c.op == "MaxPool"}
    assert drawn == {(2, 1), (2, 2), (3, 1), (3, 2)}
    # a uint8 pool's time follows its data: one reduce point in seven is one (a 30-minute sweep drew ~100 at one in
    # twenty, too few to price a CNN's within ±15 %)
    uint8 = sum(c.op == "MaxPool" and dict(c.sizes).get("precision") == "int8"
                for c in (sweep_draws.sample("reduce", random.Random(i)) for i in range(1400)))
    assert 150 <= uint8 <= 250


def test_the_sweep_draws_a_heads_few_output_channels():
    """A head's conv (unet-m's 128 → 4 noise channels) runs blocked with its outputs padded to a block: 0.84 ms here,
    the time of 16 outputs, against 0.35 predicted where the sweep drew 8 outputs and up (no fill under a half). It
    now draws 1-6 outputs too, dense and blocked alike, so the predictor measures fills under a half."""
    import random

    from tapeout.estimation import predictor

    convs = [c for c in (sweep_draws.sample("conv", random.Random(i)) for i in range(600)) if c.op == "Conv"]
    few = [dict(c.sizes) for c in convs if dict(c.sizes)["co"] < 8]
    assert len(few) >= 20 and {s["co"] for s in few} == {1, 2, 3, 4, 6}
    assert all(s["groups"] == 1 for s in few)   # dense: a depthwise conv's outputs are its inputs
    shape = {"per_group": 128, "out_channels": 4, "positions": 64 * 64, "area": 9, "groups": 1}
    filled = predictor.with_derived(shape, predictor.SHAPE_FEATURES["conv"])
    if filled.get("layout") == 2:   # blocked on this CPU: 4 of a block of 8 (AVX2) or 16 (AVX-512) outputs are its own
        assert filled["fill"] < 50


def test_a_pool_is_priced_in_the_layout_onnx_runtime_runs_it(tmp_path):
    """After a blocked conv ONNX Runtime runs a MaxPool blocked too (NCHWc: cnn-lstm-m's FP32 pools ~3.5 µs each,
    where plain ones of their size ran ~15); alone, one whose channels it blocks runs between a ReorderInput and a
    ReorderOutput, which the sweep takes out as a conv's. The cost units keep a pool's channels, the runtime is asked
    for its layout (`pool_layout`, a reduce kernel's shape feature), and every other reduce kernel is plain."""
    import random

    import onnx

    from tapeout.estimation import runtime_kernels, sweep
    from tapeout.estimation.roofline import Roof

    roof = Roof(name="test", kind="cpu", peaks={"fp32": 1e11}, bandwidth=2e10, source="a stand-in")
    layouts = {}
    for c in (20, 64):
        proto, inputs = sweep.model(sweep.Config("reduce", "MaxPool", (("c", c), ("hw", 12), ("k", 2), ("stride", 2))))
        feats = sweep.features_of(proto, inputs, roof)
        onnx.save(proto, str(tmp_path / f"pool{c}.onnx"))
        ran = runtime_kernels.optimized_graph(tmp_path / f"pool{c}.onnx")
        blocked = any(n.domain == runtime_kernels.NCHWC_DOMAIN and n.op_type == "MaxPool" for n in ran.node)
        assert feats["shape"]["channels"] == c
        layouts[c] = feats["shape"]["pool_layout"]
        assert layouts[c] == (runtime_kernels.BLOCKED if blocked else runtime_kernels.PLAIN)
    norm, _ = sweep.model(sweep.Config("reduce", "LayerNormalization", (("rows", 4), ("width", 64))))
    assert sweep.features_of(norm, [("x", [4, 64])], roof)["shape"] == {"pool_layout": runtime_kernels.PLAIN,
                                                                        "masked": 1}  # and unmasked: not a Softmax
    assert predictor.features(100, 400, 1e-8, 1, 1, "reduce", {})[-1] == 0.0  # log 1: plain, not missing
    drawn = [c["c"] for c in (sweep_draws.sample("reduce", random.Random(i)) for i in range(400)) if c.op == "MaxPool"]
    assert 0.3 < sum(c % 16 == 0 for c in drawn) / len(drawn) < 0.7  # half of them counts ONNX Runtime blocks


def test_a_dynamic_int8_builds_nodes_are_counted_from_the_graph_onnx_runtime_optimizes(tmp_path):
    """A dynamically quantized model's artifact is not the graph ONNX Runtime runs: where three MatMuls read one
    activation (attention's q, k and v), it quantizes it once (DynamicQuantizeLinear) and runs each MatMul as a
    MatMulIntegerToFloat, four nodes for what the cost units price as three kernels with their quantization inside.
    The nodes are counted from the optimized graph, and the extra ones each priced as a dispatch."""
    import math

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from tapeout.estimation import cost_units as kern
    from tapeout.estimation import runtime_kernels
    from tapeout.estimation.roofline import Roof

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), f"w{i}") for i in range(3)]
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"], name=f"mm{i}") for i in range(3)]
    graph = helper.make_graph(nodes, "qkv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [8, 64]) for i in range(3)],
                              initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "float.onnx")
    quantize_dynamic(tmp_path / "float.onnx", tmp_path / "model.onnx", weight_type=QuantType.QInt8)
    artifact = tmp_path / "model.onnx"
    ran = runtime_kernels.optimized_graph(artifact)
    ops = Counter(n.op_type for n in ran.node)
    assert ops["DynamicQuantizeLinear"] == 1 and ops["MatMulIntegerToFloat"] == 3

    plan = {"method": "dynamic", "groups": [{"nodes": [f"mm{i}"], "precision": "int8"} for i in range(3)]}
    assert runtime_graph.dynamic_quantized("onnxruntime", plan, artifact.name)
    assert not runtime_graph.dynamic_quantized("onnxruntime", {**plan, "method": "static"}, artifact.name)
    assert not runtime_graph.dynamic_quantized("openvino", plan, artifact.name)
    kernels = [kern.Kernel(f"mm{i}", "matmul", "fp32", 2 * 8 * 64 * 64, 4.0 * (8 * 64 * 2 + 64 * 64), 1, lead=f"mm{i}",
                           quantized_input=8 * 64) for i in range(3)]
    quantized = kern.at_precision(kernels, plan, "fp32")
    priced, executed, inserted = runtime_graph.runtime_graph("onnxruntime", "int8", plan, artifact, None, quantized, {})
    assert executed == runtime_kernels.node_count(ran) == 4 and inserted == [] and priced == quantized
    assert sum(k.cls == "quantize" for k in quantized) == 3  # each priced inside its DynamicQuantizeMatMul's time

    # priced: the three kernels (their quantization inside), and the one node beyond them as a dispatch
    def flat(seconds: float) -> predictor.ClassModel:  # a one-leaf model: every kernel of the class `seconds`
        return predictor.ClassModel(init=math.log(seconds), rate=1.0, band=(-0.1, 0.1), points=20,
                                    held_out_within_15=1.0, trees=[predictor.Tree(feature=[-2], threshold=[-2.0],
                                                                                  left=[-1], right=[-1], value=[0.0])])
    roof = Roof(name="test", kind="cpu", peaks={"fp32": 1e11, "int8": 4e11}, bandwidth=2e10, source="a stand-in")
    pred = predictor.Predictor(predictor.PredictorFile(
        schema=predictor.SCHEMA, device="d", target="onnxruntime", host="h", threads=1, created="now", baseline_s=0.0,
        roof=roof.to_json(), points=40, classes={"matmul@int8": flat(2e-6), "movement": flat(3e-7)}), tmp_path)
    est = estimate.estimate(priced, roof, "onnxruntime", "int8", None, pred, executed)
    assert est.predicted_s == pytest.approx(3 * 2e-6 + 1 * 3e-7)
    assert any("runs 4 nodes for the model's 3 kernels: the 1 more" in n for n in est.notes)
