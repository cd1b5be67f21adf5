"""The kernels OpenVINO's CPU plugin runs, read from the graph it compiles here (estimation/openvino_graph.py):
the cost units it runs in place or at compile time dropped, the ones it fuses merged, its layout reorders added."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import SAMPLES, run_cli
from tapeout.core.schemas import InputSpec
from tapeout.estimation import cost_units as kern
from tapeout.estimation import openvino_graph as ov_graph
from tapeout.graph.analyze import analyze_view
from tapeout.graph.view import GraphView


def _layer(name, kind, *originals, size=0.0):
    return ov_graph.Layer(name, kind, tuple(originals), size)


def test_one_layer_merges_the_kernels_it_holds_and_a_reorder_moves_its_tensor():
    """Our side of the mapping, on layers as the runtime graph lists them: a FullyConnected holding a MatMul and a
    Gelu is one matmul kernel with both kernels' FLOPs and the MatMul's bytes; a Reorder reads and writes its tensor;
    a view the graph names only on a layer it does not run is dropped; of the kernels it names nowhere, a norm (rebuilt
    under a new name) stays and an Add (fused into a neighbour as a post-op) goes."""
    kernels = [kern.Kernel("mm", "matmul", "fp32", 1000, 400.0, 1, lead="mm"),
               kern.Kernel("act", "elementwise", "fp32", 50, 200.0, 1),
               kern.Kernel("view", "movement", "fp32", 0, 0.0, 1),
               kern.Kernel("norm", "reduce", "fp32", 80, 300.0, 1),
               kern.Kernel("add", "elementwise", "fp32", 64, 768.0, 1)]
    nodes = {"mm": "mm", "act": "act", "view": "view", "norm": "norm", "add": "add"}
    layers = [_layer("fc", "FullyConnected", "mm", "act"), _layer("in_acdb", "Reorder", size=64.0),
              _layer("MVN_7", "MVN", "MVN_7")]
    out = {k.name: k for k in ov_graph.executed_kernels(kernels, nodes, layers, {"mm", "act", "view", "MVN_7"})}
    assert sorted(out) == ["Reorder in_acdb", "mm", "norm"]
    assert out["mm"].cls == "matmul" and out["mm"].flops == 1050 and out["mm"].bytes == 400.0 and out["mm"].nodes == 2
    assert out["Reorder in_acdb"].cls == "movement" and out["Reorder in_acdb"].bytes == 128.0
    assert out["norm"] == kernels[3]


def test_attentions_two_matmuls_in_one_layer_keep_both_their_bytes():
    parts = [kern.Kernel("qk", "matmul", "fp32", 800, 300.0, 1), kern.Kernel("soft", "reduce", "fp32", 90, 500.0, 1),
             kern.Kernel("av", "matmul", "fp32", 800, 350.0, 1)]
    fused = ov_graph.merged(parts)
    assert fused.cls == "matmul" and fused.flops == 1690 and fused.bytes == 650.0 and fused.nodes == 3


def test_an_mha_subgraph_is_one_kernel_with_the_scores_it_absorbed_unnamed():
    """OpenVINO's MHA subgraph is named after the weighted sum (P·V) and names no scores MatMul (Q·Kᵀ), which the
    mapping keeps as a kernel of its own: it is merged into the MHA kernel whose shape it matches (rows, and depth
    and columns swapped), so one executed subgraph is one kernel, as the sweep times one; a second MHA of another
    shape keeps its own scores, and scores with no matching MHA stay as they are."""
    def attention(name, m, k, n, runs_as=""):
        return kern.Kernel(name, "matmul", "fp32", 2 * m * k * n, 4.0 * (m * k + k * n + m * n), 1,
                           shape=(("m", m), ("k", k), ("n", n)), runs_as=runs_as)

    kernels = [attention("pv0", 768, 128, 32), attention("qk0", 768, 32, 128), attention("pv1", 64, 16, 32),
               attention("qk1", 64, 32, 16), attention("qk_lone", 10, 8, 8)]
    nodes = {"pv0": "pv0", "pv1": "pv1"}
    layers = [_layer("mha0", "Subgraph", "pv0"), _layer("mha1", "Subgraph", "pv1")]
    out = ov_graph.executed_kernels(kernels, nodes, layers, {"pv0", "pv1"},
                                    frozenset({"pv0", "qk0", "pv1", "qk1", "qk_lone"}))
    assert [(k.name, k.cls, k.runs_as) for k in out] == [("pv0", "attention", "mha0"), ("pv1", "attention", "mha1"),
                                                          ("qk_lone", "attention", "")]
    assert out[0].flops == kernels[0].flops + kernels[1].flops and out[0].bytes == kernels[0].bytes + kernels[1].bytes
    assert out[1].flops == kernels[2].flops + kernels[3].flops and out[0].nodes == 2
    assert dict(out[0].shape) == {"m": 768, "k": 128, "n": 32}


def test_a_swept_attention_is_one_mha_kernel_as_openvino_runs_it():
    """The sweep's attention configuration (queries, keys and values of a few heads, scaled scores, an optional
    causal mask, softmax, weighted sum) is one `attention` kernel to the estimator only as OpenVINO compiles it: its
    cost units are a Transpose, two MatMuls and a Softmax; mapped through the plugin's graph, one kernel shaped as its
    weighted sum, holding both MatMuls' FLOPs."""
    from tapeout.commands.sweep import TARGETS, _ov_config
    from tapeout.estimation import roofline, sweep

    roof = roofline.Roof("t", "cpu", {"fp32": 1e11}, 1e10, "test")
    for causal in (0, 1):
        config = sweep.Config("attention", "Attention", (("heads", 4), ("q", 24), ("kv", 24), ("d", 16),
                                                         ("causal", causal)))
        proto, inputs = sweep.model(config)
        assert sweep.features_of(proto, inputs, roof) is None  # several kernels as cost units
        feats = sweep.features_of(proto, inputs, roof, "fp32", _ov_config(TARGETS["openvino"].options(1)))
        assert feats is not None and feats["cls"] == "attention"
        assert feats["shape"] == {"m": 4 * 24, "k": 24, "n": 16}
        assert feats["flops"] >= 2 * (2 * 4 * 24 * 24 * 16)
    assert "attention" in TARGETS["onnxruntime"].not_run


