"""What a kernel predictor reads beyond FLOPs and bytes (estimation/cost_units.py `function_shape`, predictor.py):
the function an elementwise, movement, quantize or recurrent kernel computes, kept from the model's own ops and
taken from the op of a point swept before it was kept; and what a class model's trees predict (a kernel's seconds,
or its seconds over its roofline plus the sweep's dispatch)."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tapeout.core.schemas import InputSpec
from tapeout.estimation import cost_units as kern
from tapeout.estimation import predictor, sweep
from tapeout.graph.analyze import analyze_view
from tapeout.graph.view import GraphView


def _chain(path):
    """Relu, Tanh, x·Sigmoid(x) (SiLU: one kernel), Erf, Transpose, Gather, a QuantizeLinear and a DequantizeLinear,
    then a GRU over the result."""
    t = TensorProto.FLOAT
    inits = [helper.make_tensor("ids", TensorProto.INT64, [2], [0, 1]),
             helper.make_tensor("scale", t, [], [0.05]), helper.make_tensor("zero", TensorProto.UINT8, [], [128]),
             helper.make_tensor("W", t, [1, 24, 8], [0.01] * 192), helper.make_tensor("R", t, [1, 24, 8], [0.01] * 192)]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Tanh", ["r"], ["t"], name="tanh"),
             helper.make_node("Sigmoid", ["t"], ["s"], name="sig"),
             helper.make_node("Mul", ["t", "s"], ["silu"], name="silu"),
             helper.make_node("Erf", ["silu"], ["e"], name="erf"),
             helper.make_node("Transpose", ["e"], ["tr"], name="transpose", perm=[1, 0, 2]),
             helper.make_node("Gather", ["tr", "ids"], ["g"], name="gather", axis=0),
             helper.make_node("QuantizeLinear", ["g", "scale", "zero"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["dq"], name="dq"),
             helper.make_node("GRU", ["dq", "W", "R"], ["y"], name="gru", hidden_size=8)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", t, [4, 2, 8])],
                              [helper.make_tensor_value_info("y", t, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def test_each_kernel_keeps_the_function_it_computes(tmp_path):
    view = GraphView.load(_chain(tmp_path / "m.onnx"), [InputSpec(name="x", shape=[4, 2, 8])], {})
    found = {k.name: (k.cls, dict(k.shape).get("function")) for k in kern.structure(view, analyze_view(view))}
    assert found["relu"] == ("elementwise", 1)
    assert found["tanh"] == ("elementwise", 2)
    assert found["silu"] == ("elementwise", 2)  # the fused SiLU: its Sigmoid's, not its Mul's
    assert "sig" not in found
    assert found["erf"] == ("elementwise", 3)
    assert found["transpose"] == ("movement", 3) and found["gather"] == ("movement", 2)
    assert found["q"] == ("quantize", 1) and found["dq"] == ("quantize", 2)
    assert found["recurrent_cell1"] == ("recurrent", 2)  # the cell its fusion group names
    assert kern.function_shape("conv", ["Conv"]) == ()
    assert kern.function_shape("elementwise", ["Add", "Mul"]) == (("function", 1),)
    assert kern.function_shape("elementwise", ["Div", "Erf", "Mul"]) == (("function", 3),)  # a GELU's chain: its Erf
    assert kern.function_shape("elementwise", ["SomeNewOp"]) == (("function", 1),)
    # an INT8 plan's activation quantization: into 8 bits
    quantized = kern.at_precision([kern.Kernel("mm", "matmul", "fp32", 100, 40.0, 1, lead="mm", quantized_input=8)],
                                  {"groups": [{"nodes": ["mm"], "precision": "int8"}]}, "fp32")
    assert dict(quantized[1].shape) == {"function": 1}


def test_a_point_swept_before_the_function_was_kept_takes_it_from_its_op():
    old = {"cls": "elementwise", "op": "GeluTanh", "shape": {}}
    assert sweep.point_shape(old) == {"function": 2}   # the composite's Tanh
    assert sweep.point_shape({"cls": "quantize", "op": "DequantizeLinear"}) == {"function": 2}
    lstm = {"cls": "recurrent", "op": "LSTM", "config": {"steps": 4, "input": 9, "hidden": 20}, "shape": {}}
    assert sweep.point_shape(lstm) == {"input": 9, "hidden": 20, "function": 1}
    conv = {"cls": "conv", "op": "Conv", "shape": {"per_group": 3, "width": 7}}
    assert sweep.point_shape(conv) == {"per_group": 3, "width": 7}
    kept = {"cls": "movement", "op": "Transpose", "shape": {"function": 3, "run": 5}}
    assert sweep.point_shape(kept) == {"function": 3, "run": 5}
    # a swept model's kernel gets it from the same ops as a build's: the sweep's features name it
    from tapeout.estimation.roofline import Roof

    stand_in = Roof(name="test", kind="cpu", peaks={"fp32": 1e11}, bandwidth=2e10, source="a stand-in")
    for op, function in (("Tanh", 2), ("Relu", 1), ("GeluTanh", 2), ("Erf", 3)):
        proto, inputs = sweep.model(sweep.Config("elementwise", op, (("size", 4096),)))
        assert sweep.features_of(proto, inputs, stand_in)["shape"] == {"function": function}, op


def _leaf(value: float, relative: float | None) -> predictor.ClassModel:
    return predictor.ClassModel(init=math.log(value), rate=1.0, band=(-0.1, 0.1), points=12, held_out_within_15=1.0,
                                trees=[predictor.Tree(feature=[-2], threshold=[-2.0], left=[-1], right=[-1],
                                                      value=[0.0])],
                                relative_to_roof_plus_s=relative)


def _predictor(classes: dict) -> predictor.Predictor:
    from pathlib import Path

    from tapeout.estimation.roofline import Roof

    roof = Roof(name="test", kind="cpu", peaks={"fp32": 1e11}, bandwidth=2e10, source="a stand-in")
    return predictor.Predictor(predictor.PredictorFile(
        schema=predictor.SCHEMA, device="d", target="onnxruntime", host="h", threads=1, created="now",
        baseline_s=0.0, roof=roof.to_json(), points=12, classes=classes), Path("p.json"))


def test_a_class_model_predicts_seconds_or_a_ratio_to_its_roofline_plus_the_dispatch():
    pred = _predictor({"reduce": _leaf(2e-6, None), "conv": _leaf(3.0, 2e-7)})
    assert pred.kernel_s("reduce", 1e6, 1e4, 1e-6, 1, 1) == pytest.approx(2e-6)           # seconds
    shape = {"per_group": 16, "out_channels": 16, "positions": 64, "area": 9, "groups": 1, "layout": 2,
             "fill": 100, "rank": 2}
    assert pred.kernel_s("conv", 1e6, 1e4, 1e-5, 1, 1, shape) == pytest.approx(3.0 * (1e-5 + 2e-7))  # a ratio
    # a file without the field (trained before it) reads as seconds
    data = _leaf(2e-6, None).model_dump()
    del data["relative_to_roof_plus_s"]
    assert predictor.ClassModel.model_validate(data).relative_to_roof_plus_s is None


def test_training_learns_a_ratio_where_the_kernels_time_follows_its_roofline():
    """A class whose time is 2.5 × (roofline + dispatch) over four decades: held out, the ratio is near exact and the
    class keeps it; the band is its held-out errors."""
    rng = np.random.default_rng(0)
    dispatch = 2e-7
    rows = []
    for _ in range(200):
        roof_s = 10 ** rng.uniform(-7, -3)
        rows.append({"cls": "matmul", "precision": "fp32", "flops": roof_s * 1e11, "bytes": roof_s * 2e10 / 3,
                     "nodes": 1, "launches": 1, "roof_s": roof_s, "kernel_s": 2.5 * (roof_s + dispatch),
                     "shape": {"m": 64, "k": 64, "n": 64}})
    model = predictor.train(rows, dispatch_s=dispatch)["matmul"]
    assert model.relative_to_roof_plus_s == dispatch
    assert model.held_out_within_15 == 1.0 and -0.05 < model.band[0] <= model.band[1] < 0.05
    assert predictor.train(rows)["matmul"].relative_to_roof_plus_s is None  # no dispatch given: seconds
    pred = _predictor({"matmul": model})
    assert pred.kernel_s("matmul", 1e7, 1e5, 1e-4, 1, 1, {"m": 64, "k": 64, "n": 64}) == \
        pytest.approx(2.5 * (1e-4 + dispatch), rel=0.05)
    assert pred.kernel_s("matmul", 1e7, 1e5, 1e-4, 1, 1) is None  # a MatMul whose shape is unknown: not priced


def test_a_class_learns_its_seconds_only_where_they_win_clearly_on_its_held_out_points():
    """The form a class learns (`seconds_form_wins`): the ratio to its roofline stays on a near-tie, where a larger
    share alone had flipped between two trainings of nearly the same points."""
    ratio = np.zeros(400, dtype=bool)
    ratio[:300] = True                          # the ratio: 300 of 400 held-out points within ±15 %
    near = ratio.copy()
    near[300:308] = True                        # the seconds: 8 won ...
    near[:4] = False                            # ... 4 lost: 304 / 400, the larger share, and a tie within its spread
    assert near.mean() > ratio.mean() and not predictor.seconds_form_wins(ratio, near)
    clear = ratio.copy()
    clear[300:340] = True
    clear[:10] = False                          # 40 won, 10 lost: 330 / 400, past twice the root of 50
    assert predictor.seconds_form_wins(ratio, clear)
    assert not predictor.seconds_form_wins(ratio, ratio)      # agreeing everywhere: nothing to switch for
    assert not predictor.seconds_form_wins(clear, ratio)      # the seconds losing clearly: the ratio


def test_a_near_tie_keeps_the_ratio_form_whatever_the_dispatch():
    """A class whose time follows its roofline with 12 % noise: the two forms' held-out shares differ by a point or
    two either way (this draw: 62 % the ratio, 64 % the seconds), and the class keeps the ratio, at two dispatches
    0.2 % apart as well."""
    rng = np.random.default_rng(5)
    rows = []
    for _ in range(160):
        roof_s = 10 ** rng.uniform(-6.5, -4)
        rows.append({"cls": "recurrent", "precision": "fp32", "flops": roof_s * 1e11, "bytes": roof_s * 2e10 / 3,
                     "nodes": 1, "launches": 1, "roof_s": roof_s,
                     "kernel_s": (3 * roof_s + 2e-6) * math.exp(rng.normal(0, 0.12)),
                     "shape": {"function": 1, "input": 16, "hidden": 16}})
    for dispatch in (2.0e-7, 2.004e-7):
        assert predictor.train(rows, dispatch_s=dispatch)["recurrent"].relative_to_roof_plus_s == dispatch


def test_a_structure_from_before_the_function_is_analysed_again(digits_build, tmp_path):
    """A build dir whose structure.json predates `function` (and a single call's): its verified export is analysed
    again, so the predictors that read it price every kernel."""
    from tapeout.builds.reader import open_build
    from tapeout.core.hashing import sha256_file
    from tapeout.estimation import build_structure, kernel_shape

    build = tmp_path / "old"
    shutil.copytree(digits_build, build)
    path = build / "structure.json"
    data = json.loads(path.read_text())
    stripped = 0
    for k in data["kernels"]:
        if "function" in k.get("shape", {}):
            del k["shape"]["function"]
            stripped += 1
    assert stripped  # digits-cnn has elementwise and movement kernels
    assert data.pop("shapes") == kernel_shape.VERSION  # a record written before the shapes were versioned has none
    path.write_text(json.dumps(data))
    manifest = json.loads((build / "manifest.json").read_text())
    manifest["structure"]["sha256"] = sha256_file(path)
    (build / "manifest.json").write_text(json.dumps(manifest))
    again = build_structure.kernels_of(open_build(build))
    fresh = build_structure.kernels_of(open_build(digits_build))
    assert [(k.name, k.cls, dict(k.shape)) for k in again] == [(k.name, k.cls, dict(k.shape)) for k in fresh]
    assert all("function" in dict(k.shape) for k in again if k.cls in kern.FUNCTION_CLASSES)


def test_a_matmul_keeps_its_gemms_rows_depth_and_columns(tmp_path):
    """A Linear's MatMul on a [1, 128, 256] activation is one 128 × 256 × 768 GEMM; a Gemm with its weight transposed
    reads k and n off it; attention's batched scores stack their heads' rows (4 heads of 128 × 32 × 128: m 512)."""
    t = TensorProto.FLOAT
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", t, [256, 768], rng.standard_normal(256 * 768).astype(np.float32).tolist())
    g = helper.make_tensor("g", t, [64, 768], rng.standard_normal(64 * 768).astype(np.float32).tolist())
    shape = helper.make_tensor("shape", TensorProto.INT64, [4], [1, 128, 4, 192])
    perm_q = helper.make_node("Transpose", ["heads"], ["q"], name="tq", perm=[0, 2, 1, 3])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("Reshape", ["h", "shape"], ["heads"], name="split"),
             perm_q,
             helper.make_node("Transpose", ["heads"], ["kt"], name="tk", perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
             helper.make_node("Gemm", ["flat", "g"], ["y"], name="head", transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", t, [1, 128, 256]),
                                           helper.make_tensor_value_info("flat", t, [10, 768])],
                              [helper.make_tensor_value_info("scores", t, None),
                               helper.make_tensor_value_info("y", t, None)], [w, g, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "m.onnx"))
    view = GraphView.load(tmp_path / "m.onnx", [InputSpec(name="x", shape=[1, 128, 256]),
                                                InputSpec(name="flat", shape=[10, 768])], {})
    found = {k.name: dict(k.shape) for k in kern.structure(view, analyze_view(view)) if k.cls == "matmul"}
    assert found["linear1"] == {"m": 128, "k": 256, "n": 768}  # its fusion group's name
    assert found["scores"] == {"m": 4 * 128, "k": 192, "n": 128}
    assert found["head"] == {"m": 10, "k": 768, "n": 64}
    # a MatMul point swept before its shape was kept: from its configuration
    point = {"cls": "matmul", "op": "MatMul", "config": {"m": 7, "k": 64, "n": 32, "bias": 1}, "shape": {}}
    assert sweep.point_shape(point) == {"m": 7, "k": 64, "n": 32}


def test_a_movement_kernel_keeps_its_runs_a_conv_its_width_a_cell_its_sizes(tmp_path):
    """`run`: the elements each contiguous copy moves (a Transpose's trailing axes left in place, a Concat's what
    follows its axis, a Gather's rows, a Slice's trailing axes it keeps whole); a conv's output width; an LSTM's
    or GRU's input width and hidden size; a layout reorder a runtime adds moves runs of one element."""
    t = TensorProto.FLOAT
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", t, [32, 16, 3, 3], (rng.standard_normal(32 * 16 * 9) * 0.1).tolist())
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),           # [1, 32, 8, 128]
             helper.make_node("Transpose", ["c"], ["keep"], name="keep_last", perm=[0, 2, 1, 3]),  # runs of 128
             helper.make_node("Transpose", ["c"], ["move"], name="move_last", perm=[0, 2, 3, 1]),  # runs of 1
             helper.make_node("Concat", ["keep", "keep"], ["cat"], name="cat", axis=2),            # 32 × 128
             helper.make_node("Slice", ["cat", "starts", "ends", "axes"], ["half"], name="slice")]
    inits = [w, helper.make_tensor("starts", TensorProto.INT64, [1], [0]),
             helper.make_tensor("ends", TensorProto.INT64, [1], [4]),
             helper.make_tensor("axes", TensorProto.INT64, [1], [1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", t, [1, 16, 8, 128])],
                              [helper.make_tensor_value_info("move", t, None),
                               helper.make_tensor_value_info("half", t, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "m.onnx"))
    view = GraphView.load(tmp_path / "m.onnx", [InputSpec(name="x", shape=[1, 16, 8, 128])], {})
    found = {k.name: dict(k.shape) for k in kern.structure(view, analyze_view(view))}
    assert found["head"]["width"] == 128 and found["head"]["positions"] == 8 * 128  # a lone conv: "head"
    assert found["keep_last"] == {"run": 128, "function": 3}
    assert found["move_last"] == {"run": 1, "function": 3}
    assert found["cat"] == {"run": 32 * 128, "function": 1}
    assert found["slice"] == {"run": 64 * 128, "function": 1}   # [1, 8, 64, 128] → [1, 4, 64, 128]
    from tapeout.estimation import kernel_shape

    assert kernel_shape.inserted_shape("movement", "ReorderOutput") == (("run", 1), ("function", 3))
    assert kernel_shape.inserted_shape("quantize", "DequantizeLinear") == (("function", 2),)
    # the GRU of the chain above: its input width and hidden size
    chain = GraphView.load(_chain(tmp_path / "chain.onnx"), [InputSpec(name="x", shape=[4, 2, 8])], {})
    cell = next(k for k in kern.structure(chain, analyze_view(chain)) if k.cls == "recurrent")
    assert dict(cell.shape) == {"input": 8, "hidden": 8, "function": 2}
    # points swept before: a square conv's width is its positions' root, a Transpose's run its kept axis
    assert sweep.point_shape({"cls": "conv", "op": "Conv", "shape": {"positions": 49}})["width"] == 7
    assert sweep.point_shape({"cls": "conv", "op": "Conv1d", "shape": {"positions": 300}})["width"] == 300
    old = {"cls": "movement", "op": "Transpose", "config": {"a": 2, "b": 8, "c": 24}, "shape": {}}
    assert sweep.point_shape(old) == {"run": 24, "function": 3}
    assert sweep.point_shape({**old, "config": {"a": 2, "b": 8, "c": 24, "inner": 1}})["run"] == 1
    gather = {"cls": "movement", "op": "Gather", "config": {"vocab": 300, "width": 48, "rows": 5}, "shape": {}}
    assert sweep.point_shape(gather) == {"run": 48, "function": 2}
    concat = {"cls": "movement", "op": "Concat", "config": {"a": 2, "b": 8, "c": 24}, "shape": {}}
    assert sweep.point_shape(concat)["run"] == 8 * 24


def test_a_matmul_reads_how_its_depth_and_columns_align_and_the_sweep_draws_aligned_ones():
    """A GEMM on AMX tiles pads a depth off the tile: OpenVINO ran an NNCF INT8 128 × 768 × 768 in 137 µs and 129 ×
    767 × 770 in 204 on one thread of this project's Xeon. A log of k cannot say which depths divide, so a MatMul's
    shape features carry the largest power of two (up to 64) dividing its k and its n, and the sweep draws half its
    depths and widths on multiples of 16, 32 or 64, as models have them."""
    import random

    from tapeout.estimation import sweep_draws

    names = predictor.SHAPE_FEATURES["matmul"]
    assert predictor.with_derived({"m": 128, "k": 256, "n": 96}, names) == \
        {"m": 128, "k": 256, "n": 96, "k_align": 64, "n_align": 32}
    assert predictor.with_derived({"m": 128, "k": 255, "n": 770}, names) == \
        {"m": 128, "k": 255, "n": 770, "k_align": 1, "n_align": 2}
    drawn = [dict(c.sizes) for c in (sweep_draws.sample("matmul", random.Random(i)) for i in range(600))]
    depths = [s["k"] for s in drawn]
    assert all(16 <= k <= 4096 for k in depths)
    assert 0.35 <= sum(k % 32 == 0 for k in depths) / len(depths) <= 0.65  # log-uniform alone: ~3 %
    assert any(k % 16 for k in depths)  # the log-uniform half still draws depths off every tile
    assert sum(s["n"] % 32 == 0 for s in drawn) / len(drawn) >= 0.35


def test_training_tells_an_aligned_depth_from_a_padded_one():
    """MatMuls whose time doubles where the depth is off a multiple of 32: the trained class prices a depth of 256
    at half a depth of 255 (its FLOPs and bytes all but the same), which it cannot without the alignment features."""
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(600):
        m, k, n = (int(v) for v in np.exp(rng.uniform(np.log([4, 16, 16]), np.log([512, 1024, 1024]))))
        if rng.random() < 0.5:
            k = max(32, round(k / 32) * 32)
        flops = 2.0 * m * k * n
        roof_s = flops / 1e11
        rows.append({"cls": "matmul", "precision": "fp32", "flops": flops, "bytes": 4.0 * (m * k + k * n + m * n),
                     "nodes": 1, "launches": 1, "roof_s": roof_s, "kernel_s": roof_s * (1.0 if k % 32 == 0 else 2.0),
                     "shape": {"m": m, "k": k, "n": n}})
    model = predictor.train(rows)["matmul"]
    assert model.features[-2:] == ["k_align", "n_align"]
    pred = _predictor({"matmul": model})

    def priced(k: int) -> float:
        flops = 2.0 * 128 * k * 256
        return pred.kernel_s("matmul", flops, 4.0 * (128 * k + k * 256 + 128 * 256), flops / 1e11, 1, 1,
                             {"m": 128, "k": k, "n": 256})

    assert priced(255) / priced(256) == pytest.approx(2.0, rel=0.2)
