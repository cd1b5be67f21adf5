"""Architecture detection on small synthetic graphs of each family, and the static costs."""

from __future__ import annotations

import graphs
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import run_cli
from tapeout.graph.analyze import analyze


def _analyze(tmp_path, model, **kw):
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return analyze(path, **kw)


def _roles(a):
    return a.to_json()["role_counts"]


def test_encoder_is_labelled_with_its_attention_ffn_and_norm_roles(tmp_path):
    a = _analyze(tmp_path, graphs.transformer(layers=2))
    assert a.family == "transformer-encoder"
    assert a.facts["attention_blocks"] == 2 and a.facts["causal"] is False and a.facts["heads"] == 2
    roles = _roles(a)
    for role in ("attn_q", "attn_k", "attn_v", "attn_out", "ffn_in", "ffn_out"):
        assert roles[role] == 2, (role, roles)
    assert roles["norm"] == 4 and roles["attn_softmax"] == 2 and roles["embedding"] == 1
    names = [g.name for g in a.groups]
    assert names == [
        "embedding1",
        "block0.attn.qkv",
        "block0.attn.out",
        "block0.ffn.in",
        "block0.ffn.out",
        "block1.attn.qkv",
        "block1.attn.out",
        "block1.ffn.in",
        "block1.ffn.out",
    ]
    qkv = next(g for g in a.groups if g.name == "block0.attn.qkv")
    assert len(qkv.weighted) == 3 and len(qkv.nodes) == 6  # Q, K, V and their bias Adds: one decision


def test_decoder_with_causal_mask_rmsnorm_and_swiglu(tmp_path):
    a = _analyze(tmp_path, graphs.transformer(causal=True, lm_head=True, swiglu=True))
    assert a.family == "decoder-llm"
    assert a.facts["causal"] is True and a.facts["norms"] == {"rmsnorm": 5} and a.facts["vocab"] == 64
    roles = _roles(a)
    assert roles["lm_head"] == 1 and roles["ffn_gate"] == 2 and roles["ffn_up"] == 2 and roles["ffn_out"] == 2
    ffn_in = next(g for g in a.groups if g.name == "block1.ffn.in")
    assert len(ffn_in.weighted) == 2  # gate and up share one precision decision


def test_encoder_is_not_called_causal_and_decoder_without_mask_is_not_a_decoder(tmp_path):
    # The same decoder graph with its causal mask swapped for a padding mask reads as an encoder.
    a = _analyze(tmp_path, graphs.transformer(causal=False, lm_head=True))
    assert a.family == "transformer-encoder"
    assert "lm_head" not in _roles(a) and _roles(a)["head"] == 1


def test_cnn_first_conv_depthwise_and_head(tmp_path):
    a = _analyze(tmp_path, graphs.cnn(depthwise=True))
    assert a.family == "cnn"
    assert _roles(a) == {"first_conv": 1, "depthwise_conv": 1, "conv": 1, "head": 1}
    assert a.facts["depthwise_convs"] == 1 and a.facts["conv_mac_share"] > 0.9


def test_recurrent_and_diffusion_and_mlp(tmp_path):
    rnn = _analyze(tmp_path, graphs.recurrent())
    assert rnn.family == "speech-recurrent" and _roles(rnn)["recurrent_cell"] == 1
    diff = _analyze(tmp_path, graphs.diffusion())
    assert diff.family == "diffusion" and diff.facts["timestep_input"] is True
    assert _roles(diff)["timestep_embedding"] == 3  # Sin, Cos and the time MLP after them
    mlp = _analyze(tmp_path, graphs.mlp())
    assert mlp.family == "mlp" and _roles(mlp) == {"linear": 3, "head": 1}
    assert any("attention" in reason for reason in mlp.unmatched)  # the detectors that did not fire say so


