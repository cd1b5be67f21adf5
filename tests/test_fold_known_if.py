"""The `fold-known-if` source pass: a voice-activity model exported as published VADs are, its whole network inside an
`If` on the sample rate (a CNN front end and an LSTM carrying h and c, one network per rate), folded to the branch
the project's pinned sample rate takes, so that quantization reaches the network; checked against the source on
sample inputs by the export step."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from conftest import run_cli
from tapeout.core.schemas import InputSpec
from tapeout.quantize.passes.base import run_on_proto
from tapeout.quantize.passes.fold_known_if import FoldKnownIf

HIDDEN = 16  # the LSTM's state: small beside the convolutions, which hold most of the MACs (the model is a CNN)


def _network(rng, tag: str, stride: int):
    """Three Conv → Relu over a [1, 1, 512] chunk, an LSTM over the frames from (h, c), a sigmoid of the last
    state: the branch's nodes, initializers and outputs (prob, hn, cn), reading x, h and c from the outer graph."""
    from onnx import TensorProto, helper, numpy_helper

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), f"{tag}/{name}")

    inits = [
        weight("conv1", 64, 1, 8),
        weight("conv2", 128, 64, 4),
        weight("conv3", 128, 128, 3),
        weight("w", 1, 4 * HIDDEN, 128),
        weight("r", 1, 4 * HIDDEN, HIDDEN),
        weight("head", HIDDEN, 1),
        numpy_helper.from_array(np.array([1, 1, -1], np.int64), f"{tag}/shape"),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", f"{tag}/shape"], [f"{tag}/audio"]),
        helper.make_node("Conv", [f"{tag}/audio", f"{tag}/conv1"], [f"{tag}/c1"], strides=[stride], name=f"{tag}/c1"),
        helper.make_node("Relu", [f"{tag}/c1"], [f"{tag}/r1"]),
        helper.make_node("Conv", [f"{tag}/r1", f"{tag}/conv2"], [f"{tag}/c2"], strides=[2], name=f"{tag}/c2"),
        helper.make_node("Relu", [f"{tag}/c2"], [f"{tag}/r2"]),
        helper.make_node("Conv", [f"{tag}/r2", f"{tag}/conv3"], [f"{tag}/c3"], name=f"{tag}/c3"),
        helper.make_node("Relu", [f"{tag}/c3"], [f"{tag}/r3"]),
        helper.make_node("Transpose", [f"{tag}/r3"], [f"{tag}/frames"], perm=[2, 0, 1]),
        helper.make_node(
            "LSTM",
            [f"{tag}/frames", f"{tag}/w", f"{tag}/r", "", "", "h", "c"],
            ["", f"{tag}/hn", f"{tag}/cn"],
            hidden_size=HIDDEN,
            name=f"{tag}/lstm",
        ),
        helper.make_node("Squeeze", [f"{tag}/hn"], [f"{tag}/last"]),
        helper.make_node("MatMul", [f"{tag}/last", f"{tag}/head"], [f"{tag}/logit"], name=f"{tag}/head"),
        helper.make_node("Sigmoid", [f"{tag}/logit"], [f"{tag}/prob"]),
    ]
    outputs = [helper.make_tensor_value_info(f"{tag}/{name}", TensorProto.FLOAT, None) for name in ("prob", "hn", "cn")]
    return helper.make_graph(nodes, tag, [], outputs, inits)


def vad_model(condition_on: str = "sr"):
    """Published VADs' form: If(sr == 16000) then the 16 kHz network else the 8 kHz one, both carrying (h, c)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    nodes = [
        helper.make_node("Equal", [condition_on, "rate16k"], ["is16k"]),
        helper.make_node(
            "If",
            ["is16k"],
            ["prob", "hn", "cn"],
            then_branch=_network(rng, "wide", 4),
            else_branch=_network(rng, "narrow", 2),
            name="by_rate",
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "vad",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 1, HIDDEN]),
            helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 1, HIDDEN]),
        ],
        [
            helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 1]),
            helper.make_tensor_value_info("hn", TensorProto.FLOAT, [1, 1, HIDDEN]),
            helper.make_tensor_value_info("cn", TensorProto.FLOAT, [1, 1, HIDDEN]),
        ],
        [numpy_helper.from_array(np.array(16000, np.int64), "rate16k")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def _inputs(rate: int | None):
    return [
        InputSpec(name="x", shape=[1, 512]),
        InputSpec(name="sr", shape=[], dtype="int64", range=None if rate is None else (rate, rate)),
        InputSpec(name="h", shape=[1, 1, HIDDEN]),
        InputSpec(name="c", shape=[1, 1, HIDDEN]),
    ]


def _run(model, rate: int) -> list[np.ndarray]:
    import onnxruntime as ort

    rng = np.random.default_rng(9)
    feeds = {
        "x": rng.standard_normal((1, 512)).astype(np.float32),
        "sr": np.array(rate, np.int64),
        "h": rng.standard_normal((1, 1, HIDDEN)).astype(np.float32),
        "c": rng.standard_normal((1, 1, HIDDEN)).astype(np.float32),
    }
    runtime = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return runtime.run(None, feeds)


@pytest.mark.parametrize(("rate", "branch"), [(16000, "then"), (8000, "else")])
def test_the_if_becomes_the_branch_the_pinned_rate_takes_and_computes_what_it_did(rate, branch):
    model = vad_model()
    expected = _run(model, rate)
    folded, records = run_on_proto(vad_model(), [FoldKnownIf(_inputs(rate), {})])
    assert records[0]["outcome"] == "applied" and records[0]["rewrites"] == 1
    assert records[0]["reason"] == f"at sr = {rate}: If 'by_rate': {branch} branch kept"
    assert not any(n.op_type == "If" for n in folded.graph.node)
    names = [n.name for n in folded.graph.node]  # quantizers address nodes by name: none left unnamed
    assert all(names) and len(set(names)) == len(names)
    kept = "wide" if branch == "then" else "narrow"
    assert {n.name for n in folded.graph.node if n.op_type == "Conv"} == {f"{kept}/c1", f"{kept}/c2", f"{kept}/c3"}
    for got, want in zip(_run(folded, rate), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_an_if_on_an_input_the_project_does_not_pin_stays():
    _, records = run_on_proto(vad_model(), [FoldKnownIf(_inputs(None), {})])
    assert records[0]["outcome"] == "skipped" and "no input is pinned" in records[0]["reason"]
    # pinned sr, but the condition reads the audio: not known before it runs
    model = vad_model(condition_on="x")
    _, records = run_on_proto(model, [FoldKnownIf(_inputs(16000), {})])
    assert records[0]["outcome"] == "skipped" and records[0]["reason"] == FoldKnownIf.nothing_matched


PROJECT = """[model]
source = "vad.onnx"
outputs = ["prob", "hn", "cn"]

