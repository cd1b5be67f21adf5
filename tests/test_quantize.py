"""The rule table's plans per family and target, applying them with onnxruntime, and the sensitivity loop
finding a planted sensitive layer."""

from __future__ import annotations

import json

import graphs
import numpy as np
import onnx
import pytest

from conftest import one_line_error, run_cli
from tapeout import targets
from tapeout.core.errors import BadInput
from tapeout.core.profile_schema import QuantizationSettings
from tapeout.graph.analyze import analyze
from tapeout.quantize import rules
from tapeout.quantize.apply import apply


def first_plan(analysis, target: str, precision: str, settings: QuantizationSettings):
    """The rule table as the precision step calls it: with the target's capabilities, never its name alone."""
    return rules.first_plan(analysis, target, targets.TARGETS[target].capabilities, precision, settings)


def _plan(tmp_path, model, precision="int8", **settings):
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return first_plan(analyze(path), "onnxruntime", precision, QuantizationSettings(**settings)), path


def _by_precision(plan):
    return {g.group: g.precision for g in plan.groups}


def test_a_tied_lm_head_gets_its_8_bits_from_nncf_too(tmp_path):
    """The same tied head on OpenVINO: NNCF leaves a constant the embedding Gather shares uncompressed (the plan's
    postcondition then failed the build, as it did for samples/llama-40m), so the untie pass runs first there too."""
    from tapeout.quantize.methods.nncf_weights import NncfWeights
    from tapeout.quantize.openvino_nncf import check_written

    model = graphs.transformer(causal=True, lm_head=True, swiglu=True, tied=True)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    plan = first_plan(analyze(path), "openvino", "int4", QuantizationSettings())
    assert plan.method == "nncf-weights" and _by_precision(plan)["lm_head"] == "int8-weight"
    out = tmp_path / "q" / "model.xml"
    info = NncfWeights().apply(plan, path, out, None)
    assert {r["name"]: r["rewrites"] for r in info["passes"]}["untie-transposed-weight"] == 1
    assert info["nodes"]["int8-weight"] == 1 and not (out.parent / "untied").exists()
    check_written(plan, path, out)  # every planned node at its rung, the embedding table float


def test_encoder_int8_is_dynamic_on_the_linears_only(tmp_path):
    plan, _ = _plan(tmp_path, graphs.transformer())
    assert plan.method == "dynamic" and plan.per_channel and plan.ladder == ("int8", "fp32")
    groups = _by_precision(plan)
    assert groups.pop("embedding1") == "fp32"
    assert set(groups.values()) == {"int8"}  # qkv, out, ffn.in, ffn.out of both blocks
    reasons = {g.group: g.reason for g in plan.groups}
    assert "lookup" in reasons["embedding1"]


def test_decoder_int4_puts_the_lm_head_at_8_bits_and_keeps_embeddings(tmp_path):
    plan, _ = _plan(tmp_path, graphs.transformer(causal=True, lm_head=True, swiglu=True), precision="int4")
    assert plan.method == "weight-only" and plan.ladder == ("int4", "int8-weight", "fp32")
    groups = _by_precision(plan)
    assert groups["lm_head"] == "int8-weight" and groups["embedding1"] == "fp32"
    assert groups["block0.ffn.in"] == "int4" and groups["block1.attn.qkv"] == "int4"
    assert "8-bit" in next(g.reason for g in plan.groups if g.group == "lm_head")


def test_decoder_int8_quantizes_a_tied_lm_head_untied_and_a_float_head_left_behind_is_refused(tmp_path):
    """cpu-int8 starts the LM head at dynamic INT8 (read whole for every token: FP32 it was most of a decode step).
    A tied head reads the embedding table through a Transpose, which ORT's dynamic quantizer skips (it takes constant
    weights only): the untie pass gives it a weight of its own first. And the postcondition now counts a float weight
    read through a Transpose as float, so a head left FP32 under an INT8 plan is refused, not reported as INT8."""
    from tapeout.quantize.methods.dynamic import Dynamic
    from tapeout.quantize.ort_tools import check_quantized

    plan, path = _plan(tmp_path, graphs.transformer(causal=True, lm_head=True, swiglu=True, tied=True))
    groups = _by_precision(plan)
    assert plan.method == "dynamic" and groups["lm_head"] == "int8" and groups["embedding1"] == "fp32"
    assert "read whole for every token" in next(g.reason for g in plan.groups if g.role == "lm_head")
    head = next(g for g in plan.groups if g.role == "lm_head").nodes
    with pytest.raises(BadInput, match=r"left 1 of .* planned node\(s\) in float"):
        check_quantized(head, path, "dynamic INT8")  # the unquantized model: the tied head is float
    out = tmp_path / "q" / "model.onnx"
    out.parent.mkdir()
    info = Dynamic().apply(plan, path, out, None)
    assert {r["name"]: r["rewrites"] for r in info["passes"]}["untie-transposed-weight"] == 1
    Dynamic().postcondition(plan, path, out)
    written = onnx.load(str(out))
    assert not [n for n in written.graph.node if n.name in head and n.op_type == "MatMul"]
    assert "Gather" in {n.op_type for n in written.graph.node}  # the table itself stays for the embedding lookup


def test_cpu_int8_takes_a_4_bit_lm_head_when_asked_the_body_stays_dynamic_int8(tmp_path):
    """`overrides = { lm_head = "int4" }` on cpu-int8: the head (tied) becomes a 4-bit MatMulNBits with integer
    compute, every other planned linear dynamic INT8, and the loop's next rung for the head is INT8. The
    postcondition refuses a model whose planned 4-bit head is not a MatMulNBits."""
    import onnxruntime as ort

    from tapeout.quantize.methods.dynamic import Dynamic
    from tapeout.quantize.ort_tools import check_nbits
    from tapeout.quantize.rules import InstructionSet

    plan, path = _plan(
        tmp_path, graphs.transformer(causal=True, lm_head=True, swiglu=True, tied=True), overrides={"lm_head": "int4"}
    )
    groups = _by_precision(plan)
    head = next(g for g in plan.groups if g.role == "lm_head").nodes
    assert plan.method == "dynamic" and groups["lm_head"] == "int4" and groups["block0.ffn.in"] == "int8"
    # the plan's ladder starts under the precision where a group is there, so the loop moves the head up through it
    assert plan.ladder == ("int4", "int8", "fp32")
    assert plan.next_rung("lm_head") == "int8" and plan.next_rung("block0.ffn.in") == "fp32"
    with pytest.raises(BadInput, match=r"left 1 of 1 planned node\(s\) without MatMulNBits"):
        check_nbits(head, 4, path)
    out = tmp_path / "q" / "model.onnx"
    out.parent.mkdir()
    info = Dynamic().apply(plan, path, out, None)
    assert info["matmul_nbits"]["nodes"] == 1 and info["nodes"] == len(plan.nodes_at("int8"))
    Dynamic().postcondition(plan, path, out)
    written = onnx.load(str(out))
    nbits = [n for n in written.graph.node if n.op_type == "MatMulNBits"]
    assert [n.name.rsplit("_Q", 1)[0] for n in nbits] == list(head)
    assert {a.name: a.i for a in nbits[0].attribute}["bits"] == 4
    assert {a.name: a.i for a in nbits[0].attribute}.get("accuracy_level") == plan.accuracy_level
    assert not [n for n in written.graph.node if n.op_type == "MatMul" and n.name in plan.nodes_at("int8")]
    assert not list(out.parent.glob("*.nbits.onnx"))  # the staged model is gone
    feeds = {"input_ids": np.random.default_rng(0).integers(0, 64, (1, 8))}
    a = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0].ravel()
    b = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)[0].ravel()
    assert np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.95
    # without AVX2, MatMulNBits unpacks its weights every call: the head goes to INT8, saying why
    onnx.save(graphs.transformer(causal=True, lm_head=True, swiglu=True), tmp_path / "plain.onnx")
    slow = rules.first_plan(
        analyze(tmp_path / "plain.onnx"),
        "onnxruntime",
        targets.TARGETS["onnxruntime"].capabilities,
        "int8",
        QuantizationSettings(overrides={"lm_head": "int4"}),
        isa=InstructionSet("x86_64", frozenset({"sse4_2"}), "test"),
    )
    assert _by_precision(slow)["lm_head"] == "int8" and slow.accuracy_level is None and slow.ladder == ("int8", "fp32")
    assert "without AVX2" in next(g.reason for g in slow.groups if g.group == "lm_head")


