"""FP16 for GPUs (the gpu-float rule set of ort-cuda): plans per family, the conversion and its
postcondition, and accuracy on real weights. The converted models run on ONNX Runtime's CPU EP here,
which has FP16 kernels: the numerics of the plan are tested for real, the GPU's speed is not."""

from __future__ import annotations

import sys

import graphs
import numpy as np
import onnx
import pytest

from conftest import SAMPLES, run_cli
from tapeout import targets
from tapeout.core.errors import BadInput
from tapeout.core.parity import cosine
from tapeout.core.profile_schema import QuantizationSettings
from tapeout.core.schemas import InputSpec
from tapeout.graph.analyze import analyze
from tapeout.quantize import rules
from tapeout.quantize.apply import apply

CUDA = targets.TARGETS["ort-cuda"].capabilities


def _fp16_plan(tmp_path, model, **settings):
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    analysis = analyze(path)
    return rules.first_plan(analysis, "ort-cuda", CUDA, "fp16", QuantizationSettings(**settings)), path, analysis


def test_rules_come_from_the_capabilities_not_the_name(tmp_path):
    """A target named anything with the gpu-float rule set gets the FP16 plan and its own ladder."""
    from dataclasses import replace

    onnx.save(graphs.cnn(), tmp_path / "cnn.onnx")
    analysis = analyze(tmp_path / "cnn.onnx")
    custom = replace(CUDA, precisions={"fp16": ("fp16", "fp32")})
    plan = rules.first_plan(analysis, "my-new-gpu-target", custom, "fp16", QuantizationSettings())
    assert plan.method == "float16" and plan.target == "my-new-gpu-target" and plan.ladder == ("fp16", "fp32")
    with pytest.raises(BadInput, match="has no fp16 rules"):
        rules.first_plan(analysis, "my-new-gpu-target", replace(custom, rules=None), "fp16", QuantizationSettings())


def test_fp16_rules_per_family(tmp_path):
    encoder, _, _ = _fp16_plan(tmp_path, graphs.transformer())
    assert encoder.ladder == ("fp16", "fp32") and {g.precision for g in encoder.groups} == {"fp16"}
    assert {"Pow", "ReduceMean", "Sqrt"} <= set(encoder.float_ops)  # decomposed-norm statistics stay FP32
    cnn, _, _ = _fp16_plan(tmp_path, graphs.cnn())
    assert not cnn.float_ops and {g.precision for g in cnn.groups} == {"fp16"}
    lstm, _, analysis = _fp16_plan(tmp_path, graphs.recurrent())
    cell = next(g for g in lstm.groups if g.role == "recurrent_cell")  # the LSTM is a group, kept FP32
    assert cell.precision == "fp32" and "accumulates over the time steps" in cell.reason
    unet, _, analysis = _fp16_plan(tmp_path, graphs.diffusion())
    assert unet.float_nodes and {analysis.roles[n] for n in unet.float_nodes} == {"timestep_embedding"}
    kept, _, _ = _fp16_plan(tmp_path, graphs.transformer(), keep_float=["block1.ffn.out"])
    assert {g.group: g.precision for g in kept.groups}["block1.ffn.out"] == "fp32"
    with pytest.raises(BadInput, match="float conversion, not a quantization method"):
        _fp16_plan(tmp_path, graphs.transformer(), method="dynamic")


