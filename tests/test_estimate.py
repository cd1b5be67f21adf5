"""The estimator: kernels, roofline bound, calibration fit and its held-out band, estimated verdicts.

Real builds of digits-cnn on this host's CPU (ONNX Runtime, measured with the per-op profiler) are
the calibration data; the estimated-verdict path is exercised end to end on a TensorRT build (its
engine is compiled on a device, so here it is estimated) for an L4 spec.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import SAMPLES, assert_within_bounds, one_line_error, reseal, run_cli
from tapeout.builds.reader import open_build
from tapeout.core.errors import BadInput
from tapeout.core.schemas import Budgets
from tapeout.core.verdict import Verdict
from tapeout.estimation import cost_units, estimate, fit, generation, roofline
from tapeout.graph.analyze import analyze_view
from tapeout.graph.view import GraphView


def _conv_model(path):
    """Conv+Relu (one fusion group), then a shape subgraph (Shape→Gather→Concat, folded) feeding a Reshape."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 3, 3, 3], np.random.default_rng(0).standard_normal(216).tolist())
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["n"], name="take_batch", axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsq"),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], name="cat", axis=0),
        helper.make_node("Reshape", ["r", "target"], ["y"], name="flatten"),
    ]
    inits = [
        w,
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        helper.make_tensor("axes", TensorProto.INT64, [1], [0]),
        helper.make_tensor("minus_one", TensorProto.INT64, [1], [-1]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, path)
    return path


def _h100() -> roofline.Roof:
    from tapeout.core.config import load_device

    return roofline.from_spec(load_device("h100-sxm"))


def test_kernels_count_fusion_groups_once_and_never_folded_shape_arithmetic(tmp_path):
    view = GraphView.load(_conv_model(tmp_path / "m.onnx"))
    analysis = analyze_view(view)
    ks = cost_units.of(view, analysis, None, "fp32")
    names = [k.name for k in ks]
    assert len(ks) == 2, names  # conv+relu as one, the Reshape; the shape chain folded
    conv = ks[0]
    assert conv.cls == "conv" and conv.nodes == 2
    assert conv.flops == 2 * 8 * 16 * 16 * 27 + 8 * 16 * 16  # the conv's MACs x2, plus the fused Relu
    assert ks[1].cls == "movement"
    # the plan's precision reaches the kernel: bytes at int8 are a quarter, and a quantize kernel is added
    plan = {"groups": [{"nodes": [n for g in analysis.groups for n in g.nodes], "precision": "int8"}]}
    q = cost_units.of(view, analysis, plan, "fp32")
    assert q[0].precision == "int8" and math.isclose(q[0].bytes, conv.bytes / 4)
    assert [k.cls for k in q].count("quantize") == 1


def test_a_residual_add_and_its_layer_norm_are_one_kernel_and_a_reshape_moves_nothing(tmp_path):
    """x + h -> LayerNormalization -> Reshape, with the sum also used by the next residual (the Mul): ONNX Runtime
    runs the Add and the norm apart (a pre-norm block), two kernels. With nothing else reading the sum (a post-norm
    block) they are one (SkipLayerNormalization): the norm reads x and h and writes its output, never the sum. The
    Reshape aliases."""
    d = 64
    nodes = [
        helper.make_node("Add", ["x", "h"], ["s"], name="residual"),
        helper.make_node("LayerNormalization", ["s", "g", "b"], ["n"], name="norm", axis=-1),
        helper.make_node("Reshape", ["n", "shape"], ["y"], name="view"),
        helper.make_node("Mul", ["s", "g"], ["z"], name="next"),
    ]
    inits = [
        helper.make_tensor("g", TensorProto.FLOAT, [d], [1.0] * d),
        helper.make_tensor("b", TensorProto.FLOAT, [d], [0.0] * d),
        helper.make_tensor("shape", TensorProto.INT64, [2], [8, 2 * d]),
    ]
    x, h = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [16, d]) for n in ("x", "h"))
    graph = helper.make_graph(
        nodes,
        "g",
        [x, h],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, tmp_path / "m.onnx")
    view = GraphView.load(tmp_path / "m.onnx")
    ks = {k.name: k for k in cost_units.of(view, analyze_view(view), None, "fp32")}
    assert sorted(ks) == ["next", "norm", "residual", "view"]
    act = 16 * d * 4
    norm = ks["norm"]
    assert norm.cls == "reduce" and norm.nodes == 1 and ks["residual"].cls == "elementwise"
    assert norm.bytes == act + 2 * d * 4 + act and ks["residual"].bytes == 3 * act
    assert ks["view"].bytes == 0 and ks["view"].cls == "movement"
    # a sum nothing else reads is never written
    model.graph.node.remove(model.graph.node[3])
    del model.graph.output[1]
    onnx.save(model, tmp_path / "m2.onnx")
    view = GraphView.load(tmp_path / "m2.onnx")
    only = {k.name: k for k in cost_units.of(view, analyze_view(view), None, "fp32")}
    assert sorted(only) == ["norm", "view"]
    assert only["norm"].cls == "reduce" and only["norm"].nodes == 2 and only["norm"].launches == 1
    assert only["norm"].bytes == 2 * act + 2 * d * 4 + act  # x, h, its weights; the output


def _cost_units(path, graph) -> list:
    """The cost units of a graph saved at `path` (opset 17), as a build reads them."""
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 10
    onnx.save(proto, path)
    view = GraphView.load(path)
    return cost_units.of(view, analyze_view(view), None, "fp32")


def test_a_tanh_gelu_written_out_is_one_kernel_as_onnx_runtime_fuses_it(tmp_path):
    """GPT-2's GELU, 0.5 · x · (1 + Tanh(√(2/π) · (x + 0.044715 · x³))), eight nodes, is one elementwise kernel
    (ONNX Runtime's FastGelu): x read and the result written once. Where a part is read from outside, it is not."""
    import numpy as np

    rows, d = 16, 64
    act = rows * d * 4

    def model(leak: bool):
        consts = {"three": 3.0, "c": 0.044715, "k": math.sqrt(2 / math.pi), "one": 1.0, "half": 0.5}
        nodes = [
            helper.make_node("Mul", ["x", "half"], ["halved"], name="half"),
            helper.make_node("Pow", ["x", "three"], ["cube"], name="pow"),
            helper.make_node("Mul", ["cube", "c"], ["cubic"], name="cubic"),
            helper.make_node("Add", ["x", "cubic"], ["inner"], name="inner"),
            helper.make_node("Mul", ["inner", "k"], ["scaled"], name="scaled"),
            helper.make_node("Tanh", ["scaled"], ["t"], name="tanh"),
            helper.make_node("Add", ["t", "one"], ["t1"], name="one"),
            helper.make_node("Mul", ["halved", "t1"], ["y"], name="gelu"),
        ]
        outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
        if leak:
            nodes.append(helper.make_node("Neg", ["inner"], ["z"], name="leak"))
            outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
        inits = [onnx.numpy_helper.from_array(np.array(v, np.float32), n) for n, v in consts.items()]
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, d])], outputs, inits
        )
        return _cost_units(tmp_path / f"gelu{int(leak)}.onnx", graph)

    (gelu,) = model(leak=False)
    assert gelu.cls == "elementwise" and gelu.nodes == 8 and gelu.bytes == 2 * act
    assert gelu.flops == 8 * rows * d
    assert len(model(leak=True)) == 9  # the inner sum is read by another node: eight kernels and the Neg


def test_a_scalar_scale_on_a_matmul_runs_inside_it(tmp_path):
    """Attention's 1/√d by a scalar constant, on the scores or on q where only the MatMul reads it, is part of the
    MatMul's kernel (ONNX Runtime's FusedMatMul alpha), not a pass of its own; on scores something else also reads,
    it stays a kernel."""
    import numpy as np

    s, d = 32, 16

    def kernels(where: str):
        scale = onnx.numpy_helper.from_array(np.array(0.25, np.float32), "scale")
        if where == "q":
            nodes = [
                helper.make_node("Mul", ["q", "scale"], ["qs"], name="scale_q"),
                helper.make_node("MatMul", ["qs", "k"], ["scores"], name="qk"),
            ]
            last = "scores"
        else:
            nodes = [
                helper.make_node("MatMul", ["q", "k"], ["raw"], name="qk"),
                helper.make_node("Div" if where == "div" else "Mul", ["raw", "scale"], ["scores"], name="scaled"),
            ]
            last = "scores"
        nodes.append(helper.make_node("Softmax", [last], ["y"], name="softmax", axis=-1))
        outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
        if where == "leak":
            outputs.append(helper.make_tensor_value_info("raw", TensorProto.FLOAT, None))
        graph = helper.make_graph(
            nodes,
            "g",
            [
                helper.make_tensor_value_info("q", TensorProto.FLOAT, [s, d]),
                helper.make_tensor_value_info("k", TensorProto.FLOAT, [d, s]),
            ],
            outputs,
            [scale],
        )
        return {k.name: k for k in _cost_units(tmp_path / f"{where}.onnx", graph)}

    for where in ("mul", "div", "q"):
        found = kernels(where)
        assert sorted(found) == ["qk", "softmax"], (where, sorted(found))
        assert found["qk"].cls == "matmul" and found["qk"].nodes == 2
        assert found["qk"].flops == 2 * s * s * d + (s * d if where == "q" else s * s)
    assert sorted(kernels("leak")) == ["qk", "scaled", "softmax"]  # the raw scores are an output too