def test_a_4_bit_override_where_the_method_writes_only_int8_is_one_line(tmp_path):
    """cpu-int8 offers an int4 rung under its ladder for the dynamic method's LM head; static QDQ (a CNN's method)
    has no 4-bit form, so a 4-bit override there is refused in one line, not written as INT8 without a word."""
    with pytest.raises(BadInput, match=r'conv1 = "int4": the static method does not write int4') as err:
        _plan(tmp_path, graphs.cnn(), overrides={"conv1": "int4"})
    assert "int8, fp32" in err.value.fix


def test_weight_only_compute_follows_the_instruction_set_and_never_starts_a_slow_8_bit_head(tmp_path):
    """int8 compute (accuracy_level 4) where MLAS has integer kernels (x86-64 AVX2+, arm64); without it an 8-bit
    MatMulNBits unpacks its weights every call (52 ms against FP32's 1.25 ms, measured), so the head stays FP32."""
    from tapeout.quantize.rules import InstructionSet

    path = tmp_path / "model.onnx"
    onnx.save(graphs.transformer(causal=True, lm_head=True, swiglu=True), path)
    analysis = analyze(path)
    for isa, level, head in (
        (InstructionSet("x86_64", frozenset({"avx2", "fma"}), "test"), 4, "int8-weight"),
        (InstructionSet("arm64", frozenset(), "test"), 4, "int8-weight"),
        (InstructionSet("x86_64", frozenset({"sse4_2"}), "test"), None, "fp32"),
    ):
        plan = rules.first_plan(
            analysis,
            "onnxruntime",
            targets.TARGETS["onnxruntime"].capabilities,
            "int4",
            QuantizationSettings(),
            isa=isa,
        )
        assert plan.accuracy_level == level and _by_precision(plan)["lm_head"] == head, isa
        assert _by_precision(plan)["block0.ffn.in"] == "int4"
        assert any("MatMulNBits compute" in n for n in plan.notes)
    assert "without AVX2" in next(g.reason for g in plan.groups if g.group == "lm_head")


def test_a_tied_lm_head_gets_its_own_8_bit_weight_and_the_embedding_keeps_the_table(tmp_path):
    """Tied embeddings export the head as MatMul(x, Transpose(table)); MatMulNBits takes constant weights only, so
    the untie pass gives the head its own transposed copy first (else the largest matmul of decode stays FP32)."""
    import onnxruntime as ort

    model = graphs.transformer(causal=True, lm_head=True, swiglu=True, tied=True)
    plan, path = _plan(tmp_path, model, precision="int4")
    assert _by_precision(plan)["lm_head"] == "int8-weight"
    out = tmp_path / "q.onnx"
    info = apply(plan, path, out, None, max_ir_version=10)
    assert {r["name"]: r["rewrites"] for r in info["passes"]}["untie-transposed-weight"] == 1
    quantized = onnx.load(out)
    nbits = {
        n.name.rsplit("_Q", 1)[0]: onnx.helper.get_attribute_value(next(a for a in n.attribute if a.name == "bits"))
        for n in quantized.graph.node
        if n.op_type == "MatMulNBits"
    }
    levels = {
        a.i
        for n in quantized.graph.node
        if n.op_type == "MatMulNBits"
        for a in n.attribute
        if a.name == "accuracy_level"
    }
    assert levels == ({4} if plan.accuracy_level == 4 else set())
    head = next(name for name in nbits if name.startswith("lm_head"))
    assert nbits.pop(head) == 8 and set(nbits.values()) == {4}
    assert not any(n.op_type == "Transpose" and n.input[0].startswith("embed") for n in quantized.graph.node)
    gather = next(n for n in quantized.graph.node if n.op_type == "Gather")
    assert gather.input[0] in {i.name for i in quantized.graph.initializer}  # the table, still float, for the lookup
    feeds = {"input_ids": np.random.default_rng(0).integers(0, 64, (1, 8))}
    a = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0].ravel()
    b = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)[0].ravel()
    assert np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.95


def test_cnn_int8_is_static_and_keeps_first_conv_and_head(tmp_path):
    plan, _ = _plan(tmp_path, graphs.cnn())
    assert plan.method == "static"
    assert _by_precision(plan) == {"first_conv": "fp32", "depthwise_conv1": "int8", "conv1": "int8", "head": "fp32"}
    assert any(
        n.startswith("CPU instruction set from the build host's (the profile names no device)") for n in plan.notes
    )


def _int8_plan_for(tmp_path, graph, arch: str, flags: set[str]):
    """onnxruntime's int8 plan for `graph` on a CPU of this architecture and these flags."""
    onnx.save(graph, tmp_path / "m.onnx")
    return rules.first_plan(
        analyze(tmp_path / "m.onnx"),
        "onnxruntime",
        targets.TARGETS["onnxruntime"].capabilities,
        "int8",
        QuantizationSettings(),
        isa=rules.InstructionSet(arch, frozenset(flags), "test"),
    )


@pytest.mark.parametrize(
    "arch, flags, formats",
    [
        ("x86_64", {"avx2"}, ("uint8", True)),  # AVX2 without VNNI: U8S8, 7-bit weights
        ("x86_64", {"avx2", "avx512f", "avx512_vnni"}, ("uint8", False)),  # VNNI: U8S8, 8-bit weights
        ("x86_64", {"avx2", "avx_vnni"}, ("uint8", False)),
        ("arm64", {"asimd", "asimddp"}, ("int8", False)),  # signed dot products: S8S8
    ],
)
def test_static_int8_formats_follow_the_instruction_set(tmp_path, arch, flags, formats):
    plan = _int8_plan_for(tmp_path, graphs.cnn(), arch, flags)
    assert (plan.activation_type, plan.reduce_range) == formats
    assert any(n.startswith("CPU instruction set from test") for n in plan.notes)


@pytest.mark.parametrize(
    "arch, flags, reduce_range",
    [
        ("x86_64", {"avx2", "fma"}, True),  # vpmaddubsw's u8×s8 pair sums saturate int16 with 8-bit weights
        ("x86_64", {"avx2", "avx512f", "avx512_vnni"}, False),
        ("x86_64", {"avx2", "avx_vnni"}, False),
        ("arm64", {"asimd", "asimddp"}, False),
    ],
)
def test_dynamic_int8_takes_7_bit_weights_on_x86_without_vnni(tmp_path, arch, flags, reduce_range):
    """A 3-layer MLP at dynamic INT8 with 8-bit weights kept cosine 0.956 against FP32 on an AVX2-only host (the
    parity floor is 0.99), 0.99993 with 7-bit ones: the instruction set the artifact runs on decides, not the host's."""
    plan = _int8_plan_for(tmp_path, graphs.transformer(), arch, flags)
    assert plan.method == "dynamic" and plan.reduce_range is reduce_range
    assert ("7-bit" in " ".join(plan.notes)) is reduce_range


