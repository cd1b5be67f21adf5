"""The `pack-projections` target pass: sibling quantized projections of one activation as one product, in each
form ONNX Runtime's CPU target compiles them (dynamic INT8, 4-bit MatMulNBits), computing exactly what the separate
projections did; FP32 left as exported. Its GroupQueryAttention form (packed QKV) runs here on a small graph and in
the Hugging Face Llama INT4 build of test_generate."""

from __future__ import annotations

import collections

import graphs
import numpy as np
import onnx
import pytest

from tapeout import targets
from tapeout.core.profile_schema import QuantizationSettings
from tapeout.core.schemas import InputSpec
from tapeout.graph.analyze import analyze
from tapeout.quantize import rules
from tapeout.quantize.apply import apply
from tapeout.quantize.passes import pack_projections
from tapeout.quantize.passes.base import run_on_proto

CACHE_INPUTS = [
    InputSpec(name="input_ids", shape=[1, 8], dtype="int64"),
    InputSpec(name="past_key_0", shape=[1, 2, "past", 16]),
]
PROJECTION_OPS = {"MatMul", "MatMulInteger", "MatMulNBits"}


def _decoder(tmp_path, precision: str):
    """A 2-layer SwiGLU decoder (Q, K, V and gate, up read one activation each), at `precision` as the
    onnxruntime target's rules quantize it."""
    path = tmp_path / "fp32.onnx"
    onnx.save(graphs.transformer(causal=True, lm_head=True, swiglu=True, layers=2), path)
    if precision == "fp32":
        return onnx.load(path)
    plan = rules.first_plan(
        analyze(path), "onnxruntime", targets.TARGETS["onnxruntime"].capabilities, precision, QuantizationSettings()
    )
    assert plan.method == {"int8": "dynamic", "int4": "weight-only"}[precision]
    apply(plan, path, tmp_path / "q.onnx", max_ir_version=10)
    return onnx.load(tmp_path / "q.onnx")


def _outputs(model) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(3).integers(0, 64, (1, 8))
    return session.run(None, {"input_ids": ids})