def test_an_rms_norm_and_a_silu_are_one_kernel_each_as_the_runtimes_fuse_them(tmp_path):
    """Pow → ReduceMean → Add → Sqrt → Div → Mul(weight) (an RMSNorm after the `rms-norm-division` pass) is one
    reduce kernel, as ONNX Runtime's SimplifiedLayerNormalization and OpenVINO's RMS run it: x read and the result
    written once, the weight read. x · Sigmoid(x) is one kernel (QuickGelu, Swish). The Reciprocal form, which ONNX
    Runtime does not fuse, stays six kernels."""
    d, rows = 64, 16
    act = rows * d * 4

    def model(divide: bool):
        nodes = [
            helper.make_node("Pow", ["x", "two"], ["sq"], name="pow"),
            helper.make_node("ReduceMean", ["sq"], ["ms"], name="mean", axes=[-1], keepdims=1),
            helper.make_node("Add", ["ms", "eps"], ["var"], name="eps_add"),
            helper.make_node("Sqrt", ["var"], ["rms"], name="sqrt"),
        ]
        if divide:
            nodes.append(helper.make_node("Div", ["x", "rms"], ["normed"], name="divide"))
        else:
            nodes += [
                helper.make_node("Reciprocal", ["rms"], ["inv"], name="reciprocal"),
                helper.make_node("Mul", ["x", "inv"], ["normed"], name="times_inv"),
            ]
        nodes += [
            helper.make_node("Mul", ["normed", "g"], ["n"], name="scale"),
            helper.make_node("Sigmoid", ["n"], ["sig"], name="sigmoid"),
            helper.make_node("Mul", ["n", "sig"], ["y"], name="silu"),
        ]
        inits = [
            helper.make_tensor("g", TensorProto.FLOAT, [d], [1.0] * d),
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
            helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-6]),
        ]
        graph = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, d])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            inits,
        )
        return _cost_units(tmp_path / f"{divide}.onnx", graph)

    fused = {k.name: k for k in model(divide=True)}
    assert sorted(fused) == ["scale", "silu"]
    assert fused["scale"].cls == "reduce" and fused["scale"].nodes == 6 and fused["scale"].bytes == act + d * 4 + act
    assert fused["silu"].nodes == 2 and fused["silu"].bytes == 2 * act
    written_out = model(divide=False)  # the form ORT leaves as it is
    assert len(written_out) == 8 and "reciprocal" in {k.name for k in written_out}  # the SiLU still one


def test_a_recurrent_cell_reads_its_recurrent_weights_again_every_step_from_the_cache_they_fit(tmp_path):
    import graphs

    onnx.save(graphs.recurrent(hidden=32, seq=10), tmp_path / "rnn.onnx")
    view = GraphView.load(tmp_path / "rnn.onnx")
    [cell] = [k for k in cost_units.of(view, analyze_view(view), None, "fp32") if k.cls == "recurrent"]
    assert cell.launches == 10 and cell.reread == 4 * 32 * 32 * 4  # R, FP32; W is read once
    assert cost_units.at_precision([cell], None, "int8")[0].reread == 4 * 32 * 32  # at the kernel's precision
    cached = roofline.Roof("host", "cpu", {"fp32": 1e15}, 20e9, "test", cache=((8_192, 80e9), (1 << 20, 60e9)))
    _, memory = cost_units.roof_times(cell, cached)
    assert math.isclose(memory, cell.bytes / cached.bandwidth_at(cell.bytes) + 9 * cell.reread / 80e9)
    # a working set moves at the rate of the largest footprint measured that it does not exceed (the smallest's
    # under it): between two levels at the faster, so the bound stays a bound
    assert cached.bandwidth_at(cell.reread) == cached.bandwidth_at(100) == cached.bandwidth_at(64 << 10) == 80e9
    assert cached.bandwidth_at(1 << 20) == cached.bandwidth_at(1 << 30) == 60e9
    # a device spec measures no cache: the re-reads are left out of its bound, never guessed at
    assert cost_units.roof_times(cell, _h100())[1] == cell.bytes / 3350e9
    est = estimate.estimate([cell], _h100(), "tensorrt", "fp32", None)
    assert any("re-read" in note for note in est.notes)


def test_roofline_bound_is_the_sum_of_each_kernels_slower_roof(tmp_path):
    view = GraphView.load(_conv_model(tmp_path / "m.onnx"))
    ks = cost_units.of(view, analyze_view(view), None, "fp16")
    roof = _h100()
    est = estimate.estimate(ks, roof, "tensorrt", "fp16", None)
    expected = sum(max(k.flops / 989e12, k.bytes / 3350e9) for k in ks)
    assert math.isclose(est.lower_bound_s, expected)
    assert est.predicted_s is None and est.quantile_ms("p50") is None
    assert "no calibration" in est.line()


def _record(
    model: str,
    terms: dict[str, tuple[float, float]],
    roof: dict[str, float],
    counts: dict[str, int],
    fixed: float,
    per_kernel: float,
    precision: str = "fp32",
    share: float = 0.0,
) -> fit.Record:
    """A build as the fit models one: per class (s per kernel) x kernels + multiple x roofline; outside
    the ops, fixed + per kernel + a share of the time in ops."""
    measured = {cls: terms[cls][0] * counts[cls] + terms[cls][1] * roof[cls] for cls in roof}
    p50 = fixed + per_kernel * sum(counts.values()) + (1 + share) * sum(measured.values())
    return fit.Record(
        model=model,
        precision=precision,
        source=f"/builds/{model}",
        created="",
        p50_s=p50,
        tails={"p90": 1.2, "p99": 1.5},
        roof_s={f"{k}@{precision}": v for k, v in roof.items()},
        measured_s=measured,
        kernels=sum(counts.values()),
        counts=counts,
    )


TERMS = {"matmul": (3e-6, 2.0), "elementwise": (1e-6, 10.0)}


def test_fit_recovers_known_per_kernel_costs_multiples_and_overheads():
    records = [
        _record(
            f"m{i}",
            TERMS,
            {"matmul": 1e-3 * (i + 1) ** 2, "elementwise": 2e-4 * (3 - i)},
            {"matmul": 4 + 7 * i, "elementwise": 9 - 2 * i},
            5e-6,
            2e-6,
            share=0.08,
        )
        for i in range(4)
    ]
    f = fit.fit(records)
    for cls, (per_kernel, multiple) in TERMS.items():
        got = f.terms(cls, "fp32")
        assert math.isclose(got[0], per_kernel, rel_tol=1e-6, abs_tol=1e-12) and math.isclose(got[1], multiple)
    assert math.isclose(f.fixed_s, 5e-6, rel_tol=1e-6) and math.isclose(f.per_kernel_s, 2e-6, rel_tol=1e-6)
    assert math.isclose(f.outside_share, 0.08, rel_tol=1e-6)
    assert f.tails == {"p90": 1.2, "p99": 1.5}
    assert math.isclose(f.efficiency()["matmul"], 0.5)
    for r in records:
        assert math.isclose(f.predict(r.roof_s, r.counts, "fp32", r.kernels), r.p50_s, rel_tol=1e-9)


def test_a_recurrent_class_never_fits_under_its_cache_priced_roof():
    """Small LSTMs whose roof per step is a fixed share of their time per step: per-step cost alone fits them
    as well as the roof does, and without the floor it won, pricing a big LSTM at its dispatch cost."""
    # µs per step measured, and at the roof, as this host's three small LSTMs had them
    small = [
        _record(
            f"lstm{i}", {"recurrent": (step * 1e-6, 0.0)}, {"recurrent": roof * 1e-6 * n}, {"recurrent": n}, 1e-6, 0.0
        )
        for i, (n, step, roof) in enumerate(((16, 1.25, 0.81), (128, 1.19, 0.84), (49, 0.96, 0.9)))
    ]
    f = fit.fit(small)
    _, multiple = f.terms("recurrent", "fp32")
    assert multiple >= 1.0
    big_roof = 12e-6 * 100  # 100 steps, 12 µs each at the roof
    assert f.predict({"recurrent@fp32": big_roof}, {"recurrent": 100}, "fp32", 1) >= big_roof