def test_the_instruction_set_comes_from_the_device_spec_else_the_host():
    from tapeout.core.config import load_device

    lunar = rules.isa_for(load_device("intel-core-ultra-200v"))
    assert lunar.origin == "device spec intel-core-ultra-200v" and lunar.vnni and lunar.arch == "x86_64"
    fallback = rules.isa_for(load_device("h100-sxm"))
    assert fallback.origin == "the build host's (device spec h100-sxm lists no CPU instruction set)"
    assert rules.isa_for(None).origin == "the build host's (the profile names no device)"


def test_lstm_is_a_group_quantized_dynamically_gru_stays_float_and_diffusion_keeps_the_timestep(tmp_path):
    rnn, _ = _plan(tmp_path, graphs.recurrent())
    assert rnn.method == "dynamic"
    assert _by_precision(rnn) == {"linear1": "int8", "recurrent_cell1": "int8", "head": "fp32"}
    gru, _ = _plan(tmp_path, graphs.recurrent(cell="GRU"))
    cell = next(g for g in gru.groups if g.role == "recurrent_cell")
    assert cell.precision == "fp32" and "no integer GRU" in cell.reason
    diff, _ = _plan(tmp_path, graphs.diffusion())
    groups = _by_precision(diff)
    assert groups["timestep_embedding1"] == "fp32" and groups["first_conv"] == "fp32" and groups["conv1"] == "int8"


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_a_speech_recurrent_models_convs_are_int8_after_the_first_and_static_keeps_the_recurrence_float(tmp_path, cell):
    """A conv front-end + recurrent cell + head: the convs after the first are INT8 (a Conv + GRU model's only
    other weighted group is its head, so without them the rule found nothing and the build was refused)."""
    model = graphs.conv_recurrent(channels=8, hidden=64, deep=True, cell=cell)
    plan, path = _plan(tmp_path, model)
    assert plan.family == "speech-recurrent" and plan.method == "dynamic"
    groups = _by_precision(plan)
    assert groups["first_conv"] == "fp32" and groups["conv1"] == "int8" and groups["head"] == "fp32"
    assert groups["recurrent_cell1"] == ("int8" if cell == "LSTM" else "fp32")
    # the override reaches the convs too; ORT's QDQ has no recurrent kernel, so the cell stays float, saying so
    static, _ = _plan(tmp_path, model, method="static")
    cell_plan = next(g for g in static.groups if g.role == "recurrent_cell")
    assert static.method == "static" and _by_precision(static)["conv1"] == "int8"
    assert cell_plan.precision == "fp32"
    assert ("no LSTM/GRU kernel" if cell == "LSTM" else "no integer GRU") in cell_plan.reason
    # and the artifact runs the planned conv in integers (ConvInteger), the first conv in float
    from tapeout.quantize import methods

    out = tmp_path / "int8.onnx"
    methods.get("dynamic").apply(plan, path, out, None)
    quantized = onnx.load(out)
    assert [n.op_type for n in quantized.graph.node].count("ConvInteger") == 1
    assert [n.op_type for n in quantized.graph.node].count("Conv") == 1