def _model(path):
    """x @ W + b -> Relu (one fusion group), a Reshape, then a LayerNormalization: OpenVINO runs the first three as
    one FullyConnected with its post-ops, the Reshape in place, the norm as an MVN it names anew."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [32, 64], rng.standard_normal(32 * 64).tolist())
    b = helper.make_tensor("b", TensorProto.FLOAT, [64], rng.standard_normal(64).tolist())
    g = helper.make_tensor("g", TensorProto.FLOAT, [64], [1.0] * 64)
    shape = helper.make_tensor("shape", TensorProto.INT64, [3], [1, 32, 64])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="proj"),
             helper.make_node("Add", ["m", "b"], ["a"], name="bias"),
             helper.make_node("Relu", ["a"], ["r"], name="act"),
             helper.make_node("Reshape", ["r", "shape"], ["v"], name="view"),
             helper.make_node("LayerNormalization", ["v", "g", "b"], ["y"], name="norm", axis=-1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 64])], [w, b, g, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def test_the_kernels_openvino_compiles_a_model_into(tmp_path):
    ov = pytest.importorskip("openvino", reason="OpenVINO is in the [openvino] extra")
    source = _model(tmp_path / "m.onnx")
    ov.save_model(ov.convert_model(str(source)), str(tmp_path / "model.xml"))
    project = SimpleNamespace(inputs=[InputSpec(name="x", shape=[32, 32])], dims={})
    view = GraphView.load(source, project.inputs, {})
    units = kern.structure(view, analyze_view(view))
    assert sorted(k.cls for k in units) == ["matmul", "movement", "reduce"]
    found, note = ov_graph.kernels_for(tmp_path / "model.xml", source, project,
                                       {"device": "CPU", "threads": 1, "inference_precision": "f32"}, units)
    classes = sorted(k.cls for k in found)
    assert "movement" not in [k.cls for k in found if not k.name.startswith("Reorder ")]  # the Reshape runs in place
    assert classes.count("matmul") == 1 and classes.count("reduce") == 1
    fc = next(k for k in found if k.cls == "matmul")
    assert fc.flops == next(k for k in units if k.cls == "matmul").flops
    assert note.startswith(f"OpenVINO's compiled graph on this host runs {len(found)} kernels for the model's 3 ")
    assert ov_graph.kernels_for(tmp_path / "model.xml", source, project, {"device": "GPU"}, units) == (None, None)
    # an IR it cannot compile here: the cost units stand, and the note says why
    (tmp_path / "bad.xml").write_text("<net name='x' version='11'><layers>")
    found, note = ov_graph.kernels_for(tmp_path / "bad.xml", source, project, {"threads": 1}, units)
    assert found is None and note.startswith("OpenVINO could not compile the build's IR here (")
    assert "tags mismatch" in note and "\n" not in note


def test_an_openvino_builds_estimate_prices_the_kernels_its_compiled_graph_runs(tmp_path, fast_profile):
    pytest.importorskip("openvino", reason="OpenVINO is in the [openvino] extra")
    profile = tmp_path / "ov.toml"
    profile.write_text(fast_profile.read_text().replace('extends = "cpu-fp32"', 'extends = "openvino-cpu"'))
    out = tmp_path / "b"
    assert run_cli("build", SAMPLES / "digits-cnn", "--profile", profile, "--out", out).code == 0
    report = json.loads((out / "report.json").read_text())
    assert any(n.startswith("OpenVINO's compiled graph on this host runs") for n in report["estimate"]["notes"])
    again = run_cli("estimate", out, "--json")
    assert again.code == 0, again.err
    assert again.json()["predicted_ms"] == report["estimate"]["predicted_ms"]  # the same figure, read again


def _conv_then_norm(path, channels=64, side=32):
    """A 1×1 conv (which OpenVINO runs channels-last), a Reshape and a group norm's MVN (plain): the plugin reorders
    the conv's output back to plain between them."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [channels, channels, 1, 1],
                           (rng.standard_normal(channels * channels) * 0.1).tolist())
    shape = helper.make_tensor("shape", TensorProto.INT64, [3], [1, 4, -1])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Reshape", ["c", "shape"], ["r"], name="view"),
             helper.make_node("ReduceMean", ["r"], ["y"], name="mean", axes=[2], keepdims=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         [1, channels, side, side])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 1])], [w, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def test_a_reorder_is_strided_where_the_plugin_runs_its_generic_one(tmp_path):
    """Whichever reorder this CPU's plugin picks: oneDNN's generic one (element by element) is a `strided` kernel with
    its channels a plane apart, any other a movement kernel of its bytes; each kernel names the layer it ran as."""
    ov = pytest.importorskip("openvino", reason="OpenVINO is in the [openvino] extra")
    source = _conv_then_norm(tmp_path / "m.onnx")
    ov.save_model(ov.convert_model(str(source)), str(tmp_path / "model.xml"))
    project = SimpleNamespace(inputs=[InputSpec(name="x", shape=[1, 64, 32, 32])], dims={})
    view = GraphView.load(source, project.inputs, {})
    config = {"device": "CPU", "threads": 1, "inference_precision": "f32"}
    found, _ = ov_graph.kernels_for(tmp_path / "model.xml", source, project, config,
                                    kern.structure(view, analyze_view(view)))
    from tapeout.targets import ov as ov_target

    layers, _ = ov_graph.runtime_layers(ov.Core().read_model(str(tmp_path / "model.xml")),
                                        ov_target.compile_config(ov_target.Options(**config)))
    reorders = [layer for layer in layers if layer.type == "Reorder"]
    assert reorders  # the conv runs blocked or channels-last, the norm plain
    by_layer = {k.runs_as: k for k in found}
    assert all(k.runs_as for k in found if k.cls != "reduce")
    for layer in reorders:
        kernel = by_layer[layer.name]
        generic = layer.primitive.startswith("reorder_") and "brgemm" not in layer.primitive
        assert kernel.cls == ("strided" if generic else "movement"), layer
        if generic:   # between channels-last and plain: 64 channels of a 32 × 32 plane
            assert dict(kernel.shape) == {"elements": 65536, "lines": 64, "stride": 4096}


def test_a_conv_of_few_output_channels_costs_the_registers_its_isa_fills():
    """Our side: a dense conv's FLOPs are its output channels rounded up to the registers of the ISA its primitive
    names (16 with AVX-512, 8 with AVX2); a full register, a grouped conv, or a primitive naming no ISA keeps them."""
    head = kern.Kernel("head", "conv", "fp32", 1000, 10.0, 1,
                       shape=(("per_group", 32), ("out_channels", 4), ("groups", 1)))
    assert ov_graph.lanes("brgconv_avx512_f32") == 16 and ov_graph.lanes("jit_avx2_I8") == 8
    assert ov_graph.lanes("ref_any") == 1
    assert ov_graph.padded_conv(head, "brgconv_avx512_f32").flops == 4000
    assert ov_graph.padded_conv(head, "brgconv_avx2_f32").flops == 2000
    assert ov_graph.padded_conv(head, "ref_any").flops == 1000
    full = kern.Kernel("c", "conv", "fp32", 1000, 10.0, 1, shape=(("out_channels", 32), ("groups", 1)))
    depthwise = kern.Kernel("d", "conv", "fp32", 1000, 10.0, 1, shape=(("out_channels", 4), ("groups", 4)))
    assert ov_graph.padded_conv(full, "brgconv_avx512_f32") is full
    assert ov_graph.padded_conv(depthwise, "brgconv_avx512_f32") is depthwise


def test_a_conv_that_writes_the_models_output_is_found_and_priced_padded(tmp_path):
    """The plugin names the layer that makes a model output after the output ("noise", unet's head), not the node:
    the conv is still mapped onto it, and runs as the registers its primitive fills."""
    ov = pytest.importorskip("openvino", reason="OpenVINO is in the [openvino] extra")
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 32, 3, 3], (rng.standard_normal(4 * 32 * 9) * 0.1).tolist())
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["noise"], name="head", pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 16, 16])],
                              [helper.make_tensor_value_info("noise", TensorProto.FLOAT, [1, 4, 16, 16])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "m.onnx"))
    ov.save_model(ov.convert_model(str(tmp_path / "m.onnx")), str(tmp_path / "model.xml"))
    project = SimpleNamespace(inputs=[InputSpec(name="x", shape=[1, 32, 16, 16])], dims={})
    view = GraphView.load(tmp_path / "m.onnx", project.inputs, {})
    units = kern.structure(view, analyze_view(view))
    config = {"device": "CPU", "threads": 1, "inference_precision": "f32"}
    found, _ = ov_graph.kernels_for(tmp_path / "model.xml", tmp_path / "m.onnx", project, config, units)
    conv = next(k for k in found if k.cls == "conv")
    assert conv.runs_as  # mapped onto its layer, which the profile times it by
    from tapeout.targets import ov as ov_target

    layers, _ = ov_graph.runtime_layers(ov.Core().read_model(str(tmp_path / "model.xml")),
                                        ov_target.compile_config(ov_target.Options(**config)))
    layer = next(layer for layer in layers if layer.name == conv.runs_as)
    block = ov_graph.lanes(layer.primitive)
    assert conv.flops == units[0].flops * max(block, 4) // 4