def test_the_time_outside_the_ops_is_per_kernel_not_per_time_step():
    """A runtime dispatches an LSTM once however many steps it runs: the fit's part per kernel of the time outside
    the ops counts kernels (an OpenVINO toy LSTM of 3 kernels and 49 steps had been priced 49 dispatches)."""
    records = []
    for i, steps in enumerate((16, 49, 128, 7)):
        r = _record(
            f"lstm{i}",
            {"recurrent": (1e-6, 1.0), "matmul": (2e-6, 1.0)},
            {"recurrent": 1e-6 * steps, "matmul": 1e-6 * (i + 1)},
            {"recurrent": steps, "matmul": 2 + i},
            0.0,
            0.0,
        )
        kernels = 1 + 2 + i
        records.append(r.model_copy(update={"p50_s": r.p50_s + 5e-6 + 3e-7 * kernels, "kernels": kernels}))
    f = fit.fit(records)
    assert math.isclose(f.fixed_s, 5e-6, rel_tol=1e-6) and math.isclose(f.per_kernel_s, 3e-7, rel_tol=1e-6)
    for r in records:
        assert math.isclose(f.predict(r.roof_s, r.counts, "fp32", r.kernels), r.p50_s, rel_tol=1e-9)
    assert math.isclose(f.kernel_s("recurrent", "fp32", 49e-6, 49), 3e-7 + 49e-6 + 49e-6, rel_tol=1e-6)


def test_the_band_comes_only_from_models_left_out():
    terms = {"matmul": (0.0, 2.0)}
    records = [_record(f"m{i}", terms, {"matmul": 1e-3 * (i + 1)}, {"matmul": 10}, 0.0, 0.0) for i in range(3)]
    odd = _record("odd", {"matmul": (0.0, 4.0)}, {"matmul": 2e-3}, {"matmul": 10}, 0.0, 0.0)  # half as efficient
    held = fit.held_out([*records, odd])
    error = {h["model"]: h["error"] for h in held}
    # fitted on the other three, the odd model is predicted at twice its speed: -50 %; in-sample it would be less
    assert math.isclose(error["odd"], -0.5, rel_tol=1e-6)
    assert all(e > 0 for m, e in error.items() if m != "odd")  # the odd one drags the others' fit slower
    cal = fit.Calibration("dev", "t", "gpu", {}, [*records, odd], fit.fit([*records, odd]), held)
    assert cal.band == (min(error.values()), max(error.values()))
    assert cal.within(0.15)[1] == 4
    assert fit.Calibration.from_json(json.loads(json.dumps(cal.to_json())), "x").fit == cal.fit


def _estimate_with_band(bound_ms: float, predicted_ms: float, band) -> estimate.Estimate:
    est = estimate.Estimate(
        "l4",
        "tensorrt",
        "fp16",
        _h100(),
        [],
        bound_ms / 1e3,
        predicted_ms / 1e3,
        band,
        {"p90": 1.5, "p99": 2.0},
        "calibration x",
    )
    return est


def test_estimated_verdicts_follow_the_band_and_the_bound():
    est = _estimate_with_band(0.5, 2.0, (-0.2, 0.25))  # measured in [1.6, 2.5] ms
    judge = lambda **b: estimate.judge(Budgets(**b), est, "not here")[0]  # noqa: E731
    assert judge(latency_p50_ms=3.0).verdict is Verdict.ESTIMATED_PASS
    assert judge(latency_p50_ms=1.5).verdict is Verdict.ESTIMATED_FAIL
    straddle = judge(latency_p50_ms=2.2)
    assert straddle.verdict is Verdict.ESTIMATED_PASS and "straddles" in straddle.reason
    assert judge(latency_p90_ms=2.8).verdict is Verdict.ESTIMATED_FAIL  # p90 = 1.5 x p50 = 3 ms
    assert judge(latency_p50_ms=0.4).verdict is Verdict.ESTIMATED_FAIL  # under even the roofline bound
    bare = estimate.Estimate("l4", "tensorrt", "fp16", _h100(), [], 0.5e-3)
    unmeasured = estimate.judge(Budgets(latency_p50_ms=3.0), bare, "not here")[0]
    assert unmeasured.verdict is Verdict.UNMEASURED and "tapeout calibrate" in unmeasured.reason
    assert estimate.judge(Budgets(latency_p50_ms=0.1), bare, "not here")[0].verdict is Verdict.ESTIMATED_FAIL


def test_a_build_reports_its_estimate_and_bottlenecks(digits_build, digits_int8_build):
    report = json.loads((digits_build / "report.json").read_text())
    est, b = report["estimate"], report["bottlenecks"]
    assert est["device"].startswith("host-") and est["lower_bound_ms"] > 0
    assert est["measured_p50_ms"] == report["measurement"]["latency_ms"]["quantiles"]["p50"]["point"]
    assert est["kernels"] == 6 and {c["class"] for c in est["by_class"]} >= {"conv", "matmul"}
    assert b["ops"] and all(o["bound"] in ("compute", "memory", "overhead", "unknown") for o in b["ops"])
    conv = next(o for o in b["ops"] if o["op_type"] == "Conv")
    assert conv["flops"] and conv["achieved_gflops"] > 0 and conv["roof_share"] > 0
    assert math.isclose(sum(o["share"] for o in b["ops"]), 1.0, rel_tol=1e-6)
    md = (digits_build / "report.md").read_text()
    assert "## Bottlenecks" in md and "## Estimate for host-" in md
    assert "a lower bound, which no measured run should beat" in md  # uncalibrated: said once, in the report
    for build in (digits_build, digits_int8_build):
        assert_within_bounds(build)


def test_calibrate_then_estimate_predicts_with_a_band(digits_build, digits_int8_build, tmp_path):
    out = tmp_path / "cal"
    result = run_cli("calibrate", digits_build, digits_int8_build, "--out", out, "--json")
    assert result.code == 0, result.err
    [cal] = result.json()
    assert cal["target"] == "onnxruntime" and cal["device"].startswith("host-")
    assert cal["band"] is None  # one model: nothing can be held out, so no band is claimed
    stored = fit.load(out / fit.file_name(cal["device"], "onnxruntime"))
    assert len(stored.records) == 2 and stored.fit.efficiency
    got = run_cli("estimate", digits_build, "--json", env={"TAPEOUT_CALIBRATION": str(out)})
    assert got.code == 0, got.err
    data = got.json()
    assert data["method"] == estimate.METHOD_CALIBRATED and data["predicted_ms"]["p50"]["point"] > 0
    # the calibration's folder is the only source: without it, the bound alone
    bare = run_cli("estimate", digits_build, "--json", env={"TAPEOUT_CALIBRATION": str(tmp_path / "none")})
    assert bare.json()["predicted_ms"] is None


def test_the_host_cpu_at_fewer_threads_is_its_own_device():
    host = {"cpu": "Some CPU", "cpu_flags": ["avx2"], "cpu_affinity": 4, "physical_cores": 4}
    plain = roofline.host_name(host)
    assert estimate.device_name(None, host, {"threads": 0}) == plain  # 0: one per core, the host as is
    assert estimate.device_name(None, host, {"threads": 4}) == plain
    assert estimate.device_name(None, host, {"threads": 8}) == plain  # more threads than cores: still all cores
    assert estimate.device_name(None, host, {"threads": 1}) == f"{plain}-1t"
    assert estimate.device_name(None, host, {"threads": True}) == plain  # a report from elsewhere: ints only
    assert estimate.device_name(None, host, None) == plain


def test_the_fewer_thread_device_has_the_compute_and_bandwidth_of_its_cores():
    from tapeout.estimation import host_probes

    host = {"cpu": "Some CPU", "cpu_flags": ["avx2", "avx512f"], "cpu_affinity": 4, "physical_cores": 4}
    probes = host_probes.Probes(1e11, 4e11, ((1 << 15, 1e11), (1 << 25, 2e10)))
    all_cores, one = roofline.for_host(host, probes), roofline.for_host(host, probes, threads=1)
    for precision, peak in all_cores.peaks.items():
        assert one.peaks[precision] == pytest.approx(peak / 4)
    assert one.bandwidth == pytest.approx(all_cores.bandwidth / 4) and one.notes[0].startswith("1 core(s)")
    _, named = estimate._device_roof(None, host, {"threads": 1}, "onnxruntime", None)
    assert named.name == roofline.host_name(host) + "-1t"
    # a calibration of this very device prices at the roof its records were priced at: never scaled again
    cal = fit.Calibration(
        roofline.host_name(host) + "-1t",
        "onnxruntime",
        "cpu",
        {"name": "x", "kind": "cpu", "peaks_tops": {"fp32": 0.05}, "bandwidth_gbs": 20.0, "source": ""},
        [],
        fit.Fit({}, 0.0, 0.0, {}),
    )
    assert estimate.roof_for(None, host, cal, threads=1).peaks["fp32"] == pytest.approx(0.05e12)