def _rate_switched_convs() -> onnx.ModelProto:
    """An If on a rate flag whose branches each run a Conv (+ bias) on weights of the main graph, as torch.cond
    exports: each branch's own conv weights, a scale both branches read, and a bias the main graph reads too."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)

    def init(name, shape):
        return helper.make_tensor(name, TensorProto.FLOAT, shape, rng.normal(0, 0.3, shape).astype(np.float32).ravel())

    def branch(tag):
        nodes = [
            helper.make_node("Conv", ["x", f"w_{tag}", f"b_{tag}"], [f"c_{tag}"], name=f"conv_{tag}"),
            helper.make_node("Mul", [f"c_{tag}", "shared_scale"], [f"y_{tag}"], name=f"scale_{tag}"),
        ]
        return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(f"y_{tag}", TensorProto.FLOAT, None)])

    nodes = [
        helper.make_node("If", ["wide"], ["y"], name="by_rate", then_branch=branch("then"), else_branch=branch("else")),
        helper.make_node("Add", ["y", "main_bias"], ["out"], name="main_add"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 32]),
            helper.make_tensor_value_info("wide", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [
            init("w_then", [8, 4, 3]),
            init("b_then", [8]),
            init("w_else", [8, 4, 3]),
            init("b_else", [8]),
            init("shared_scale", [1]),
            init("main_bias", [1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_weights_only_a_branch_reads_move_into_it_so_ort_quantizes_the_branchs_convs(tmp_path):
    import onnxruntime as ort
    from onnxruntime.quantization import quantize_dynamic

    from tapeout.quantize.passes.base import run_on_proto
    from tapeout.quantize.passes.localize_body_weights import LocalizeBodyWeights

    model = _rate_switched_convs()
    before = tmp_path / "before.onnx"
    onnx.save(model, before)
    # the bug the pass works around: ORT's ConvInteger looks a branch's Conv weight up in the branch alone
    with pytest.raises(ValueError, match="to be an initializer"):
        quantize_dynamic(
            before,
            tmp_path / "q0.onnx",
            nodes_to_quantize=["conv_then", "conv_else"],
            op_types_to_quantize=["Conv"],
            extra_options={"EnableSubgraph": True},
        )
    graph_pass = LocalizeBodyWeights({"conv_then", "conv_else"})
    moved, records = run_on_proto(model, [graph_pass])
    assert records[0]["outcome"] == "applied" and records[0]["rewrites"] == 4
    branches = {a.name: {i.name for i in a.g.initializer} for a in moved.graph.node[0].attribute}
    assert branches == {"then_branch": {"w_then", "b_then"}, "else_branch": {"w_else", "b_else"}}
    # read by both branches, or by the main graph too: stays where it is
    assert {i.name for i in moved.graph.initializer} == {"shared_scale", "main_bias"}
    after = tmp_path / "after.onnx"
    onnx.save(moved, after)
    x = np.random.default_rng(0).normal(size=(1, 4, 32)).astype(np.float32)
    for wide in (True, False):
        feeds = {"x": x, "wide": np.array(wide)}
        run = [
            ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
            for p in (before, after)
        ]
        np.testing.assert_array_equal(*run)
    quantize_dynamic(
        after,
        tmp_path / "q.onnx",
        nodes_to_quantize=["conv_then", "conv_else"],
        op_types_to_quantize=["Conv"],
        extra_options={"EnableSubgraph": True},
    )
    quantized = onnx.load(tmp_path / "q.onnx")
    assert all("ConvInteger" in {n.op_type for n in a.g.node} for a in quantized.graph.node[0].attribute)
    # nothing planned in a body: says why it did not fire
    _, skipped = run_on_proto(_rate_switched_convs(), [LocalizeBodyWeights({"main_add"})])
    assert skipped[0]["outcome"] == "skipped" and "no planned node in a control-flow body" in skipped[0]["reason"]


def _attention_block(kv_heads: int, heads: int = 4, seq: int = 3, total: int = 5, dim: int = 8) -> onnx.ModelProto:
    """Attention as torch exports a GQA layer's: K and V repeated to the query heads by Unsqueeze → Expand →
    Reshape, scores scaled and masked, Softmax, context."""
    from onnx import TensorProto, helper, numpy_helper

    rep = heads // kv_heads

    def const(name, values):
        return numpy_helper.from_array(np.asarray(values), name)

    def repeat(x):
        return [
            helper.make_node("Unsqueeze", [x, "axis2"], [f"{x}_u"], name=f"unsqueeze_{x}"),
            helper.make_node("Expand", [f"{x}_u", "expanded"], [f"{x}_e"], name=f"expand_{x}"),
            helper.make_node("Reshape", [f"{x}_e", "repeated"], [f"{x}_r"], name=f"reshape_{x}"),
        ]

    nodes = [
        *repeat("k"),
        *repeat("v"),
        helper.make_node("Transpose", ["k_r"], ["k_t"], name="transpose_k", perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "k_t"], ["scores"], name="scores"),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale"),
        helper.make_node("Add", ["scaled", "mask"], ["masked"], name="mask_add"),
        helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v_r"], ["context"], name="context"),
    ]
    mask = np.triu(np.full((seq, total), -1e9, np.float32), k=total - seq + 1)[None, None]
    graph = helper.make_graph(
        nodes,
        "attention",
        [
            helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, heads, seq, dim]),
            *(helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, kv_heads, total, dim]) for x in ("k", "v")),
        ],
        [helper.make_tensor_value_info("context", TensorProto.FLOAT, [1, heads, seq, dim])],
        [
            const("axis2", np.array([2], np.int64)),
            const("expanded", np.array([1, kv_heads, rep, total, dim])),
            const("repeated", np.array([1, heads, total, dim])),
            const("scale", np.array(dim**-0.5, np.float32)),
            const("mask", mask),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_grouped_attention_multiplies_the_key_value_heads_as_they_are_and_computes_the_same(tmp_path):
    import onnxruntime as ort

    from tapeout.quantize.passes.base import run_on_proto
    from tapeout.quantize.passes.grouped_attention import GroupedAttention

    model = _attention_block(kv_heads=2)
    grouped, records = run_on_proto(model, [GroupedAttention()])
    assert records[0]["outcome"] == "applied" and records[0]["rewrites"] == 2  # the scores and the context
    ops = [n.op_type for n in grouped.graph.node]
    assert "Expand" not in ops and "Unsqueeze" not in ops and ops.count("MatMul") == 2
    assert {i.name for i in grouped.graph.initializer}.isdisjoint({"expanded", "repeated", "axis2"})  # no leftovers
    rng = np.random.default_rng(0)
    feeds = {
        "q": rng.normal(size=(1, 4, 3, 8)).astype(np.float32),
        **{x: rng.normal(size=(1, 2, 5, 8)).astype(np.float32) for x in ("k", "v")},
    }
    run = []
    for m, name in ((model, "before"), (grouped, "after")):
        onnx.save(m, tmp_path / f"{name}.onnx")
        run.append(
            ort.InferenceSession(str(tmp_path / f"{name}.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        )
    np.testing.assert_allclose(run[0], run[1], rtol=1e-6, atol=1e-6)
    # multi-head attention (as many key/value heads as query heads) has no repeat to remove
    _, same = run_on_proto(_attention_block(kv_heads=4), [GroupedAttention()])
    assert same[0]["outcome"] == "skipped"


def _rms_norm(reciprocal: bool):
    """y = w · x · rsqrt(mean(x²) + eps), with rsqrt as torch exports it (Sqrt → Reciprocal → Mul) or as a Div."""
    from onnx import TensorProto, helper, numpy_helper

    norm = (
        [
            helper.make_node("Reciprocal", ["root"], ["inverse"], name="rsqrt"),
            helper.make_node("Mul", ["x", "inverse"], ["normed"], name="scale_x"),
        ]
        if reciprocal
        else [helper.make_node("Div", ["x", "root"], ["normed"], name="divide_x")]
    )
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["squared"], name="square"),
        helper.make_node("ReduceMean", ["squared", "last"], ["mean"], name="mean", keepdims=1),
        helper.make_node("Add", ["mean", "eps"], ["shifted"], name="eps_add"),
        helper.make_node("Sqrt", ["shifted"], ["root"], name="sqrt"),
        *norm,
        helper.make_node("Mul", ["weight", "normed"], ["y"], name="weigh"),
    ]
    const = numpy_helper.from_array
    rng = np.random.default_rng(1)
    graph = helper.make_graph(
        nodes,
        "rms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 16])],
        [
            const(np.array(2.0, np.float32), "two"),
            const(np.array([-1], np.int64), "last"),
            const(np.array(1e-6, np.float32), "eps"),
            const(rng.normal(size=16).astype(np.float32), "weight"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def test_rms_norm_division_lets_onnx_runtime_fuse_the_norm_and_computes_the_same(tmp_path):
    """Rewritten, ORT fuses the norm into one SimplifiedLayerNormalization, with the same output. (This lone norm
    ORT fuses in its rsqrt form too; in transformers' exports it did not: the HF decoder test checks those.)"""
    import onnxruntime as ort

    from tapeout.quantize.passes.base import run_on_proto
    from tapeout.quantize.passes.rms_norm_division import RmsNormDivision

    model = _rms_norm(reciprocal=True)
    rewritten, records = run_on_proto(model, [RmsNormDivision()])
    assert records[0]["outcome"] == "applied" and records[0]["rewrites"] == 1
    assert [n.op_type for n in rewritten.graph.node] == [n.op_type for n in _rms_norm(reciprocal=False).graph.node]
    x = np.random.default_rng(0).normal(size=(1, 5, 16)).astype(np.float32)
    fused, outputs = {}, {}
    for m, name in ((model, "before"), (rewritten, "after")):
        onnx.save(m, tmp_path / f"{name}.onnx")
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / f"{name}.optimized.onnx")
        session = ort.InferenceSession(str(tmp_path / f"{name}.onnx"), options, providers=["CPUExecutionProvider"])
        outputs[name] = session.run(None, {"x": x})[0]
        fused[name] = [n.op_type for n in onnx.load(tmp_path / f"{name}.optimized.onnx").graph.node]
    assert fused["after"] == ["SimplifiedLayerNormalization"]
    np.testing.assert_allclose(outputs["after"], outputs["before"], rtol=1e-5, atol=1e-6)
    # a Reciprocal that something other than a Mul reads stays as it is
    model.graph.output.append(onnx.helper.make_tensor_value_info("inverse", onnx.TensorProto.FLOAT, None))
    _, kept = run_on_proto(model, [RmsNormDivision()])
    assert kept[0]["outcome"] == "skipped"


def test_overrides_keep_float_and_method(tmp_path):
    plan, _ = _plan(tmp_path, graphs.transformer(), keep_float=["block1.ffn.out"], method="static")
    assert plan.method == "static" and _by_precision(plan)["block1.ffn.out"] == "fp32"