def test_costs_and_liveness_on_a_graph_counted_by_hand(tmp_path):
    # x[2,8] → MatMul W[8,16] → Relu → MatMul W[16,4]: 2·2·8·16 + 2·16 + 2·2·16·4 FLOPs.
    w1, w2 = np.ones((8, 16), np.float32), np.ones((16, 4), np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    a = _analyze(tmp_path, model, dims={"batch": 2})
    assert a.flops == 2 * 2 * 8 * 16 + 2 * 16 + 2 * 2 * 16 * 4
    assert a.params == 8 * 16 + 16 * 4 and a.weight_bytes == 4 * (8 * 16 + 16 * 4)
    # Live at once, at most: h and r (2·16 floats each) while Relu runs; x is dead after mm1.
    assert a.peak_activation_bytes == 2 * (2 * 16 * 4) and a.peak_activation_at == "relu"
    assert a.op_census == {"MatMul": 2, "Relu": 1}


@pytest.mark.parametrize(
    ("sample", "family", "roles"),
    [
        ("digits-cnn", "cnn", {"first_conv": 1, "conv": 1, "linear": 1, "head": 1}),
        pytest.param(
            "minilm",
            "transformer-encoder",
            {"attn_q": 6, "attn_out": 6, "ffn_in": 6, "ffn_out": 6, "embedding": 3, "norm": 13},
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "tiny-lm",
            "decoder-llm",
            {"lm_head": 1, "ffn_gate": 4, "ffn_up": 4, "ffn_out": 4, "attn_q": 4},
            marks=pytest.mark.slow,
        ),
    ],
)
def test_analyze_labels_the_samples(sample, family, roles):
    from conftest import SAMPLES

    # tiny-lm's own project is a generate workload; its forward.toml is the one call these labels describe
    result = run_cli("analyze", SAMPLES / sample / ("forward.toml" if sample == "tiny-lm" else ""), "--json")
    assert result.code == 0, result.err
    data = result.json()
    assert data["family"] == family, data["families"]
    for role, count in roles.items():
        assert data["role_counts"].get(role) == count, (role, data["role_counts"])


def test_analyze_an_onnx_file_with_dims_and_bad_dim(tmp_path):
    from conftest import one_line_error

    path = tmp_path / "enc.onnx"
    onnx.save(graphs.transformer(), path)
    ok = run_cli("analyze", path)
    assert ok.code == 0 and "transformer-encoder" in ok.out and "block0.attn.qkv" in ok.out, ok.err
    bad = run_cli("analyze", path, "--dim", "sequence=abc")
    assert bad.code == 2 and "NAME=VALUE" in one_line_error(bad)


def test_recurrent_work_is_costed_and_decides_the_family_by_its_share(tmp_path):
    # graphs.recurrent(): LSTM over 10 steps, batch 1, input 32 (after in_proj), hidden 32, one direction
    rnn = _analyze(tmp_path, graphs.recurrent())
    lstm = next(c for c in rnn.costs if c.op_type == "LSTM")
    assert lstm.flops == 10 * (2 * 4 * 32 * (32 + 32) + 4 * 4 * 32)  # was 0: only its output size counted
    assert lstm.params == 2 * 4 * 32 * 32  # W and R
    # a keyword spotter: a small conv front-end, the LSTM doing most of the work
    kws = _analyze(tmp_path, graphs.conv_recurrent(channels=8, hidden=64))
    assert kws.family == "speech-recurrent" and kws.facts["recurrent_mac_share"] > 0.9, kws.families
    # the same shape with a heavy conv stack and a tiny LSTM is a CNN
    convs = _analyze(tmp_path, graphs.conv_recurrent(channels=32, hidden=8, deep=True))
    assert convs.family == "cnn" and convs.facts["recurrent_mac_share"] < 0.2, convs.families


def test_a_recurrent_cell_whose_length_inference_cannot_resolve_still_counts_its_work(tmp_path):
    """A sequence reshaped at run time from data (published VADs build it so) leaves the LSTM's input length unknown
    to shape inference: the cell counts one step of its real input width, a lower bound, not zero MACs, which gave
    such a model's family to its convolutions (conv MAC share 100 %)."""
    from onnx import helper

    model = graphs.conv_recurrent(channels=8, hidden=64)
    graph = model.graph
    reshape = next(n for n in graph.node if n.op_type == "Reshape")
    width = 8 * 16  # channels × bins: what the LSTM's W takes per step
    extra = [
        helper.make_node("ReduceMax", ["spectrogram"], ["frame_max"], axes=[0, 1, 3], keepdims=0),
        helper.make_node("Greater", ["frame_max", "floor"], ["voiced"]),
        helper.make_node("NonZero", ["voiced"], ["voiced_at"]),
        helper.make_node("Shape", ["voiced_at"], ["voiced_count"], start=1),
        helper.make_node("Concat", ["voiced_count", "one_width"], ["sequence_shape"], axis=0),
    ]
    graph.initializer.extend(
        [
            onnx.numpy_helper.from_array(np.array(-1e30, np.float32), "floor"),
            onnx.numpy_helper.from_array(np.array([1, width], np.int64), "one_width"),
        ]
    )
    reshape.input[1] = "sequence_shape"
    position = list(graph.node).index(reshape)
    for offset, node in enumerate(extra):
        graph.node.insert(position + offset, node)
    a = _analyze(tmp_path, model)
    lstm = next(c for c in a.costs if c.op_type == "LSTM")
    assert lstm.flops == 2 * 4 * 64 * (width + 64) + 4 * 4 * 64  # one step (of the real 20): the bound, not 0
    assert a.facts["recurrent_mac_share"] > 0.5 and a.family == "speech-recurrent", a.families


DYNAMIC_HF = {
    # architecture → (config, its kwargs, the family): exported with symbolic batch and sequence, the way
    # current transformers builds the causal mask at run time (Range, LessOrEqual, GatherND, Where)
    "LlamaForCausalLM": (
        "LlamaConfig",
        dict(
            vocab_size=100,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        ),
        "decoder-llm",
    ),
    "GPT2LMHeadModel": (
        "GPT2Config",
        dict(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64),
        "decoder-llm",
    ),
    "BertForSequenceClassification": (
        "BertConfig",
        dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
        "transformer-encoder",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("architecture", list(DYNAMIC_HF))
def test_causal_masks_of_todays_exporters_are_detected_on_the_graph(tmp_path, architecture):
    import torch
    import transformers

    config_name, kwargs, family = DYNAMIC_HF[architecture]
    torch.manual_seed(0)
    getattr(transformers, architecture)(getattr(transformers, config_name)(**kwargs)).eval().save_pretrained(
        tmp_path / "hf"
    )
    (tmp_path / "tapeout.toml").write_text(
        '[model]\nsource = "hf"\n\n[[inputs]]\nname = "input_ids"\nshape = ["batch", "sequence"]\ndtype = "int64"\n'
        "range = [0, 99]\n\n[dims]\nbatch = 1\nsequence = 8\n"
    )
    result = run_cli("analyze", tmp_path, "--json")
    assert result.code == 0, result.err
    best = result.json()["families"][0]
    assert best["family"] == family, best
    assert ("causal mask on the attention scores" in best["evidence"]) is (family == "decoder-llm")


def test_kv_cache_inputs_or_a_decoder_config_make_a_maskless_decoder_a_decoder(tmp_path):
    # a one-token decode step has no causal mask: its KV-cache inputs are the evidence
    model = graphs.transformer(causal=False, lm_head=True)
    past = helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, [1, 2, 8, 16])
    model.graph.input.append(past)
    model.graph.node.append(helper.make_node("ReduceMean", ["past_key_values.0.key"], ["past_mean"], name="use_past"))
    model.graph.output.append(helper.make_tensor_value_info("past_mean", TensorProto.FLOAT, None))
    a = _analyze(tmp_path, model)
    assert a.family == "decoder-llm" and a.facts["kv_cache_inputs"] == 1
    assert any("KV-cache input" in e for e in a.families[0].evidence) and _roles(a)["lm_head"] == 1
    # no mask and no cache, but the Hugging Face config says gpt2: a decoder, at lower confidence, saying why
    b = _analyze(tmp_path, graphs.transformer(causal=False, lm_head=True), hints={"model_type": "gpt2"})
    assert b.family == "decoder-llm" and b.families[0].confidence < 0.9
    assert "no causal mask found in the graph: the decoder config decides" in b.families[0].evidence


def _body(name: str, width: int, inputs: list, out: str):
    rng = np.random.default_rng(width)
    w = onnx.numpy_helper.from_array(rng.normal(size=(8, width)).astype(np.float32), f"{name}_w")
    w2 = onnx.numpy_helper.from_array(rng.normal(size=(width, 1)).astype(np.float32), f"{name}_w2")
    nodes = [
        helper.make_node("MatMul", ["x", w.name], [f"{name}_h"], name=f"{name}_in"),
        helper.make_node("MatMul", [f"{name}_h", w2.name], [out], name=f"{name}_out"),
    ]
    return helper.make_graph(
        nodes, name, inputs, [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 1])], [w, w2]
    )