def test_a_one_thread_build_is_not_estimated_with_the_all_core_calibration(
    digits_build, digits_int8_build, fast_profile, tmp_path
):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("a one-core host has no fewer-thread device")
    cal = tmp_path / "cal"
    assert run_cli("calibrate", digits_build, digits_int8_build, "--out", cal).code == 0
    profile = tmp_path / "one.toml"
    profile.write_text(f'extends = "{fast_profile}"\n[options]\nthreads = 1\n')
    build = run_cli("build", SAMPLES / "digits-cnn", "--profile", profile, "--out", tmp_path / "one")
    assert build.code == 0, build.err
    got = run_cli("estimate", tmp_path / "one", "--json", env={"TAPEOUT_CALIBRATION": str(cal)})
    assert got.code == 0, got.err
    assert got.json()["device"].endswith("-1t") and got.json()["predicted_ms"] is None  # two threads' fit not used
    mine = run_cli("calibrate", tmp_path / "one", "--out", cal, "--json")
    assert mine.code == 0, mine.err
    assert [c["device"] for c in mine.json()] == [got.json()["device"]]
    assert len(list(cal.glob("*.json"))) == 2  # one file per thread count, side by side


def test_estimate_for_another_device_and_bad_input(digits_build, tmp_path):
    # a CPU build is not priced at a GPU's peaks (it was: the Jetson's GPU priced an ONNX Runtime CPU build)
    refused = run_cli("estimate", digits_build, "--device", "jetson-orin-nano-super")
    assert refused.code == 2 and "onnxruntime runs on a cpu" in one_line_error(refused)
    assert "jetson-orin-nano-super's spec gives the peaks of its gpu only" in refused.err and "--target" in refused.err
    got = run_cli("estimate", digits_build, "--device", "jetson-orin-nano-super", "--target", "ort-cuda", "--json")
    assert got.code == 0 and got.json()["device"] == "jetson-orin-nano-super"
    again = run_cli("estimate", digits_build, "--device", "jetson-orin-nano-super", "--target", "ort-cuda", "--json")
    assert again.json()["lower_bound_ms"] == got.json()["lower_bound_ms"]  # a spec's figure, the same every time
    assert "lower bound" in got.json()["method"] and "priced as ort-cuda" in got.json()["notes"][-1]
    for args, words in (
        (("--target", "ort-cuda"), "it needs --device"),
        (("--device", "l4", "--target", "tpu"), "unknown target 'tpu'"),
    ):
        wrong = run_cli("estimate", digits_build, *args)
        assert wrong.code == 2 and words in one_line_error(wrong), wrong.err
    bad = run_cli("estimate", digits_build, "--device", "no-such-gpu")
    assert bad.code == 2 and "no-such-gpu" in one_line_error(bad)
    missing = run_cli("estimate", tmp_path)
    assert missing.code == 2 and "report.json" in one_line_error(missing)
    none = run_cli("calibrate", tmp_path / "nowhere")
    assert none.code == 2


def test_a_spec_prices_only_the_targets_that_run_on_its_priced_units():
    from tapeout.core.config import load_device

    def why(target, device):
        return estimate.why_not_priced(target, load_device(device))

    assert why("onnxruntime", "jetson-orin-nano-super") and why("onnxruntime", "h100-sxm")
    assert why("onnxruntime", "intel-core-ultra-200v")  # its CPU rules read the spec; its peaks are the NPU's
    assert why("executorch", "snapdragon-8-gen3")  # XNNPACK runs on the phone's CPU, the peaks are the HTP's
    for target, device in (
        ("ort-cuda", "jetson-orin-nano-super"),
        ("tensorrt", "l4"),
        ("qnn", "snapdragon-8-gen3"),
        ("openvino", "intel-core-ultra-200v"),
        ("executorch-coreml", "apple-m4"),
        ("migraphx", "mi300x"),
    ):
        assert why(target, device) is None, (target, device)
    assert estimate.why_not_priced("onnxruntime", None) is None  # the host's CPU


def test_a_roof_as_recorded_reads_back_from_its_json_to_the_last_bit():
    """The roof JSON keeps GB/s and TOPS, and (x / 1e9) · 1e9 is not always x (for ~4 % of bandwidths): a roof as
    recorded reads back from its own JSON unchanged, so a build priced again at its report's roof gives the same
    figure to the last bit."""
    import random

    from tapeout.estimation import roofline

    rng = random.Random(0)
    moved = 0
    for _ in range(2000):
        roof = roofline.Roof(
            "host-x",
            "cpu",
            {"fp32": rng.uniform(1e10, 1e13), "int8": rng.uniform(1e11, 1e14)},
            rng.uniform(1e9, 1e11),
            "test",
            cache=((32768, rng.uniform(1e10, 1e11)),),
        )
        recorded = roof.as_recorded()
        moved += recorded != roof
        assert roofline.Roof.from_json(recorded.to_json(), "host-x") == recorded
    assert moved > 0  # the plain roof would not always have read back: what the test is for


def test_the_same_build_estimated_twice_gives_the_figure_it_was_built_with(digits_build, tmp_path, monkeypatch):
    """The host's probes are measured once and kept; a build's uncalibrated estimate reuses the roof it recorded, so
    `tapeout estimate` gives one figure however the machine's load moves."""
    from tapeout.core.host import host_fingerprint
    from tapeout.estimation import host_probes

    built = json.loads((digits_build / "report.json").read_text())["estimate"]
    folder = tmp_path / "calibration"  # no calibration: the bound, at the recorded roof
    runs = [run_cli("estimate", digits_build, "--json", env={"TAPEOUT_CALIBRATION": str(folder)}) for _ in range(2)]
    assert all(r.code == 0 for r in runs), runs[0].err
    assert [r.json()["lower_bound_ms"] for r in runs] == [built["lower_bound_ms"]] * 2
    assert runs[0].json()["roof"] == runs[1].json()["roof"]
    assert "the roof this build recorded when it was built" in runs[0].json()["roof"]["notes"]
    # a build in progress prices at the kept probes: measured once, then read back
    monkeypatch.setenv("TAPEOUT_CALIBRATION", str(folder))
    host = host_fingerprint()
    first = estimate.roof_for(None, host)
    kept = host_probes.load(host)
    assert kept is not None and kept.path.parent == folder
    assert estimate.roof_for(None, host) == first
    data = json.loads(kept.path.read_text())
    data["copies"] = [[size, 1e15] for size, _ in data["copies"]]  # as if measured fast once: every estimate follows
    kept.path.write_text(json.dumps(data))
    cores = host.get("cpu_affinity") or host.get("physical_cores")
    assert estimate.roof_for(None, host).bandwidth == pytest.approx(1e15 * cores, rel=1e-6)
    # measuring again raises what was kept, never lowers it: a busy minute does not make a bound that is beaten
    again = host_probes.kept(host, again=True)
    assert all(rate == 1e15 for _, rate in again.copy) and again.fp32_flops >= kept.fp32_flops
    # a kept file that is not one, or of another CPU, is measured again and replaced, not trusted
    for broken in (
        "{not json",
        json.dumps({**data, "host": "another CPU"}),
        json.dumps({**data, "copies": [[32768, -1.0]]}),
        json.dumps({**data, "fp32_flops": 1e300}),  # no CPU: drawn, it overflowed the report's plot
        json.dumps({**data, "copies": [[32768, 1e300]]}),
    ):
        kept.path.write_text(broken)
        assert host_probes.load(host) is None
        assert estimate.roof_for(None, host).bandwidth < 1e15 and host_probes.load(host) is not None