def test_overrides_start_a_group_on_another_rung_and_it_is_applied(tmp_path):
    """`overrides` by role puts the decoder's LM head at 4 bits where the rule starts it at 8, the plan says why,
    and the quantized graph has the head as a 4-bit MatMulNBits (bits = 4), not the 8-bit one the rule writes."""
    model = graphs.transformer(causal=True, lm_head=True, swiglu=True)
    ruled, _ = _plan(tmp_path, model, "int4")
    plan, path = _plan(tmp_path, model, "int4", overrides={"lm_head": "int4"})
    head = next(g for g in plan.groups if g.role == "lm_head")
    assert _by_precision(ruled)[head.group] == "int8-weight"
    assert head.precision == "int4" and head.reason == '[quantization] overrides: lm_head = "int4"'
    assert {g.group: g.precision for g in plan.groups if g.role != "lm_head"} == {
        g.group: g.precision for g in ruled.groups if g.role != "lm_head"
    }
    out = tmp_path / "q.onnx"
    apply(plan, path, out, [{"input_ids": np.zeros((1, 8), np.int64)}], max_ir_version=10)
    bits = {
        n.name: next(a.i for a in n.attribute if a.name == "bits")
        for n in onnx.load(out).graph.node
        if n.op_type == "MatMulNBits"
    }
    assert [b for name, b in bits.items() if name.startswith("lm_head")] == [4]
    # a group's own name wins over its role; "fp32" keeps it float like keep_float
    named, _ = _plan(tmp_path, model, "int4", overrides={"lm_head": "int4", head.group: "fp32"})
    assert _by_precision(named)[head.group] == "fp32"


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"overrides": {"lm_haed": "int4"}}, "'lm_haed' is no fusion group, node or role of this model"),
        (
            {"overrides": {"lm_head": "int8"}},
            'lm_head = "int8" is not on onnxruntime\'s int4 ladder \\(int4, int8-weight, fp32\\)',
        ),
        ({"overrides": {"embedding": "int4"}}, "does not quantize role 'embedding'"),
        ({"keep_float": ["block9.ffn.out"]}, "keep_float: 'block9.ffn.out' is no fusion group or node of this model"),
    ],
)
def test_overrides_and_keep_float_the_model_or_ladder_cannot_take_are_one_line(tmp_path, settings, message):
    with pytest.raises(BadInput, match=message) as caught:
        _plan(tmp_path, graphs.transformer(causal=True, lm_head=True, swiglu=True), "int4", **settings)
    assert "\n" not in caught.value.problem and caught.value.fix


def test_an_override_that_is_no_rung_is_refused_by_the_schema():
    with pytest.raises(ValueError, match='overrides: lm_head = "int3" is not a precision rung'):
        QuantizationSettings(overrides={"lm_head": "int3"})


def test_targets_and_precisions_without_rules_are_bad_input(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(graphs.cnn(), path)
    a = analyze(path)
    with pytest.raises(BadInput, match="no int4 rule for a cnn model on openvino"):
        first_plan(a, "openvino", "int4", QuantizationSettings())
    with pytest.raises(BadInput, match="no int4 rule for a cnn"):
        first_plan(a, "onnxruntime", "int4", QuantizationSettings())


@pytest.mark.parametrize("case", ["encoder-dynamic", "cnn-static", "decoder-int4"])
def test_plans_apply_and_run_close_to_fp32(tmp_path, case):
    import onnxruntime as ort

    model, precision = {
        "encoder-dynamic": (graphs.transformer(), "int8"),
        "cnn-static": (graphs.cnn(), "int8"),
        "decoder-int4": (graphs.transformer(causal=True, lm_head=True, swiglu=True), "int4"),
    }[case]
    plan, path = _plan(tmp_path, model, precision)
    rng = np.random.default_rng(0)
    name = model.graph.input[0].name
    feeds = (
        [{name: rng.integers(0, 64, (1, 8))} for _ in range(8)]
        if name == "input_ids"
        else [{name: rng.random((1, 3, 16, 16), dtype=np.float32)} for _ in range(8)]
    )
    out = tmp_path / "q.onnx"
    info = apply(plan, path, out, feeds, max_ir_version=10)
    quantized = onnx.load(out)
    ops = {n.op_type for n in quantized.graph.node}
    expected = {
        "encoder-dynamic": "DynamicQuantizeLinear",
        "cnn-static": "QuantizeLinear",
        "decoder-int4": "MatMulNBits",
    }[case]
    assert expected in ops or (case == "encoder-dynamic" and "DynamicQuantizeMatMul" in ops), ops
    if case == "decoder-int4":  # exactly the planned nodes: the projections at 4 bits, lm_head at 8
        planned = set(plan.nodes_at("int4")) | set(plan.nodes_at("int8-weight"))
        assert [n.rsplit("_", 1)[0] for n in plan.nodes_at("int8-weight")] == ["lm_head"]
        assert {n.name.rsplit("_Q", 1)[0] for n in quantized.graph.node if n.op_type == "MatMulNBits"} == planned
        assert any(
            n.op_type == "MatMulNBits" and n.name.startswith("lm_head") and n.name.endswith("_Q8")
            for n in quantized.graph.node
        )
    if case == "cnn-static":  # the first conv was kept float: its weight is still a float initializer
        first = next(n for n in quantized.graph.node if n.op_type == "Conv")
        assert first.input[1] in {i.name for i in quantized.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    else:  # softmax, norms and residual adds stay float ops fed by float tensors
        producers = {o: n.op_type for n in quantized.graph.node for o in n.output}
        kept = [n for n in quantized.graph.node if n.op_type in ("Softmax", "LayerNormalization", "Add", "Pow")]
        assert any(n.op_type == "Softmax" for n in kept)
        assert not any(producers.get(t) == "DequantizeLinear" for n in kept for t in n.input)
    fp32 = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    q = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for f in feeds:
        a, b = fp32.run(None, f)[0].ravel(), q.run(None, f)[0].ravel()
        # random Gaussian weights are INT4's worst case (no trained structure); INT8 lands near 0.99
        assert np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)) > (0.95 if precision == "int4" else 0.98), info
    assert quantized.ir_version <= 10


# ------------------------------------------------------------------ the loop, end to end

PLANTED_METRIC = """
import numpy as np
from pathlib import Path
DATA = Path(__file__).with_name("eval.npz")

def agreement(predict):
    with np.load(DATA) as d:
        xs, refs = d["x"], d["ref"]
    cos = []
    for x, ref in zip(xs, refs):
        y = next(iter(predict({"x": x[None]}).values())).ravel()
        cos.append(float(np.dot(y, ref) / max(np.linalg.norm(y) * np.linalg.norm(ref), 1e-12)))
    return float(np.mean(cos))
"""


def _planted_project(tmp_path, planted: int = 2):
    import onnxruntime as ort

    project = tmp_path / "planted"
    project.mkdir()
    onnx.save(graphs.mlp(planted=planted, layers=5), project / "model.onnx")
    rng = np.random.default_rng(1)
    calib = rng.normal(size=(32, 1, 64)).astype(np.float32)
    xs = rng.normal(size=(48, 64)).astype(np.float32)
    sess = ort.InferenceSession(str(project / "model.onnx"), providers=["CPUExecutionProvider"])
    refs = np.stack([sess.run(None, {"x": x[None]})[0].ravel() for x in xs])
    np.savez(project / "calibration.npz", x=calib)
    np.savez(project / "eval.npz", x=xs, ref=refs)
    (project / "metric.py").write_text(PLANTED_METRIC)
    (project / "tapeout.toml").write_text("""
[model]
source = "model.onnx"
[[inputs]]
name = "x"
shape = [1, 64]
[calibration]
data = "calibration.npz"
[evaluation]
metric = "metric.py:agreement"
direction = "higher"
name = "cosine"
""")
    profile = tmp_path / "int8.toml"
    profile.write_text("""
extends = "cpu-int8"
device = "intel-core-ultra-200v"   # the CPU rules read its instruction set (AVX-VNNI), not the host's
[budgets]
accuracy_max_drop = 0.005
[check]
iterations = 30
repeats = 1
warmup_min_s = 0.05
op_profile = false
""")
    return project, profile