[calibration]
data = "calibration.npz"

[[inputs]]
name = "x"
shape = [1, 512]

[[inputs]]
name = "sr"
shape = []
dtype = "int64"
range = [16000, 16000]

[[inputs]]
name = "h"
shape = [1, 1, 16]

[[inputs]]
name = "c"
shape = [1, 1, 16]
"""
FAST = 'extends = "{base}"\n[check]\niterations = 20\nrepeats = 1\nwarmup_min_s = 0.05\nop_profile = false\n'


@pytest.mark.slow
@pytest.mark.parametrize(("base", "method"), [("cpu-int8", "static"), ("qnn-sm8650", "npu-static")])
def test_a_vad_inside_an_if_on_its_sample_rate_is_quantized(tmp_path, base, method):
    """Before the fold, static INT8 never reached the If's branches and the build was refused ("the cnn rule found
    nothing to quantize"; on the HTP the lint refused the If itself); now the convolutions are quantized, on ONNX
    Runtime CPU and on the QNN HTP emulator, and each build meets its profile's parity budget."""
    project = tmp_path / "vad"
    project.mkdir()
    onnx.save(vad_model(), project / "vad.onnx")
    (project / "tapeout.toml").write_text(PROJECT)
    rng = np.random.default_rng(2)  # static INT8 calibrates on these: noise-like chunks, states in the LSTM's range
    np.savez(
        project / "calibration.npz",
        x=(rng.standard_normal((16, 1, 512)) * 0.3).astype(np.float32),
        sr=np.full(16, 16000, np.int64),
        h=np.tanh(rng.standard_normal((16, 1, 1, HIDDEN))).astype(np.float32),
        c=rng.standard_normal((16, 1, 1, HIDDEN)).astype(np.float32),
    )
    profile = tmp_path / "fast.toml"
    profile.write_text(FAST.format(base=base))
    result = run_cli("build", project, "--profile", profile, "--out", tmp_path / "b", "--json")
    assert result.code == 0, result.err + result.out
    report = result.json()
    fold = next(p for p in report["passes"] if p["name"] == "fold-known-if")
    assert (fold["stage"], fold["outcome"]) == ("source", "applied")
    assert "then branch kept" in fold["reason"]
    plan = report["quantization"]["plan"]
    assert report["analysis"]["families"][0]["family"] == "cnn" and plan["method"] == method
    assert any(g["precision"] == "int8" and g["role"] == "conv" for g in plan["groups"])
    artifact = onnx.load(tmp_path / "b" / "artifact" / report["artifact"]["main_file"], load_external_data=False)
    assert not any(n.op_type == "If" for n in artifact.graph.node)


def test_a_fold_that_changes_what_the_model_computes_is_one_line_before_anything_is_built(tmp_path, monkeypatch):
    """The export step checks the folded model against the source on sample inputs: a fold that kept the wrong
    branch (planted here) stops the build with one line naming the pass, and no build dir is left."""
    from tapeout.core.console import UI
    from tapeout.core.errors import BadInput
    from tapeout.steps import flows

    project = tmp_path / "vad"
    project.mkdir()
    onnx.save(vad_model(), project / "vad.onnx")
    (project / "tapeout.toml").write_text(PROJECT.replace('[calibration]\ndata = "calibration.npz"\n', ""))
    monkeypatch.setattr(FoldKnownIf, "_condition", lambda *args: False)  # sr = 16000 takes the then branch
    with pytest.raises(BadInput, match="graph pass fold-known-if changed the model's output prob"):
        flows.build(project, "cpu-fp32", tmp_path / "out", UI())
    assert not (tmp_path / "out").exists()


def test_calibration_samples_off_the_pinned_value_are_one_line(tmp_path):
    """A pinned input is a constant of the build: calibration data at another value is named, not compared."""
    project = tmp_path / "vad"
    project.mkdir()
    onnx.save(vad_model(), project / "vad.onnx")
    (project / "tapeout.toml").write_text(PROJECT)
    rng = np.random.default_rng(2)
    np.savez(
        project / "calibration.npz",
        x=rng.standard_normal((4, 1, 512)).astype(np.float32),
        sr=np.array([16000, 8000, 16000, 16000], np.int64),
        h=np.zeros((4, 1, 1, HIDDEN), np.float32),
        c=np.zeros((4, 1, 1, HIDDEN), np.float32),
    )
    result = run_cli("build", project, "--profile", "cpu-fp32", "--out", tmp_path / "b")
    assert result.code == 2 and "gives sr = 8000, and [[inputs]] range pins it to 16000" in result.err, result.err
    assert "Traceback" not in result.err and not (tmp_path / "b").exists()
