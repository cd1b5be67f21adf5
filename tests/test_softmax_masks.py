"""A Softmax's masked share: measured on the model's own inputs, swept, and read by the reduce predictor. On an Intel
Xeon with AMX ONNX Runtime's Softmax ran ~5x slower over a causal mask's entries than over N(0, 1) logits, so the
share is a kernel feature (estimation/softmax_masks.py)."""

import random

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tapeout.core.schemas import InputSpec
from tapeout.estimation import cost_units, predictor, softmax_masks, sweep_draws
from tapeout.estimation import sweep as sweeping
from tapeout.measurement import kernel_timer

LOWEST = np.finfo(np.float32).min


def _two_softmaxes(path, n=8):
    """x → Where(causal, x, lowest) → Softmax, and x → Softmax: a masked attention and a plain one."""
    causal = numpy_helper.from_array(np.tril(np.ones((n, n), dtype=bool)), "causal")
    lowest = numpy_helper.from_array(np.array(LOWEST, dtype=np.float32), "lowest")
    graph = helper.make_graph(
        [helper.make_node("Where", ["causal", "x", "lowest"], ["scores"], name="mask"),
         helper.make_node("Softmax", ["scores"], ["masked"], axis=-1, name="sm_masked"),
         helper.make_node("Softmax", ["x"], ["plain"], axis=-1, name="sm_plain")],
        "attn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, n, n])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2, n, n]) for o in ("masked", "plain")],
        initializer=[causal, lowest])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_the_masked_share_is_the_inputs_far_under_their_rows_largest():
    rows = np.random.default_rng(0).standard_normal((2, 8, 8)).astype(np.float32)
    assert softmax_masks.masked_percent(rows) == 0.0
    for fill in (LOWEST, -np.inf, -1e5):
        causal = np.where(np.tril(np.ones((8, 8), dtype=bool)), rows, fill)
        assert softmax_masks.masked_percent(causal) == 28 / 64 * 100  # the strict upper triangle
    # the feature: 1 + the percent, whole, 1 to 101 (a predictor takes its log)
    assert [softmax_masks.feature(p) for p in (0.0, 43.75, 100.0, 120.0)] == [1, 45, 101, 101]


def test_each_softmax_is_measured_on_the_models_own_inputs_and_kept_in_its_kernels_shape(tmp_path):
    from tapeout.graph.analyze import analyze_view
    from tapeout.graph.view import GraphView

    path = _two_softmaxes(tmp_path / "attn.onnx")
    x = np.random.default_rng(1).standard_normal((2, 8, 8)).astype(np.float32)
    percents = softmax_masks.measured(path, {"x": x})
    assert percents == {"sm_masked": 28 / 64 * 100, "sm_plain": 0.0}
    view = GraphView.load(path)
    kernels = softmax_masks.with_masks(cost_units.structure(view, analyze_view(view)), percents)
    by_lead = {k.lead: dict(k.shape).get("masked") for k in kernels if k.cls == "reduce"}
    assert by_lead == {"sm_masked": 45, "sm_plain": 1}
    # a run that cannot be made leaves the feature out (its kernels priced as unmasked), never a traceback
    assert softmax_masks.measured(path, {"x": x[:, :4]}) is None
    assert softmax_masks.measured(tmp_path / "missing.onnx", {"x": x}) is None
    assert softmax_masks.with_masks(kernels, None) == kernels
    # a model without a Softmax: nothing to read, said apart from a run that failed
    onnx.save(helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "plain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]), opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8), tmp_path / "relu.onnx")
    assert softmax_masks.measured(tmp_path / "relu.onnx", {"x": np.ones(2, np.float32)}) == {}


def test_the_sweep_draws_masked_softmaxes_and_feeds_them_masked():
    rng = random.Random(0)
    drawn = [c for c in (sweep_draws.sample("reduce", rng) for _ in range(700)) if c.op == "Softmax"]
    masked = [c for c in drawn if "masked" in dict(c.sizes)]
    assert 0.3 < len(masked) / len(drawn) < 0.7 and all(5 <= c["masked"] <= 95 for c in masked)
    spec = InputSpec(name="x", shape=[3, 10], dtype="float32")
    fed = kernel_timer._feed(spec, {"masked": 40}, np.random.default_rng(0))
    assert (fed[:, 6:] == LOWEST).all() and np.isfinite(fed[:, :6]).all() and (fed[:, :6] > -10).all()
    # the point's shape carries what its feed masked; one drawn before the feature reads as unmasked
    point = {"op": "Softmax", "cls": "reduce", "config": {"rows": 3, "width": 10, "masked": 40},
             "shape": {"pool_layout": 1, "masked": 1}}
    assert sweeping.point_shape(point)["masked"] == 41
    assert sweeping.point_shape({**point, "config": {"rows": 3, "width": 10}})["masked"] == 1


def test_the_reduce_predictor_reads_the_masked_share_and_every_other_reduce_kernel_as_unmasked():
    assert "masked" in predictor.SHAPE_FEATURES["reduce"]
    plain = predictor.features(1e4, 8e4, 1e-6, 1, 1, "reduce", {})
    masked = predictor.features(1e4, 8e4, 1e-6, 1, 1, "reduce", {"masked": 51})
    names = predictor.SHAPE_FEATURES["reduce"]
    assert plain[5 + names.index("masked")] == 0.0 and masked[5 + names.index("masked")] == np.log(51)