def test_the_loop_finds_the_planted_layer_first_and_moves_it_alone(tmp_path):
    project, profile = _planted_project(tmp_path, planted=2)
    out = tmp_path / "build"
    result = run_cli("build", project, "--profile", profile, "--out", out)
    assert result.code == 0, result.err + result.out
    report = json.loads((out / "report.json").read_text())
    search = report["quantization"]["search"]
    groups = report["quantization"]["plan"]["groups"]
    planted = next(g["group"] for g in groups if g["nodes"][0].startswith("layer2_"))
    # node layer2's input carries the 1000× channel: quantized alone it is by far the worst group.
    assert search["ranking"][0]["group"] == planted, search["ranking"]
    assert search["ranking"][0]["relative_error"] > 20 * search["ranking"][1]["relative_error"]
    steps = search["steps"]
    assert not steps[0]["meets_accuracy"]  # the rule table's plan misses the budget …
    assert [s["group"] for s in steps[1:]] == [planted] and steps[1]["meets_accuracy"]  # … one move fixes it
    assert search["stopped"].startswith("accuracy budget met after 1 step")
    plan = {g["group"]: g["precision"] for g in groups}
    assert plan == {
        "linear1": "int8",
        "linear2": "int8",
        "linear3": "int8",
        "linear4": "int8",
        "head": "fp32",
        planted: "fp32",
    }
    md = (out / "report.md").read_text()
    assert "## Precision" in md and f"{planted}: int8 → fp32" in md
    assert "CPU instruction set from device spec intel-core-ultra-200v (x86_64, VNNI)" in md
    accuracy = next(b for b in report["budgets"] if b["budget"] == "accuracy_max_drop")
    assert accuracy["verdict"] == "pass"
    check = run_cli("check", out, "--json")  # the quantized artifact re-checked: parity against the FP32 golden outputs
    assert check.code == 0, check.err
    assert next(b for b in check.json()["budgets"] if b["budget"] == "parity_min_cosine")["verdict"] == "pass"