def _packed(model):
    """The pass run on a copy (a protobuf pass rewrites the model it is given)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return run_on_proto(copy, [pack_projections.PackProjections(CACHE_INPUTS, {})])


def _projections(model) -> int:
    """The products with a constant weight: MatMulInteger and MatMulNBits, and MatMul with an initializer."""
    weights = {i.name for i in model.graph.initializer}
    return sum(
        n.op_type in PROJECTION_OPS and (n.op_type != "MatMul" or n.input[1] in weights) for n in model.graph.node
    )


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_packed_projections_compute_what_the_separate_ones_did(tmp_path, precision):
    """Per layer Q/K/V become one product and gate/up another (7 projections → 4), each split back; the outputs
    are bit-identical (per-column scales and zero points concatenated)."""
    model = _decoder(tmp_path, precision)
    before = _projections(model)
    packed, records = _packed(model)
    assert records == [
        {
            "name": "pack-projections",
            "stage": "target",
            "outcome": "applied",
            "rewrites": 4,
            "reason": "rewrote 4 place(s)",
        }
    ]
    assert before == 2 * 7 + 1 and _projections(packed) == 2 * 4 + 1
    ops = collections.Counter(n.op_type for n in packed.graph.node)
    assert ops["Split"] == 4
    if precision == "int8":  # one activation quantizer per packed product, as before per activation
        assert (
            ops["DynamicQuantizeLinear"]
            == collections.Counter(n.op_type for n in model.graph.node)["DynamicQuantizeLinear"]
        )
    for separate, together in zip(_outputs(model), _outputs(packed), strict=True):
        np.testing.assert_array_equal(together, separate)


def test_a_planted_error_in_the_packing_changes_the_outputs(tmp_path, monkeypatch):
    """The comparison above can fail: members concatenated in one order and split in another compute wrong."""
    model = _decoder(tmp_path, "int4")
    real = pack_projections._split

    def reversed_split(model, members, packed, tag):
        return real(model, members[::-1], packed, tag)

    monkeypatch.setattr(pack_projections, "_split", reversed_split)
    packed, _ = _packed(model)
    # Q, K, V are equally wide here (and gate, up), so the swapped split runs, and computes something else
    assert not all(
        np.array_equal(together, separate) for separate, together in zip(_outputs(model), _outputs(packed), strict=True)
    )


def test_it_runs_on_cache_graphs_only_and_packs_only_quantized_siblings_of_one_form(tmp_path):
    """A forward workload keeps its projections (the pass is priced for one-row decode); FP32 projections stay as
    exported (packing them was measured mixed); projections of one activation at different bit widths are not one
    product."""
    forward = [InputSpec(name="input_ids", shape=[1, 8], dtype="int64")]
    _, records = run_on_proto(_decoder(tmp_path, "int4"), [pack_projections.PackProjections(forward, {})])
    assert records[0]["outcome"] == "skipped" and "not a KV-cache graph" in records[0]["reason"]
    _, records = _packed(_decoder(tmp_path, "fp32"))
    assert records[0]["outcome"] == "skipped" and "FP32 MatMuls are left as exported" in records[0]["reason"]

    from onnx import TensorProto, helper

    def nbits(name: str, bits: int):
        blob = 32 * bits // 8
        return (
            [
                helper.make_tensor(f"{name}.B", TensorProto.UINT8, [8, 2, blob], bytes(8 * 2 * blob), raw=True),
                helper.make_tensor(f"{name}.scales", TensorProto.FLOAT, [16], [1.0] * 16),
            ],
            helper.make_node(
                "MatMulNBits",
                ["x", f"{name}.B", f"{name}.scales"],
                [name],
                name=name,
                domain="com.microsoft",
                K=64,
                N=8,
                bits=bits,
                block_size=32,
            ),
        )

    (b4, n4), (b8, n8) = nbits("y4", 4), nbits("y8", 8)
    graph = helper.make_graph(
        [n4, n8],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, None) for y in ("y4", "y8")],
        b4 + b8,
    )
    mixed = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    _, records = run_on_proto(mixed, [pack_projections.PackProjections(CACHE_INPUTS, {})])
    assert (
        records[0]["outcome"] == "skipped" and records[0]["reason"] == pack_projections.PackProjections.nothing_matched
    )


def _attention_and_mlp_on_one_activation():
    """Phi-2's layout in small: Q, K, V and the MLP's first projection read one activation; Q, K, V feed a
    GroupQueryAttention (4 query heads, 2 key/value heads of 16), whose key and value start empty. The four
    projections are 4-bit MatMulNBits, as ORT's quantizer writes them."""
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    rng = np.random.default_rng(5)
    widths = {"q": 64, "k": 32, "v": 32, "fc": 64}
    inits = [
        numpy_helper.from_array((rng.standard_normal((64, n)) * 0.1).astype(np.float32), f"w_{p}")
        for p, n in widths.items()
    ]
    inits += [
        numpy_helper.from_array(np.array([5], np.int32), "seqlens_k"),
        numpy_helper.from_array(np.array(6, np.int32), "total"),
    ]
    nodes = [helper.make_node("MatMul", ["x", f"w_{p}"], [p], name=f"{p}_proj") for p in widths]
    nodes.append(
        helper.make_node(
            "GroupQueryAttention",
            ["q", "k", "v", "past_key_0", "past_value_0", "seqlens_k", "total"],
            ["attn", "present_key_0", "present_value_0"],
            name="gqa",
            domain="com.microsoft",
            num_heads=4,
            kv_num_heads=2,
        )
    )
    past = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 0, 16]) for n in ("past_key_0", "past_value_0")]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 64]), *past],
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
            for n in ("attn", "fc", "present_key_0", "present_value_0")
        ],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    quantizer = MatMulNBitsQuantizer(model, algo_config=DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True))
    quantizer.process()
    return quantizer.model.model


def test_qkv_becomes_the_attentions_packed_input_and_a_sibling_left_over_stays(tmp_path):
    """Q, K, V packed into GroupQueryAttention's query input (key and value empty) compute the same attention and
    cache; the MLP's projection of the same activation is left alone, and the check after the rewrite accepts
    the packed QKV and it as siblings."""
    import onnxruntime as ort

    model = _attention_and_mlp_on_one_activation()
    packed, records = _packed(model)
    assert (records[0]["outcome"], records[0]["rewrites"]) == ("applied", 1)
    attention = next(n for n in packed.graph.node if n.op_type == "GroupQueryAttention")
    assert list(attention.input[1:3]) == ["", ""]
    assert [n.op_type for n in model.graph.node].count("MatMulNBits") == 4
    assert [n.op_type for n in packed.graph.node].count("MatMulNBits") == 2
    assert not any(n.op_type == "Split" for n in packed.graph.node)
    feeds = {
        "x": np.random.default_rng(2).standard_normal((1, 6, 64)).astype(np.float32),
        "past_key_0": np.zeros((1, 2, 0, 16), np.float32),
        "past_value_0": np.zeros((1, 2, 0, 16), np.float32),
    }
    runs = [
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        for m in (model, packed)
    ]
    for separate, together in zip(*runs, strict=True):
        np.testing.assert_allclose(together, separate, rtol=1e-5, atol=1e-6)