def test_a_hosts_peaks_are_ceilings_from_its_widest_units_and_its_probes(monkeypatch):
    """Per precision the cores times the most its widest unit does a cycle (AMX tiles, VNNI, AVX-512 FMA at two
    pipes) at the higher of the reported clock and the one the measured FP32 rate implies, or the measured rate
    where higher: a measured kernel does not beat it (an INT8 roof of 4x FP32 was beaten 2.3x by AMX)."""
    from tapeout.estimation import host_probes

    monkeypatch.setattr(roofline, "_max_mhz", lambda: 1000.0)
    amx = {
        "cpu": "Intel Xeon",
        "cpu_affinity": 2,
        "cpu_flags": ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16"],
    }
    roof = roofline.for_host(amx)
    assert roof.peaks["fp32"] == 2 * 64 * 1e9 and roof.peaks["int8"] == 2 * 2048 * 1e9
    assert roof.peaks["bf16"] == 2 * 1024 * 1e9 and "fp16" not in roof.peaks and roof.bandwidth is None
    # a core boosting to 1.5 GHz: the measured FP32 rate raises the clock every precision is priced at
    fast = roofline.for_host(amx, host_probes.Probes(96e9, 1e9, ((1 << 15, 1e10),)))
    assert fast.peaks["fp32"] == pytest.approx(2 * 96e9) and fast.peaks["int8"] == pytest.approx(2 * 2048 * 1.5e9)
    # a measured rate past what the flags say (a flag missing from the fingerprint) is the peak
    avx2 = {"cpu": "AMD EPYC", "cpu_affinity": 2, "cpu_flags": ["avx2", "fma"]}
    assert roofline.for_host(avx2, host_probes.Probes(1e10, 9e11, ((1 << 15, 1e10),))).peaks["int8"] == 2 * 9e11
    assert roofline.cpu_class(amx) == "cpu-intel-amx" and roofline.cpu_class(avx2) == "cpu-amd-avx2"
    # the cache: each footprint's one-thread copy times the cores, never faster at a larger footprint
    noisy = roofline.for_host(avx2, host_probes.Probes(1e10, 1e10, ((1 << 15, 5e10), (1 << 20, 6e10), (1 << 28, 1e10))))
    assert noisy.cache == ((1 << 15, 12e10), (1 << 20, 12e10), (1 << 28, 2e10)) and noisy.bandwidth == 2e10


def test_a_models_weights_are_read_at_the_rate_of_the_cache_they_all_fit_in():
    """A weight is read again only on the next run, after every other weight: a matmul's weights move at the rate
    of the working set of all the model's weights (DRAM's for a decode step's 500 MB), its activations at their
    own; a spec's roof has one bandwidth for both."""
    roof = roofline.Roof("host", "cpu", {"fp32": 1e15}, 2e10, "test", cache=((1 << 20, 1e11), (1 << 28, 2e10)))
    fc = cost_units.Kernel("fc", "matmul", "fp32", 2 * 512 * 512, 4 * 512 * 512 + 8192, 1, weights=4 * 512 * 512)
    alone = cost_units.roof_times(fc, roof)[1]
    assert alone == pytest.approx(fc.bytes / 1e11)
    among = cost_units.roof_times(fc, roof, weights=500e6)[1]
    assert among == pytest.approx(8192 / 1e11 + fc.weights / 2e10)
    kernels = [fc, *[cost_units.Kernel(f"w{i}", "matmul", "fp32", 0, 1e6, 1, weights=1e6) for i in range(499)]]
    assert cost_units.model_weights(kernels) == pytest.approx(fc.weights + 499e6)
    assert cost_units.model_times(kernels, roof)[0][1] == pytest.approx(among)
    assert cost_units.roof_times(fc, _h100(), weights=500e6)[1] == pytest.approx(fc.bytes / 3350e9)
    # at a lower precision its weights shrink with its bytes
    assert cost_units.at_precision([fc], None, "int8")[0].weights == fc.weights / 4


def test_openvino_on_a_cpu_with_bf16_units_prices_its_float_kernels_at_bf16():
    amx = {"cpu_flags": ["avx512f", "amx_bf16"]}
    assert estimate.float_runs_in("openvino", {}, amx, None, "fp32") == "bf16"
    assert estimate.float_runs_in("openvino", {"inference_precision": "f32"}, amx, None, "fp32") == "fp32"
    assert estimate.float_runs_in("openvino", {"inference_precision": "f16"}, amx, None, "fp32") == "fp16"
    assert estimate.float_runs_in("openvino", {}, {"cpu_flags": ["avx2"]}, None, "fp32") == "fp32"
    assert estimate.float_runs_in("onnxruntime", {}, amx, None, "fp32") == "fp32"
    assert estimate.float_runs_in("openvino", {"device": "GPU"}, amx, None, "fp32") == "fp32"


def test_a_cpu_class_calibration_prices_a_host_of_that_class_with_none_of_its_own(tmp_path, monkeypatch):
    host = {"cpu": "Intel Xeon", "cpu_flags": ["avx512f", "amx_int8"], "cpu_affinity": 2, "physical_cores": 2}
    records = [
        _record(
            f"m{i}", TERMS, {"matmul": 1e-4 * (i + 1), "elementwise": 1e-5}, {"matmul": 3, "elementwise": 4}, 2e-5, 1e-6
        )
        for i in range(3)
    ]
    [cal] = fit.make(
        [(r, {"device": "cpu-intel-amx", "target": "onnxruntime", "kind": "cpu", "roof": {}}) for r in records],
        "now",
        "test",
    )
    monkeypatch.setenv("TAPEOUT_CALIBRATION", str(tmp_path))
    monkeypatch.setenv("TAPEOUT_SHIPPED_CALIBRATION", "")
    assert estimate.find_calibration(roofline.host_name(host), "onnxruntime", host, None) is None
    fit.save(cal, tmp_path)
    found = estimate.find_calibration(roofline.host_name(host), "onnxruntime", host, None)
    assert found is not None and found[0].device == "cpu-intel-amx"
    assert estimate.find_calibration(roofline.host_name(host) + "-1t", "onnxruntime", host, None) is None
    roof = roofline.for_host(host)
    kernels = [cost_units.Kernel("fc", "matmul", "fp32", 10**9, 1e6, 1)]
    est = estimate.estimate(kernels, roof, "onnxruntime", "fp32", found)
    assert est.predicted_s > est.lower_bound_s and "carried from cpu-intel-amx" in est.calibration


def test_the_shipped_class_calibrations_are_valid_and_carry_their_roof():
    import importlib.resources

    folder = Path(str(importlib.resources.files("tapeout.profiles.devices"))) / "calibration"
    files = sorted(folder.glob("cpu-*--*.json"))
    assert files, folder
    for path in files:
        cal = fit.load(path)
        assert path.name == fit.file_name(cal.device, cal.target) and cal.device.startswith("cpu-")
        assert len({r.model for r in cal.records}) >= 3 and cal.band is not None
        assert cal.roof.get("peaks_tops", {}).get("fp32", 0) > 0 and cal.roof.get("cache_bandwidth_gbs")