def _build_planted_with(tmp_path, quantization: str, out):
    """The planted project (made under `tmp_path`) built with its profile plus one [quantization] setting."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    project, profile = _planted_project(tmp_path, planted=2)
    changed = tmp_path / f"{out.name}.toml"
    changed.write_text(profile.read_text() + f"\n[quantization]\n{quantization}\n")
    return run_cli("build", project, "--profile", changed, "--out", out)


def test_the_loop_stops_at_its_evaluation_cap_and_the_build_fails_the_budget(tmp_path):
    out = tmp_path / "build"
    result = _build_planted_with(tmp_path, "max_evaluations = 1", out)
    assert result.code == 1, result.err + result.out  # the accuracy budget fails: exit 1
    search = json.loads((out / "report.json").read_text())["quantization"]["search"]
    assert search["stopped"].startswith("evaluation cap reached (1)") and len(search["steps"]) == 1


def test_static_int8_without_calibration_data_is_one_clear_line(tmp_path):
    project = tmp_path / "cnn"
    project.mkdir()
    onnx.save(graphs.cnn(), project / "model.onnx")
    (project / "tapeout.toml").write_text(
        '[model]\nsource = "model.onnx"\n[[inputs]]\nname = "image"\nshape = [1, 3, 16, 16]\n'
    )
    result = run_cli("build", project, "--profile", "cpu-int8", "--out", tmp_path / "b")
    assert result.code == 2
    assert "needs calibration data" in one_line_error(result)
    assert not (tmp_path / "b").exists()


def test_a_precision_the_target_does_not_take_is_rejected(tmp_path):
    profile = tmp_path / "ov16.toml"
    profile.write_text('extends = "openvino-cpu"\nprecision = "fp16"\n')
    result = run_cli("profiles", "show", profile)
    assert result.code == 2 and "does not take 'fp16'" in one_line_error(result)


def test_npu_rule_is_full_integer_a16w8_for_transformers_with_masks_and_softmax_float(tmp_path):
    path = tmp_path / "enc.onnx"
    onnx.save(graphs.transformer(), path)
    analysis = analyze(path)
    plan = first_plan(analysis, "qnn", "int8", QuantizationSettings(keep_float=["block1.ffn.out"]))
    assert plan.method == "npu-static" and plan.activation_type == "uint16" and plan.ladder == ("int8", "a16w8", "fp16")
    groups = _by_precision(plan)
    assert groups.pop("block1.ffn.out") == "fp16"  # float on the HTP is FP16, never the CPU
    assert set(groups.values()) == {"a16w8"}
    kept = {analysis.roles[n] for n in plan.float_nodes}
    assert kept == {"attn_mask", "attn_softmax"} and len(plan.float_nodes) == 4  # two blocks
    onnx.save(graphs.cnn(), tmp_path / "cnn.onnx")
    npu_cnn = first_plan(analyze(tmp_path / "cnn.onnx"), "qnn", "int8", QuantizationSettings())
    assert (
        npu_cnn.activation_type == "uint8"
        and set(_by_precision(npu_cnn).values()) == {"int8"}
        and not npu_cnn.float_nodes
    )
    with pytest.raises(BadInput, match="full-integer static QDQ"):
        first_plan(analysis, "qnn", "int8", QuantizationSettings(method="dynamic"))


@pytest.mark.slow
def test_tiny_lm_int4_keeps_perplexity_within_the_relative_budget_and_check_carries_it(tmp_path):
    from conftest import SAMPLES

    profile = tmp_path / "int4.toml"
    profile.write_text(
        'extends = "cpu-int4"\n[check]\niterations = 30\nrepeats = 1\nwarmup_min_s = 0.05\nop_profile = false\n'
    )
    out = tmp_path / "tiny"
    result = run_cli("build", SAMPLES / "tiny-lm" / "forward.toml", "--profile", profile, "--out", out)
    assert result.code == 0, result.err + result.out
    report = json.loads((out / "report.json").read_text())
    assert report["analysis"]["family"] == "decoder-llm"
    rel = next(b for b in report["budgets"] if b["budget"] == "accuracy_max_rel_drop")
    assert rel["verdict"] == "pass" and rel["measured"] < 0.05, rel  # perplexity within 5 % of FP32
    plan = {g["group"]: g["precision"] for g in report["quantization"]["plan"]["groups"]}
    assert plan["lm_head"] == "int8-weight" and plan["embedding1"] == "fp32" and plan["block0.attn.qkv"] == "int4"
    artifact = onnx.load(out / "artifact" / "model.onnx")
    assert sum(n.op_type == "MatMulNBits" for n in artifact.graph.node) == 29  # 4 blocks × 7 Linear layers + head
    assert report["artifact"]["bytes"] <= 0.35 * report["quantization"]["fp32_bytes"]
    check = run_cli("check", out, "--json")
    assert check.code == 0, check.err
    carried = next(b for b in check.json()["budgets"] if b["budget"] == "accuracy_max_rel_drop")
    assert carried["verdict"] == "pass" and "judged at build" in carried["reason"]


def test_gptq_follows_the_plan_and_keeps_stdout_clean(tmp_path, capfd):
    plan, path = _plan(
        tmp_path, graphs.transformer(causal=True, lm_head=True, swiglu=True), precision="int4", int4_algorithm="gptq"
    )
    feeds = [{"input_ids": np.random.default_rng(i).integers(0, 64, (1, 8))} for i in range(4)]
    info = apply(plan, path, tmp_path / "q.onnx", feeds, max_ir_version=10)
    quantized = onnx.load(tmp_path / "q.onnx")
    assert info["nodes"] == {"int4": len(plan.nodes_at("int4")), "int8-weight": 1}
    assert any(
        n.op_type == "MatMulNBits" and n.name.startswith("lm_head") and n.name.endswith("_Q8")
        for n in quantized.graph.node
    )  # RTN at 8 bits
    assert "Progress" not in capfd.readouterr().out


# ---------------------------------------------------------------- Linear layers exported as Gemm


def _gemm_mlp(trans_a_last: bool = False) -> onnx.ModelProto:
    """x[1, 32] → Gemm g0 (transB) → Relu → Gemm g1 (alpha 0.5, beta 2) → Relu → Gemm head: what
    torch exports for nn.Linear on a 2-D input."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.2, shape).astype(np.float32), name)
        for name, shape in (
            ("w0", (64, 32)),
            ("b0", (64,)),
            ("w1", (64, 64)),
            ("b1", (64,)),
            ("w2", (10, 64)),
            ("b2", (10,)),
        )
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w0", "b0"], ["h0"], name="g0", transB=1),
        helper.make_node("Relu", ["h0"], ["r0"], name="relu0"),
        helper.make_node("Gemm", ["r0", "w1", "b1"], ["h1"], name="g1", alpha=0.5, beta=2.0),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        helper.make_node("Gemm", ["r1", "w2", "b2"], ["y"], name="head", transB=1),
    ]
    if trans_a_last:  # a Gemm that cannot become a MatMul: A transposed
        nodes[2] = helper.make_node("Gemm", ["r0t", "w1", "b1"], ["h1"], name="g1", transA=1)
        nodes.insert(2, helper.make_node("Transpose", ["r0"], ["r0t"], name="t"))
    graph = helper.make_graph(
        nodes,
        "gemm_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _gemm_plan(method: str, precision: str):
    from tapeout.quantize.plan import GroupPlan, Plan

    groups = tuple(
        GroupPlan(n, "linear", (n,), precision if n != "head" else "fp32", "test") for n in ("g0", "g1", "head")
    )
    return Plan(method=method, family="mlp", target="onnxruntime", ladder=(precision, "fp32"), groups=groups)


@pytest.mark.parametrize(
    "method, precision, op", [("dynamic", "int8", "MatMulInteger"), ("weight-only", "int4", "MatMulNBits")]
)
def test_gemm_linears_are_really_quantized_not_silently_left_fp32(tmp_path, method, precision, op):
    import onnxruntime as ort

    source, out = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(_gemm_mlp(), source)
    info = apply(_gemm_plan(method, precision), source, out, max_ir_version=10)
    quantized = onnx.load(out)
    ops = [n.op_type for n in quantized.graph.node]
    assert info["gemm_as_matmul"] == 2 and op in ops, ops
    assert not any(n.op_type == "Gemm" and n.name in ("g0", "g1") for n in quantized.graph.node)
    # the plan kept the head float (ORT's own pre-pass may have split it into MatMul + Add, still float)
    assert any(n.op_type in ("Gemm", "MatMul") and n.name.startswith("head") for n in quantized.graph.node)
    x = np.random.default_rng(0).normal(size=(1, 32)).astype(np.float32)

    def run(path):
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

    ref, got = run(source).ravel(), run(out).ravel()
    assert float(ref @ got / (np.linalg.norm(ref) * np.linalg.norm(got))) > 0.99


def test_a_planned_node_the_quantizer_leaves_float_fails_the_build_loudly(tmp_path):
    source, out = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(_gemm_mlp(trans_a_last=True), source)
    with pytest.raises(BadInput, match=r"left 1 of 2 planned node\(s\) in float: g1 \(Gemm\)"):
        apply(_gemm_plan("dynamic", "int8"), source, out)


def test_a_torch_linear_model_built_for_cpu_int8_has_an_int8_artifact(tmp_path):
    project = tmp_path / "mlp"
    project.mkdir()
    (project / "model.py").write_text(
        "import torch\n\n\ndef build():\n    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),\n"
        "                               torch.nn.ReLU(), torch.nn.Linear(64, 10)).eval()\n"
    )
    (project / "tapeout.toml").write_text(
        '[model]\nsource = "model.py:build"\n\n[[inputs]]\nname = "x"\nshape = [1, 32]\n'
    )
    profile = tmp_path / "int8.toml"
    profile.write_text(
        'extends = "cpu-int8"\n[check]\niterations = 30\nrepeats = 1\nwarmup_min_s = 0.05\nop_profile = false\n'
    )
    result = run_cli("build", project, "--profile", profile, "--out", tmp_path / "b")
    assert result.code == 0, result.err
    ops = [n.op_type for n in onnx.load(tmp_path / "b" / "artifact" / "model.onnx").graph.node]
    # nn.Linear on a 2-D input exports as Gemm, which ORT's dynamic quantizer skipped: the artifact was FP32
    assert sum(op in ("DynamicQuantizeMatMul", "MatMulInteger") for op in ops) == 2, ops


def test_ranking_is_bounded_by_groups_and_time_and_says_what_it_skipped(tmp_path):
    out = tmp_path / "build"
    result = _build_planted_with(tmp_path, "max_ranked_groups = 2", out)
    assert result.code in (0, 1), result.err + result.out
    search = json.loads((out / "report.json").read_text())["quantization"]["search"]
    assert len(search["ranking"]) == 2 and len(search["unranked"]) == 2  # 4 quantized groups, 2 ranked
    assert all(u["skipped"] == "over max_ranked_groups" for u in search["unranked"])
    assert "ranked 2 of 4 groups" in result.err
    # no time at all: nothing is ranked, and the loop stops at once, saying why
    result = _build_planted_with(tmp_path / "timed", "max_search_s = 0.001", tmp_path / "b2")
    assert result.code == 1, result.err + result.out
    search = json.loads((tmp_path / "b2" / "report.json").read_text())["quantization"]["search"]
    assert search["ranking"] == [] and {u["skipped"] for u in search["unranked"]} == {"max_search_s ran out"}
    assert search["stopped"].startswith("max_search_s ran out after 0 step(s)")


def test_a_quantizer_failure_names_the_node_it_was_on(tmp_path, monkeypatch):
    """Checks our side: when ORT's quantizer raises while working on a node, the one line names that
    node. (No model at hand makes this onnxruntime fail, so its per-node step is made to raise.)"""
    from onnxruntime.quantization.operators.matmul import MatMulInteger

    from tapeout.core.errors import BadInput
    from tapeout.quantize.apply import apply
    from tapeout.quantize.plan import GroupPlan, Plan

    def broken(self):
        raise ValueError("unsupported weight layout")

    monkeypatch.setattr(MatMulInteger, "quantize", broken)
    onnx.save(graphs.mlp(layers=2), tmp_path / "m.onnx")
    names = [n.name for n in onnx.load(str(tmp_path / "m.onnx")).graph.node if n.op_type == "MatMul"]
    plan = Plan(
        "dynamic",
        "mlp",
        "onnxruntime",
        ("int8", "fp32"),
        tuple(GroupPlan(n, "linear", (n,), "int8", "test") for n in names),
    )
    with pytest.raises(BadInput) as caught:
        apply(plan, tmp_path / "m.onnx", tmp_path / "q.onnx")
    assert f"at node '{names[0]}' (MatMul)" in str(caught.value)
    assert "unsupported weight layout" in str(caught.value)


def test_the_npu_postcondition_refuses_an_a16w8_node_fed_8_bit_activations(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    from tapeout.quantize.methods.npu_static import check_activation_bits

    def qdq_model(zero_point: np.ndarray) -> onnx.ModelProto:
        inits = [
            numpy_helper.from_array(np.array(0.01, np.float32), "scale"),
            numpy_helper.from_array(zero_point, "zero"),
            numpy_helper.from_array(np.ones((4, 4), np.float32), "w"),
        ]
        nodes = [
            helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["xq"], name="q"),
            helper.make_node("DequantizeLinear", ["xq", "scale", "zero"], ["xdq"], name="dq"),
            helper.make_node("MatMul", ["xdq", "w"], ["y"], name="cell"),
        ]
        graph = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
            inits,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])

    onnx.save(qdq_model(np.array(0, np.uint16)), tmp_path / "wide.onnx")
    check_activation_bits(["cell"], tmp_path / "wide.onnx")  # 16-bit: the plan held
    onnx.save(qdq_model(np.array(0, np.uint8)), tmp_path / "narrow.onnx")
    with pytest.raises(BadInput, match="planned at A16W8 got 8-bit activations: cell"):
        check_activation_bits(["cell"], tmp_path / "narrow.onnx")