@pytest.mark.parametrize("family", ["encoder", "decoder", "cnn", "lstm", "unet"])
def test_fp16_plans_convert_and_run_close_to_fp32(tmp_path, family):
    import onnxruntime as ort

    model = {
        "encoder": graphs.transformer(),
        "decoder": graphs.transformer(causal=True, lm_head=True, swiglu=True),
        "cnn": graphs.cnn(),
        "lstm": graphs.recurrent(),
        "unet": graphs.diffusion(),
    }[family]
    plan, path, _ = _fp16_plan(tmp_path, model)
    info = apply(plan, path, tmp_path / "fp16.onnx")
    converted = onnx.load(tmp_path / "fp16.onnx")
    assert info["method"] == "float16"
    assert [i.type.tensor_type.elem_type for i in converted.graph.input] == [
        i.type.tensor_type.elem_type for i in model.graph.input
    ]
    weights = [
        i.data_type
        for i in converted.graph.initializer
        if i.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    ]
    assert weights.count(onnx.TensorProto.FLOAT16) > weights.count(onnx.TensorProto.FLOAT)
    produced = {o: n for n in converted.graph.node for o in n.output}
    for node in (n for n in converted.graph.node if n.op_type in plan.float_ops):  # their inputs are cast back to FP32
        first = produced.get(node.input[0])
        assert first is None or first.op_type != "Cast" or first.attribute[0].i == onnx.TensorProto.FLOAT, node.name
    rng = np.random.default_rng(0)
    feeds = {
        i.name: (
            rng.integers(0, 64, (1, 8))
            if i.type.tensor_type.elem_type == onnx.TensorProto.INT64
            else rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        )
        for i in model.graph.input
    }
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    out = ort.InferenceSession(str(tmp_path / "fp16.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.isfinite(out).all() and cosine(out, ref) > 0.999


def test_the_postcondition_catches_a_conversion_that_did_not_follow_the_plan(tmp_path):
    """The plan says the MatMuls run in FP16 but an op block list keeps MatMul FP32: the converter obeys the
    block list silently; the weight check after conversion refuses to hand that model on."""
    from dataclasses import replace

    plan, path, _ = _fp16_plan(tmp_path, graphs.mlp())
    with pytest.raises(BadInput, match="FP16 conversion did not follow the plan"):
        apply(replace(plan, float_ops=("MatMul",)), path, tmp_path / "bad.onnx")
    assert not (tmp_path / "bad.onnx").exists()


@pytest.mark.slow
def test_minilm_fp16_plan_keeps_the_embeddings(tmp_path):
    """Real weights: the sample's own metric (mean cosine of sentence embeddings vs FP32, 300 sentences)
    for the FP16 plan the rule table writes, run on the CPU EP (FP16 kernels) instead of the GPU."""
    exported = tmp_path / "minilm.onnx"
    assert run_cli("export", SAMPLES / "minilm", "--out", exported).code == 0
    inputs = [
        InputSpec(name=n, shape=["batch", "sequence"], dtype="int64")
        for n in ("input_ids", "attention_mask", "token_type_ids")
    ]
    analysis = analyze(exported, inputs, {"batch": 1, "sequence": 128})
    plan = rules.first_plan(analysis, "ort-cuda", CUDA, "fp16", QuantizationSettings())
    apply(plan, exported, tmp_path / "fp16.onnx")
    # the sample's modules by their plain names: another sample imported in this worker (speech-vad's model.py is
    # `model` too) would be found first, so they are imported afresh and taken out again
    plain = ("metric", "text", "model")
    others = {name: sys.modules.pop(name) for name in plain if name in sys.modules}
    sys.path.insert(0, str(SAMPLES / "minilm"))
    try:
        import metric
    finally:
        sys.path.remove(str(SAMPLES / "minilm"))
        for name in plain:
            sys.modules.pop(name, None)
        sys.modules.update(others)
    assert metric.mean_cosine(targets.reference_session(tmp_path / "fp16.onnx").run) > 0.999


@pytest.mark.slow
def test_tiny_lm_fp16_plan_converts_with_its_learned_positions(tmp_path):
    """The decoder sample's position embedding is a Gather of a learned table at constant integer
    positions: the postcondition checks the table's precision, not the positions' (it once read the
    int64 positions as a weight left in FP32 and refused the build, seen on an H100)."""
    exported = tmp_path / "tiny-lm.onnx"
    assert run_cli("export", SAMPLES / "tiny-lm" / "forward.toml", "--out", exported).code == 0
    analysis = analyze(exported, [InputSpec(name="input_ids", shape=["batch", 128], dtype="int64")], {"batch": 1})
    plan = rules.first_plan(analysis, "ort-cuda", CUDA, "fp16", QuantizationSettings())
    apply(plan, exported, tmp_path / "fp16.onnx")
    converted = onnx.load(tmp_path / "fp16.onnx")
    tables = {i.name: i for i in converted.graph.initializer}
    gathers = [n for n in converted.graph.node if n.op_type == "Gather" and n.input[0] in tables]
    planned = set(plan.nodes_at("fp16"))
    assert gathers and all(
        tables[n.input[0]].data_type == onnx.TensorProto.FLOAT16 for n in gathers if n.name in planned
    )
    feeds = {"input_ids": np.arange(128, dtype=np.int64)[None] % 256}
    ref = ort_run(exported, feeds)
    out = ort_run(tmp_path / "fp16.onnx", feeds)
    assert np.isfinite(out).all() and cosine(out, ref) > 0.999


def ort_run(path, feeds):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_repeated_casts_from_older_converters_are_merged():
    """onnxruntime 1.31's FP16 converter writes one Cast back to FP32 per blocked consumer, all named alike
    with one output: ORT refuses that model. The merge keeps one Cast and the model runs as intended."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from tapeout.quantize.passes.base import run_on_proto
    from tapeout.quantize.passes.merge_casts import MergeRepeatedCasts

    cast_back = helper.make_node("Cast", ["h"], ["h_cast_to_fp32"], to=TensorProto.FLOAT, name="h_cast_to_fp32_node")
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16, name="to_fp16"),
        cast_back,
        helper.make_node("Softmax", ["h_cast_to_fp32"], ["a"], name="softmax"),
        cast_back,
        helper.make_node("ReduceMax", ["h_cast_to_fp32"], ["b"], name="max", keepdims=1),
        helper.make_node("Add", ["a", "b"], ["y"], name="add"),
    ]
    value = helper.make_tensor_value_info("h_cast_to_fp32", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        value_info=[value, value],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    with pytest.raises(Exception, match="same node name"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    model, done = run_on_proto(model, [MergeRepeatedCasts()])
    assert [r["outcome"] for r in done] == ["applied"]
    assert [n.name for n in model.graph.node].count("h_cast_to_fp32_node") == 1 and len(model.graph.value_info) == 1
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    h = x.astype(np.float16).astype(np.float32)
    softmax = np.exp(h - h.max(1, keepdims=True)) / np.exp(h - h.max(1, keepdims=True)).sum(1, keepdims=True)
    np.testing.assert_allclose(y, softmax + h.max(), rtol=1e-5)  # ReduceMax without axes: over all