def test_another_cpus_build_is_priced_at_its_recorded_roof_or_refused(digits_build, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(digits_build, other)
    report = json.loads((other / "report.json").read_text())
    report["host"]["cpu"] = "Some Other CPU"
    (other / "report.json").write_text(json.dumps(report))
    reseal(other)
    recorded = report["estimate"]["roof"]
    # its recorded roof was named for the CPU it ran on; renamed with it, that roof prices it, nothing measured here
    name = estimate.device_name(None, report["host"], None)
    report["estimate"]["roof"]["name"] = name
    (other / "report.json").write_text(json.dumps(report))
    reseal(other)
    est = estimate.for_build(open_build(other), cal=None)
    assert est.device == name and est.roof.bandwidth == pytest.approx(recorded["bandwidth_gbs"] * 1e9)
    report["estimate"] = None
    (other / "report.json").write_text(json.dumps(report))
    reseal(other)
    with pytest.raises(BadInput, match=r"ran on another CPU .*its report records no roof"):
        estimate.for_build(open_build(other), cal=None)


def test_a_malformed_calibration_file_is_one_clear_error(tmp_path):
    broken = tmp_path / "x--y.json"
    broken.write_text('{"schema": "tapeout.calibration/1", "device": "x"}')
    with pytest.raises(BadInput, match=r"not a tapeout\.calibration/1 file"):
        fit.load(broken)
    broken.write_text("{")
    with pytest.raises(BadInput, match="not readable JSON"):
        fit.load(broken)


def test_a_calibration_prices_with_its_own_cache_bandwidth_or_none_and_rejects_a_malformed_one(tmp_path):
    host = {"cpu": "Some CPU", "cpu_flags": ["avx2"], "cpu_affinity": 2, "physical_cores": 2}
    cal = fit.Calibration(
        roofline.host_name(host),
        "onnxruntime",
        "cpu",
        {
            "name": "d",
            "kind": "cpu",
            "peaks_tops": {"fp32": 0.1},
            "bandwidth_gbs": 20.0,
            "cache_bandwidth_gbs": [[32768, 90.0], [1 << 25, 30.0]],
        },
        [],
        fit.Fit({}, 0.0, 0.0, {}),
    )
    saved = fit.load(fit.save(cal, tmp_path))
    assert estimate.roof_for(None, host, saved).cache == ((32768, 90e9), (1 << 25, 30e9))
    # a file from before the cache was measured: its records were priced without it, and so are its estimates
    older = dict(saved.to_json(), roof={"name": "d", "kind": "cpu", "peaks_tops": {"fp32": 0.1}, "bandwidth_gbs": 20.0})
    (tmp_path / "old--onnxruntime.json").write_text(json.dumps(older))
    assert estimate.roof_for(None, host, fit.load(tmp_path / "old--onnxruntime.json")).cache == ()
    # and one with the fields earlier versions wrote (a strided loop, one thread's stream) still reads
    legacy = dict(older, roof={**older["roof"], "strided": {"sets": 64}, "stream_gbs": 17.0})
    (tmp_path / "legacy--onnxruntime.json").write_text(json.dumps(legacy))
    assert estimate.roof_for(None, host, fit.load(tmp_path / "legacy--onnxruntime.json")).bandwidth == 20e9
    bad = dict(older, roof={**older["roof"], "cache_bandwidth_gbs": [[32768, -1.0]]})
    (tmp_path / "bad--onnxruntime.json").write_text(json.dumps(bad))
    with pytest.raises(BadInput, match=r"cache_bandwidth_gbs"):
        fit.load(tmp_path / "bad--onnxruntime.json")
    # rates no device has (a file edited to 1e300) are refused, not drawn into an overflowing plot
    for roof in ({"peaks_tops": {"fp32": 1e300}}, {"bandwidth_gbs": 1e300}, {"cache_bandwidth_gbs": [[32768, 1e300]]}):
        absurd = dict(older, roof={**older["roof"], **roof})
        (tmp_path / "absurd--onnxruntime.json").write_text(json.dumps(absurd))
        with pytest.raises(BadInput, match=next(iter(roof))):
            fit.load(tmp_path / "absurd--onnxruntime.json")


@pytest.mark.slow
def test_a_device_compiled_build_gets_estimated_verdicts(tmp_path):
    """TensorRT's engine is built on the device: here its latency is estimated for the profile's L4 spec.
    The calibration file is made in the test from synthetic records: it checks our verdict path only."""
    profile = tmp_path / "trt-l4.toml"
    profile.write_text(
        'extends = "tensorrt-fp16"\ndevice = "l4"\n[budgets]\nlatency_p50_ms = 0.000001\n'
        "[check]\niterations = 20\nrepeats = 1\nwarmup_min_s = 0.05\n"
    )
    out = tmp_path / "b"
    env = {"TAPEOUT_CALIBRATION": str(tmp_path / "cal")}
    result = run_cli("build", SAMPLES / "digits-cnn", "-p", profile, "-o", out, "--json", env=env)
    assert result.code == 0, result.err  # estimated verdicts never fail a build without --strict
    latency = next(b for b in result.json()["budgets"] if b["budget"] == "latency_p50_ms")
    assert latency["verdict"] == "estimated-fail" and "roofline lower bound" in latency["reason"]
    strict = run_cli("build", SAMPLES / "digits-cnn", "-p", profile, "-o", tmp_path / "b2", "--strict", env=env)
    assert strict.code == 1
    # with a calibration for L4 × tensorrt, the generous limit is an estimated pass with its band
    records = [
        _record(
            f"m{i}",
            {c: (1e-6, 5.0) for c in ("conv", "matmul", "reduce", "movement")},
            {"conv": 1e-6, "matmul": 2e-6 * (i + 1), "reduce": 1e-7, "movement": 1e-7},
            {"conv": 2, "matmul": 2 + i, "reduce": 1, "movement": 1},
            5e-6,
            1e-6,
            "fp16",
        )
        for i in range(3)
    ]
    meta = {"device": "l4", "target": "tensorrt", "kind": "gpu", "roof": {}}
    [cal] = fit.make([(r, meta) for r in records], "now", "test")
    fit.save(cal, tmp_path / "cal")
    profile.write_text(profile.read_text().replace("0.000001", "50"))
    passed = run_cli("build", SAMPLES / "digits-cnn", "-p", profile, "-o", tmp_path / "b3", "--json", env=env)
    latency = next(b for b in passed.json()["budgets"] if b["budget"] == "latency_p50_ms")
    assert latency["verdict"] == "estimated-pass" and latency["bound"], latency
    assert passed.json()["estimate"]["method"] == estimate.METHOD_CALIBRATED


def test_ort_profile_args_give_flops_bytes_and_precision():
    from tapeout.targets.ort_profile import touched

    matmul = touched(
        "MatMul",
        {
            "input_type_shape": [{"float": [1, 128, 384]}, {"float": [384, 1536]}],
            "output_type_shape": [{"float": [1, 128, 1536]}],
            "activation_size": "196608",
            "parameter_size": "2359296",
            "output_size": "786432",
        },
    )
    assert matmul["flops"] == 2 * 128 * 1536 * 384 and matmul["precision"] == "fp32"
    assert matmul["in_bytes"] == 196608 + 2359296 and matmul["out_bytes"] == 786432
    conv = touched(
        "Conv",
        {
            "input_type_shape": [{"float": [1, 1, 8, 8]}, {"float": [16, 1, 3, 3]}],
            "output_type_shape": [{"float": [1, 16, 8, 8]}],
        },
    )
    assert conv["flops"] == 2 * 16 * 8 * 8 * 9
    # ORT prepacked the weight: its shape is not recorded, so the FLOPs are unknown, never guessed
    prepacked = touched(
        "QLinearConv",
        {
            "input_type_shape": [{"uint8": [1, 8, 8, 16]}, {"float": []}],
            "output_type_shape": [{"uint8": [1, 8, 8, 32]}],
        },
    )
    assert prepacked["flops"] is None and prepacked["precision"] == "int8"
    # an embedding Gather reads the rows it gathers and its ids, not its 47 MB table
    gather = touched(
        "Gather",
        {
            "input_type_shape": [{"float": [30522, 384]}, {"int64": [1, 128]}],
            "output_type_shape": [{"float": [1, 128, 384]}],
            "activation_size": "1024",
            "parameter_size": "46881792",
            "output_size": "196608",
        },
    )
    assert gather["in_bytes"] == 196608 + 128 * 8 and gather["out_bytes"] == 196608 and gather["flops"] == 0
    # a Reshape aliases its input: no arithmetic, no traffic, so all its time is overhead
    reshape = touched(
        "Reshape",
        {
            "input_type_shape": [{"float": [1, 128, 384]}, {"int64": [3]}],
            "output_type_shape": [{"float": [128, 384]}],
            "activation_size": "196632",
            "output_size": "196608",
        },
    )
    assert (reshape["flops"], reshape["in_bytes"], reshape["out_bytes"]) == (0, 0, 0)
    from tapeout.estimation import bottleneck

    op = {"node": "r", "op_type": "Reshape", "total_us": 2.0, **reshape}
    bound = bottleneck.classify(op, runs=1, kernel_total_us=100.0, roof=_h100())
    assert bound.bound == "overhead" and bound.roof_share == 0.0 and bound.achieved_gbs == 0.0


def test_executorch_kernel_names_fall_in_their_classes():
    """ETDump names XNNPACK's kernels with their layout and formats, and portable ops by their ATen name: each in its
    kernel class, so a calibration from an ExecuTorch build fits convolutions as convolutions, not as elementwise."""
    from tapeout.estimation.cost_units import op_class

    assert {
        name: op_class(name)
        for name in (
            "Convolution (NHWC, QC8) IGEMM",
            "Convolution (NHWC, F32) IGEMM",
            "Fully Connected (NC, QDU8, F32, QC8W) GEMM",
            "Batch Matrix Multiply (NC, F32) GEMM",
            "Max Pooling (NHWC, S8)",
            "Transpose (ND, X32)",
            "Static Reshape (NC)",
            "expand_copy",
            "native_layer_norm",
            "embedding",
            "Add (ND, F32)",
        )
    } == {
        "Convolution (NHWC, QC8) IGEMM": "conv",
        "Convolution (NHWC, F32) IGEMM": "conv",
        "Fully Connected (NC, QDU8, F32, QC8W) GEMM": "matmul",
        "Batch Matrix Multiply (NC, F32) GEMM": "matmul",
        "Max Pooling (NHWC, S8)": "reduce",
        "Transpose (ND, X32)": "movement",
        "Static Reshape (NC)": "movement",
        "expand_copy": "movement",
        "native_layer_norm": "reduce",
        "embedding": "movement",
        "Add (ND, F32)": "elementwise",
    }
    assert op_class("Conv") == "conv" and op_class("Relu") == "elementwise"  # ONNX names as before


def test_aotinductor_kernel_names_fall_in_their_classes():
    """An AOTInductor package's kernel records: generated kernels named after the ATen ops fused into them (a
    reduction among them makes a reduce; copies and views alone, movement), calls out of the package by their C shim."""
    from tapeout.estimation.cost_units import op_class

    assert {
        name: op_class(name)
        for name in (
            "aoti_torch_cpu_mkldnn__convolution_pointwise",
            "aoti_torch_cpu__qconv_pointwise_tensor",
            "aoti_torch_cpu__linear_pointwise",
            "aoti_torch_cpu__qlinear_pointwise_tensor",
            "aoti_torch_cpu_bmm_out",
            "aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu",
            "cpp_fused_add_native_layer_norm",
            "cpp_fused__softmax",
            "cpp_fused_max_pool2d_with_indices_relu_view",
            "cpp_fused_clone_permute",
            "cpp_fused_embedding",
            "cpp_fused_gelu_view",
            "cpp_fused_relu",
            "cpp_fused_quantize_per_tensor",
            "triton_per_fused__softmax",
            "triton_poi_fused_cat",
            "triton_tem_fused_addmm",
        )
    } == {
        "aoti_torch_cpu_mkldnn__convolution_pointwise": "conv",
        "aoti_torch_cpu__qconv_pointwise_tensor": "conv",
        "aoti_torch_cpu__linear_pointwise": "matmul",
        "aoti_torch_cpu__qlinear_pointwise_tensor": "matmul",
        "aoti_torch_cpu_bmm_out": "matmul",
        "aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu": "matmul",
        "cpp_fused_add_native_layer_norm": "reduce",
        "cpp_fused__softmax": "reduce",
        "cpp_fused_max_pool2d_with_indices_relu_view": "reduce",
        "cpp_fused_clone_permute": "movement",
        "cpp_fused_embedding": "movement",
        "cpp_fused_gelu_view": "elementwise",
        "cpp_fused_relu": "elementwise",
        "cpp_fused_quantize_per_tensor": "quantize",
        "triton_per_fused__softmax": "reduce",
        "triton_poi_fused_cat": "movement",
        "triton_tem_fused_addmm": "matmul",
    }
    # an ONNX or OpenVINO name that happens to share a word is not read as Inductor's
    assert op_class("MatMul") == "matmul" and op_class("Softmax") == "reduce" and op_class("Gelu") == "elementwise"


def test_bottlenecks_classify_ops_and_price_the_fusible_chains():
    from tapeout.estimation import bottleneck

    roof = roofline.Roof("dev", "gpu", {"fp32": 1e12}, 1e11, "test roofs")  # 1 TFLOP/s, 100 GB/s

    def op(node, op_type, us, flops, in_b, out_b, shape_in, shape_out):
        return {
            "node": node,
            "op_type": op_type,
            "calls": 1,
            "total_us": us,
            "flops": flops,
            "in_bytes": in_b,
            "out_bytes": out_b,
            "precision": "fp32",
            "in_shapes": [shape_in],
            "out_shapes": [shape_out],
        }

    ops = [
        op("gemm", "MatMul", 10.0, 8e6, 0, 0, [64, 64], [64, 64]),  # 8 µs at the roof: compute
        op("add", "Add", 2.0, 1e4, 80_000, 40_000, [64, 64], [64, 64]),  # 1.2 µs at the roof: memory
        op("mul", "Mul", 50.0, 1e4, 80_000, 40_000, [64, 64], [64, 64]),  # 40x its roof: overhead
        op("other", "Tanh", 2.0, 1e4, 80_000, 40_000, [3, 3], [3, 3]),
    ]  # shape breaks the chain
    # the profiled run (400 µs) is mostly the profiler's gaps: the ops' 64 µs stand, 16 µs of the 80 µs p50 is outside
    profile = {"runs": 1, "ops": ops, "overhead_share": 0.84, "mean_run_us": 400.0}
    view = bottleneck.view(profile, roof, p50_ms=0.080)
    bound = {o["node"]: o["bound"] for o in view["ops"]}
    assert bound == {"gemm": "compute", "add": "memory", "mul": "overhead", "other": "memory"}
    assert math.isclose(view["outside_ops_share"], 0.2) and view["profiler_scale"] == 1.0
    # recorded intervals that outgrow the timed run are scaled down to it, and nothing is left outside
    squeezed = bottleneck.view(profile, roof, p50_ms=0.032)
    assert math.isclose(squeezed["profiler_scale"], 0.5) and squeezed["outside_ops_share"] == 0.0
    assert bottleneck.view(profile, roof)["outside_ops_share"] == 0.84  # no timed run: the profile's own
    [chain] = view["fusible_chains"]
    assert chain["ops"] == ["add", "mul"]  # gemm is not fused; tanh not linked
    assert math.isclose(chain["fused_us"], (80_000 + 40_000) / 1e11 * 1e6)  # one pass in and out
    assert math.isclose(chain["saving_us"], 52.0 - chain["fused_us"])


def test_a_manifest_with_malformed_shapes_is_one_line(digits_build, tmp_path):
    """The estimate re-derives the kernels from the manifest's inputs and dims: wrong types there are the
    build dir's fault, said in one line (the fuzz suite found the traceback this replaced)."""
    import shutil

    for field, value in (("inputs", -1), ("dims", [1])):
        copy = tmp_path / field
        shutil.copytree(digits_build, copy)
        doc = json.loads((copy / "manifest.json").read_text())
        doc["project"][field] = value
        (copy / "manifest.json").write_text(json.dumps(doc))
        result = run_cli("estimate", copy)
        assert result.code == 2 and f"project.{field}" in one_line_error(result)


def test_a_gpu_run_is_estimated_for_the_device_spec_its_gpu_matches(digits_build, tmp_path):
    """A GPU target's estimate is never the host CPU's roof: with no device in the profile, the shipped spec
    whose identifiers match the name the driver reported (seen on an H100: builds estimated the host's Xeon)."""
    from tapeout.core.config import device_matching

    assert device_matching("NVIDIA H100 80GB HBM3").name == "h100-sxm"
    assert device_matching("NVIDIA H200").name == "h200-sxm"  # as the H200's driver names it
    assert device_matching("NVIDIA H100 PCIe").name == "h100-pcie"
    assert device_matching("NVIDIA GeForce RTX 4090").name == "rtx-4090"
    assert device_matching("NVIDIA B200") is None and device_matching(None) is None
    assert estimate.spec_for_run("ort-cuda", None, "NVIDIA H100 80GB HBM3").name == "h100-sxm"
    assert estimate.spec_for_run("onnxruntime", None, "NVIDIA H100 80GB HBM3") is None  # the host CPU
    l4 = device_matching("NVIDIA L4")
    assert estimate.spec_for_run("ort-cuda", l4, "NVIDIA H100 80GB HBM3") is l4  # the profile's spec wins
    # a CPU build dir re-labelled as the GPU run it would have been (the estimate reads the report, not the run)
    gpu = tmp_path / "gpu"
    shutil.copytree(digits_build, gpu)
    report = json.loads((gpu / "report.json").read_text())
    report["target"]["name"] = "ort-cuda"
    report["device"] = {"spec": None, "reported": "NVIDIA H100 80GB HBM3", "matches": None, "note": ""}
    (gpu / "report.json").write_text(json.dumps(report))
    reseal(gpu)
    est = estimate.for_build(open_build(gpu), cal=None)
    assert est.device == "h100-sxm" and est.roof.kind == "gpu"
    report["device"]["reported"] = "NVIDIA B200"
    (gpu / "report.json").write_text(json.dumps(report))
    reseal(gpu)
    with pytest.raises(BadInput, match=r"ort-cuda ran on NVIDIA B200, which no shipped device spec matches"):
        estimate.for_build(open_build(gpu), cal=None)
    assert estimate.for_build(open_build(gpu), cal=None, device_spec=l4).device == "l4"


def test_a_build_in_progress_on_a_gpu_is_estimated_for_its_gpu_or_not_at_all():
    """The build step's estimate (`for_model`) with the name the GPU meter reported: the matching spec's roof,
    never the host's; a GPU no spec matches gets none. The context is a stand-in with the fields it reads."""
    from types import SimpleNamespace

    structure = [cost_units.Kernel("mm", "matmul", "fp32", 2 * 64 * 256 * 256, 4 * (2 * 64 * 256 + 256 * 256), 1)]
    ctx = SimpleNamespace(
        target=SimpleNamespace(name="ort-cuda", options=None),
        device=None,
        emulated=None,
        profile=SimpleNamespace(precision="fp32"),
    )
    est = estimate.for_model(ctx, structure, None, "NVIDIA H100 80GB HBM3")
    assert est.device == "h100-sxm" and est.roof.kind == "gpu"
    assert estimate.for_model(ctx, structure, None, "NVIDIA B200") is None
    assert estimate.for_model(ctx, structure, None, None) is None


# ---------------------------------------------------------------- the generation loop (estimation/generation.py)

KV_PER_POSITION = 64 * 1024  # bytes of keys and values one position adds to a synthetic decoder's cache


def _decoder_phase(kind: str, seq: int, past: int) -> generation.Phase:
    """A decoder whose projections read 100 MB of FP32 weights per call for 50 MFLOP per token, and whose attention
    reads the whole cache (past + seq positions) for 1 kFLOP per position and token."""
    proj = cost_units.Kernel("proj", "matmul", "fp32", 50_000_000 * seq, 100e6 + 8192 * seq, 1, lead="proj")
    attn = cost_units.Kernel(
        "attn", "elementwise", "fp32", 1000 * seq * (past + seq), KV_PER_POSITION * (past + seq), 1
    )
    return generation.Phase(kind, seq, past, [proj, attn])


def _decoder_phases(prompts=(16, 64), max_context=512) -> list[generation.Phase]:
    return [_decoder_phase(kind, seq, past) for kind, seq, past in generation.shapes(list(prompts), 9, max_context)]


def _workload(prompts=(16, 64), new_tokens=9, max_context=512, batch=1):
    from types import SimpleNamespace

    return SimpleNamespace(
        kind="generate", prompt_lengths=list(prompts), new_tokens=new_tokens, max_context=max_context, batch=batch
    )


def test_decode_is_priced_at_its_bytes_over_the_bandwidth_and_a_long_prefill_at_its_flops():
    roof = _h100()
    phases = _decoder_phases(prompts=(16, 4096), max_context=8192)
    est = generation.price(phases, roof, "tensorrt", "fp32", None, None, _workload((16, 4096), max_context=8192))
    assert [(c.kind, c.seq, c.past) for c in est.decode] == [("decode", 1, 16), ("decode", 1, 8191)]
    for step in est.decode:  # batch 1: every decode step is memory-bound on an H100
        assert step.memory_bound_share == 1.0
        assert math.isclose(step.lower_bound_s, step.bytes / roof.bandwidth, rel_tol=1e-12)
    long = est.prefill[-1]
    assert long.seq == 4096 and long.memory_bound_share < 0.05  # past the ridge: compute-bound
    assert math.isclose(long.lower_bound_s, long.flops / roof.peak("fp32")[0], rel_tol=0.05)
    # the tokens/s bound is the batch over the median step
    data = est.to_json()
    assert math.isclose(data["decode_tokens_per_s"]["upper_bound"], 1e3 / est.tpot_bound_ms("p50"))
    assert data["tpot_ms"]["predicted"] is None and est.ttft_ms(16) is None  # no calibration: bounds only
    assert "lower bounds" in est.line()


def test_tpot_is_the_step_at_the_positions_the_loop_times_read_off_the_line_between_two_steps():
    """A decode step's cost is affine in its position, so two priced steps give every other one exactly."""
    roof = _h100()
    est = generation.price(_decoder_phases(), roof, "tensorrt", "fp32", None, None, _workload())
    positions = est.timed_positions()
    assert list(positions) == [*range(16, 24), *range(64, 72)]  # new_tokens - 1 steps after each prompt
    for q, share in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        at = float(np.quantile(positions, share))
        direct = generation.price(
            [_decoder_phase("decode", 1, at)], roof, "tensorrt", "fp32", None, None, _workload()
        ).decode[0]  # the synthetic step is affine at any real position too
        assert math.isclose(est.tpot_bound_ms(q), direct.lower_bound_s * 1e3, rel_tol=1e-9)
    assert est.tpot_bound_ms("p50") < est.tpot_bound_ms("p90") < est.tpot_bound_ms("p99")
    # KV bytes make the difference: a step at max_context reads 496 more positions than one at 16
    first, last = est.decode
    assert math.isclose(last.bytes - first.bytes, (last.past - first.past) * KV_PER_POSITION)


def test_a_quantized_plan_prices_the_decode_step_at_its_weights_precision():
    roof = _h100()
    plan = {"groups": [{"nodes": ["proj"], "precision": "int4"}]}
    fp32 = generation.price(_decoder_phases(), roof, "tensorrt", "fp32", None, None, _workload())
    int4 = generation.price(_decoder_phases(), roof, "tensorrt", "int4", plan, None, _workload())
    # weights at half a byte: the 100 MB of projections read as 12.5 MB, the cache as before
    assert int4.decode[0].bytes < fp32.decode[0].bytes / 4
    assert int4.tpot_bound_ms("p50") < fp32.tpot_bound_ms("p50") / 4


@pytest.mark.parametrize("rung, peak_of", [("int8-weight", "int8"), ("a16w8", "fp16")])
def test_a_mixed_rung_moves_its_weights_at_their_width_and_computes_at_its_activations(rung, peak_of):
    """An INT4 decoder's LM head at `int8-weight` (8-bit MatMulNBits) priced at FP32's 4 bytes put llama-40m's
    TPOT bound at 3.2 ms where 2.4 ms was measured; an HTP group at A16W8 likewise."""
    roof = _h100()
    [kernel] = cost_units.at_precision(
        [cost_units.Kernel("head", "matmul", "fp32", 2 * 512 * 32000, 4 * 512 * 32000, 1, lead="head")],
        {"groups": [{"nodes": ["head"], "precision": rung}]},
        "fp32",
    )
    assert kernel.precision == rung and kernel.bytes == 512 * 32000
    assert roof.peak(rung) == (roof.peaks[peak_of], peak_of)
    est = estimate.estimate([kernel], roof, "onnxruntime", "int4", None)
    assert not any("no peak" in n for n in est.notes)


def test_a_calibration_predicts_each_phase_as_the_per_call_model_would_with_its_band_and_tails():
    roof = _h100()
    records = [
        _record(
            f"m{i}",
            TERMS,
            {"matmul": 1e-3 * (i + 1) ** 2, "elementwise": 2e-4 * (3 - i)},
            {"matmul": 4 + 7 * i, "elementwise": 9 - 2 * i},
            5e-6,
            2e-6,
            share=0.08,
        )
        for i in range(4)
    ]
    cal = fit.Calibration(
        "h100-sxm",
        "tensorrt",
        "gpu",
        roof.to_json(),
        records,
        fit.fit(records),
        [{"model": "a", "error": -0.1}, {"model": "b", "error": 0.2}],
    )
    path = Path("h100-sxm__tensorrt.json")
    phases = _decoder_phases()
    est = generation.price(phases, roof, "tensorrt", "fp32", None, (cal, path), _workload())
    for phase, cost in zip([p for p in phases if p.kind == "prefill"], est.prefill, strict=True):
        single = estimate.estimate(phase.kernels, roof, "tensorrt", "fp32", (cal, path))
        assert math.isclose(cost.predicted_s, single.predicted_s) and cost.predicted_s > cost.lower_bound_s
    point, low, high = est.ttft_ms(64)
    assert math.isclose(low, point / 1.2) and math.isclose(high, point / 0.9)  # the band read as Estimate reads it
    p50, p90 = est.tpot_ms("p50"), est.tpot_ms("p90")
    at90 = float(np.quantile(est.timed_positions(), 0.9))
    assert math.isclose(p90[0], est.step_s(at90, True) * 1e3 * 1.2)  # the calibration's p90/p50 tail
    assert p50[0] < p90[0]
    data = generation.with_measured(
        est,
        {
            "ttft_ms": {"64": {"quantiles": {"p50": {"point": point * 2}}}},
            "tpot_ms": {"quantiles": {"p50": {"point": p50[0] / 2}}},
        },
    )
    rows = {m["what"]: m for m in data["measured"]}
    assert math.isclose(rows["TTFT@64 p50"]["error"], -0.5) and rows["TTFT@64 p50"]["of"] == "predicted"
    assert math.isclose(rows["TPOT p50"]["error"], 1.0)
    assert rows["TTFT@16 p50"]["measured_ms"] is None and rows["TTFT@16 p50"]["error"] is None
    assert data["band"] == [-0.1, 0.2] and "no generate loop" in data["band_from"]
    from tapeout.records.estimate import GenerationEstimateRecord

    GenerationEstimateRecord.model_validate(data)  # what report.json keeps