def test_the_untie_pass_rewrites_the_loaded_protobuf_in_place_and_the_outputs_do_not_move():
    """The tied head gets its own transposed weight on the very message the quantizer then takes (through onnx-ir
    the whole model would be serialized again: every weight a second time), the Transpose it no longer reads is gone,
    the embedding table stays for the Gather, and ONNX Runtime gives the same logits before and after."""
    import onnxruntime as ort

    from tapeout.quantize.passes.base import run_on_proto
    from tapeout.quantize.passes.untie_transposed_weight import UntieTransposedWeight

    model = graphs.transformer(causal=True, lm_head=True, swiglu=True, tied=True)
    before = model.SerializeToString()
    head = next(n.name for n in model.graph.node if n.op_type == "MatMul" and n.name.startswith("lm_head"))
    transposes = sum(n.op_type == "Transpose" for n in model.graph.node)
    untied, records = run_on_proto(model, [UntieTransposedWeight({head})])
    assert untied is model and records[0]["outcome"] == "applied" and records[0]["rewrites"] == 1
    assert sum(n.op_type == "Transpose" for n in model.graph.node) == transposes - 1
    reads = next(n for n in model.graph.node if n.name == head).input[1]
    assert reads == f"{head}.weight" and reads in {i.name for i in model.graph.initializer}
    assert "Gather" in {n.op_type for n in model.graph.node}
    feeds = {"input_ids": np.random.default_rng(0).integers(0, 64, (1, 8), dtype=np.int64)}
    run = lambda data: ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]  # noqa: E731
    np.testing.assert_allclose(run(model.SerializeToString()), run(before), rtol=1e-6, atol=1e-6)
    again, records = run_on_proto(model, [UntieTransposedWeight({head})])  # nothing left to untie
    assert again is model and records[0]["outcome"] == "skipped"


def test_the_groups_on_a_carried_outputs_path_rank_first(tmp_path):
    """A stream's state output is fed back call after call, so its error compounds: the loop ranks the groups on its
    path first, even where a group on another output alone errs more. Here `main` holds a weight 1000× the others
    (per-tensor INT8 rounds the rest away: a large error on `y`), `state` is ordinary (a smaller error on `h_out`)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from tapeout.quantize import sensitivity
    from tapeout.quantize.plan import GroupPlan, Plan

    rng = np.random.default_rng(0)
    main = rng.normal(0, 0.1, (64, 64)).astype(np.float32)
    main[0, 0] = 100.0
    state = rng.normal(0, 0.1, (64, 64)).astype(np.float32)
    model = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("MatMul", ["x", "w_main"], ["y"], "main"),
                helper.make_node("MatMul", ["x", "w_state"], ["h_out"], "state"),
            ],
            "two_outputs",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 64]) for n in ("y", "h_out")],
            [numpy_helper.from_array(main, "w_main"), numpy_helper.from_array(state, "w_state")],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 9
    onnx.save(model, tmp_path / "m.onnx")
    plan = Plan(
        "dynamic",
        "mlp",
        "onnxruntime",
        ("int8", "fp32"),
        tuple(GroupPlan(n, "linear", (n,), "int8", "test") for n in ("main", "state")),
    )

    def session(path):
        run = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run
        return lambda feeds: dict(zip(("y", "h_out"), run(["y", "h_out"], feeds), strict=True))

    samples = [{"x": rng.normal(size=(1, 64)).astype(np.float32)} for _ in range(4)]

    def ranked(carried):
        candidates = sensitivity.Candidates(
            session=session,
            evaluate=lambda _p: 0.0,
            judge=lambda _m: (0.0, True),
            calibration=None,
            rank_samples=samples,
            latency_feeds=samples[0],
            log=lambda _m: None,
            carried=carried,
        )
        return sensitivity.rank_groups(plan, tmp_path / "m.onnx", tmp_path, candidates)[0]

    plain = ranked(())
    assert [r["group"] for r in plain] == ["main", "state"], plain  # by all outputs' error: the planted weight
    assert plain[0]["relative_error"] > 10 * plain[1]["relative_error"] and "carried_relative_error" not in plain[0]
    stateful = ranked(("h_out",))
    assert [r["group"] for r in stateful] == ["state", "main"], stateful  # the state's path first
    assert stateful[0]["carried_relative_error"] > 0 == stateful[1]["carried_relative_error"]


def test_a_loop_that_ends_short_of_the_budget_keeps_the_most_accurate_plan_it_scored(tmp_path):
    """A metric over a loop (greedy agreement) need not rise with every group moved up: where the cap ends the loop
    with the budget missed, the plan kept is the best one scored, applied again, not the last."""
    from tapeout.quantize import sensitivity

    project, _ = _planted_project(tmp_path)
    model = project / "model.onnx"
    calibration = [{"x": x} for x in np.load(project / "calibration.npz")["x"][:8]]
    plan = first_plan(analyze(model), "onnxruntime", "int8", QuantizationSettings(method="static"))
    scripted = iter([0.5, 0.8, 0.4, 0.3])  # step 1 is the best; the cap stops the loop after step 3

    candidates = sensitivity.Candidates(
        session=lambda path: targets.reference_session(path).run,
        evaluate=lambda predict: next(scripted),
        judge=lambda metric: (1.0 - metric, metric >= 0.9),
        calibration=calibration,
        rank_samples=calibration[:2],
        latency_feeds=calibration[0],
    )
    out = tmp_path / "q" / "model.onnx"
    out.parent.mkdir()
    search = sensitivity.search(plan, model, out, candidates, sensitivity.Limits(max_evaluations=4))
    assert [s.metric for s in search.steps] == [0.5, 0.8, 0.4, 0.3]
    assert search.stopped.endswith("the most accurate plan scored, step 1's (0.8), is kept instead"), search.stopped
    moved = search.steps[1].group
    kept = {g.group: g.precision for g in search.plan.groups}
    assert kept[moved] == "fp32" and search.metric == 0.8
    assert sum(p == "fp32" for p in kept.values()) == sum(g.precision == "fp32" for g in plan.groups) + 1
    # the file at `out` is that plan's, not the last step's: the group step 1 moved reads float weights, the groups
    # steps 2 and 3 moved read them through a DequantizeLinear again
    graph = onnx.load(out).graph
    producer = {o: n.op_type for n in graph.node for o in n.output}
    weight_of = {n.name: producer.get(n.input[1], "initializer") for n in graph.node if len(n.input) > 1}
    groups = {g.group: g.nodes for g in search.plan.groups}
    assert all(weight_of[n] != "DequantizeLinear" for n in groups[moved])
    for later in (search.steps[2].group, search.steps[3].group):
        assert all(weight_of[n] == "DequantizeLinear" for n in groups[later]), later