def test_if_and_loop_bodies_are_analysed_costed_per_run_and_reported(tmp_path):
    # an If on a scalar input choosing between two networks whose weights live in the branches
    big, small = _body("big", 64, [], "big_y"), _body("small", 4, [], "small_y")
    graph = helper.make_graph(
        [
            helper.make_node("Greater", ["rate", "threshold"], ["wide"], name="is_wide"),
            helper.make_node("If", ["wide"], ["y"], name="by_rate", then_branch=big, else_branch=small),
        ],
        "vad",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
            helper.make_tensor_value_info("rate", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
        [onnx.numpy_helper.from_array(np.array(12000, np.int64), "threshold")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    a = _analyze(tmp_path, model)
    assert a.params == 8 * 64 + 64 + 8 * 4 + 4  # the branches' weights count
    assert a.flops == 2 * (8 * 64 + 64) + 1 + 1  # the costlier branch only (+ Greater, If)
    # each branch's last MatMul feeds the If's output: both are heads, found through the branch outputs
    assert sorted(g.role for g in a.groups) == ["head", "head", "linear", "linear"]
    assert "If by_rate (4 nodes inside; the costlier branch counted)" in a.facts["control_flow"]
    assert {c.body_of for c in a.costs if c.name.startswith(("big", "small"))} == {"by_rate"}
    # a Loop with a constant trip count runs its body that many times
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x", "loop_w"], ["step_y"], name="step")],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("step_y", TensorProto.FLOAT, [1, 8]),
        ],
        [onnx.numpy_helper.from_array(np.eye(8, dtype=np.float32), "loop_w")],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go"], ["steps"], name="repeat", body=body)],
        "looped",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("steps", TensorProto.FLOAT, None)],
        [
            onnx.numpy_helper.from_array(np.array(5, np.int64), "trips"),
            onnx.numpy_helper.from_array(np.array(True), "go"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    step = next(c for c in _analyze(tmp_path, model).costs if c.name == "step")
    assert step.flops == 5 * 2 * 8 * 8 and step.body_of == "repeat"


def test_shape_inference_leaves_no_temp_file_in_the_working_directory(tmp_path, monkeypatch):
    # an op ORT's symbolic inference does not know: it gives up and (unguarded) saves its model in the cwd
    graph = helper.make_graph(
        [helper.make_node("Foo", ["x"], ["y"], name="custom", domain="com.example")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    _analyze(tmp_path, model)
    assert list(work.iterdir()) == []


def test_the_graph_view_keeps_one_copy_of_the_weights_and_the_shapes_they_give(tmp_path):
    """A language model's weights are most of its bytes: the view holds them once, as arrays, and the graph it
    infers shapes on carries their types and dims only (shape inference copies the graph it is given)."""
    from tapeout.graph.view import GraphView

    weight = np.random.default_rng(0).standard_normal((128, 256)).astype(np.float32)  # 128 KiB: a weight
    shape = np.array([1, -1, 256], np.int64)  # small: a value shape inference reads
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["y"], name="proj"),
            helper.make_node("Reshape", ["y", "shape"], ["z"], name="reshape"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 128])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(weight, "w"), onnx.numpy_helper.from_array(shape, "shape")],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    view = GraphView.load(path)
    np.testing.assert_array_equal(view.initializers["w"], weight)
    np.testing.assert_array_equal(view.initializers["shape"], shape)
    held = {i.name: i for i in view.model.graph.initializer}
    assert not held["w"].raw_data and list(held["w"].dims) == [128, 256] and held["shape"].raw_data
    assert view.shapes["y"] == (1, 4, 256) and view.shapes["z"] == (1, 4, 256)


def _decoder():
    return graphs.transformer(causal=True, lm_head=True, swiglu=True, d=128, heads=4, vocab=256)


def _decoder_with_external_weights(tmp_path, name="ext.onnx"):
    path = tmp_path / name
    onnx.save(
        _decoder(),
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=f"{name}.data",
        size_threshold=1024,
    )
    return path


def test_the_graph_view_maps_external_weights_and_analyses_as_it_does_inline(tmp_path):
    """Weights in an external-data file are mapped, not read (a 0.5 B decoder's 2 GB cost nothing in the analysis),
    and the analysis is the one of the same model with its weights inline."""
    inline = tmp_path / "inline.onnx"
    onnx.save(_decoder(), inline)
    external = _decoder_with_external_weights(tmp_path)
    from tapeout.graph.view import GraphView

    view = GraphView.load(external)
    whole = onnx.load(str(inline))
    mapped = [n for n, a in view.initializers.items() if isinstance(a, np.memmap)]
    large = [i.name for i in whole.graph.initializer if len(i.raw_data) >= 1 << 16]
    assert large and sorted(mapped) == sorted(large)
    for init in whole.graph.initializer:
        np.testing.assert_array_equal(view.initializers[init.name], onnx.numpy_helper.to_array(init))
    assert not any(i.data_location == TensorProto.EXTERNAL for i in view.model.graph.initializer)
    assert analyze(external).to_json() == analyze(inline).to_json()


@pytest.mark.parametrize(
    "damage, message",
    [
        ({"location": "../outside.data"}, "not a plain relative path"),
        ({"location": "/etc/passwd"}, "not a plain relative path"),
        ({"offset": "999999999"}, "do not fit its dims and type"),
        ({"length": "3"}, "do not fit its dims and type"),
        ({"offset": "x"}, "external-data entry tapeout cannot read"),
    ],
)
def test_an_external_data_entry_that_leaves_its_folder_or_its_file_is_refused(tmp_path, damage, message):
    from tapeout.core.errors import BadInput
    from tapeout.graph.view import GraphView

    path = _decoder_with_external_weights(tmp_path)
    model = onnx.load(str(path), load_external_data=False)
    init = next(i for i in model.graph.initializer if i.data_location == TensorProto.EXTERNAL)
    for entry in init.external_data:
        if entry.key in damage:
            entry.value = damage.pop(entry.key)
    for key, value in damage.items():
        init.external_data.add(key=key, value=value)
    onnx.save(model, path)
    with pytest.raises(BadInput, match=message):
        GraphView.load(path)


def test_an_external_weight_of_a_type_numpy_cannot_map_is_read_and_decoded_as_onnx_does(tmp_path):
    """bfloat16 (like int4 and the float8s) is not a plain numpy type: its bytes are read and decoded by onnx."""
    import ml_dtypes

    from tapeout.graph.view import GraphView

    weight = np.random.default_rng(0).standard_normal((128, 256)).astype(ml_dtypes.bfloat16)  # 64 KiB: a weight
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["w"], ["w32"], to=TensorProto.FLOAT, name="cast"),
            helper.make_node("MatMul", ["x", "w32"], ["y"], name="proj"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(weight, "w")],
    )
    path = tmp_path / "bf16.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path, save_as_external_data=True, location="bf16.onnx.data", size_threshold=1024)
    assert onnx.load(str(path), load_external_data=False).graph.initializer[0].data_location == TensorProto.EXTERNAL
    view = GraphView.load(path)
    got = view.initializers["w"]
    assert not isinstance(got, np.memmap) and got.dtype == weight.dtype
    np.testing.assert_array_equal(got.astype(np.float32), weight.astype(np.float32))
    assert view.shapes["y"] == (1, 4, 256)
