"""The model kinds users bring, built from configs (tests/zoo_models.py), end to end.

Each kind: the family detected, the export's outputs right, `cpu-int8` really quantized (the
artifact holds integer ops where the plan says, the postcondition passed) and, for the speech and
recurrent kinds, a QNN build (HTP emulator) within its accuracy budget. Weights are random and
seeded; the accuracy metric is fidelity to the FP32 torch model. Behind `slow` and `zoo`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
import zoo_models

from conftest import assert_within_bounds, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.zoo]

TOKENS = [("input_ids", [1, 16], "int64", [0, 127])]
IMAGE = [("pixel_values", [1, 3, 32, 32], "float32", [0.0, 1.0])]

# name → (source, inputs, outputs, family, output shape)
CASES = {
    "gpt2": ("hf", TOKENS, ["logits"], "decoder-llm", [1, 16, 128]),
    "llama": ("hf", TOKENS, ["logits"], "decoder-llm", [1, 16, 128]),
    "distilbert": ("hf", TOKENS, ["logits"], "transformer-encoder", [1, 3]),
    "distilbert-module": ("zoo_models.py:distilbert", TOKENS, ["logits"], "transformer-encoder", [1, 3]),
    "vit": ("hf", IMAGE, ["logits"], "transformer-encoder", [1, 5]),
    "resnet": ("hf", IMAGE, ["logits"], "cnn", [1, 5]),
    "whisper": (
        "zoo_models.py:whisper_encoder",
        [("input_features", [1, 16, 64], "float32", [-1.0, 1.0])],
        ["last_hidden_state"],
        "transformer-encoder",
        [1, 32, 32],
    ),
    "wav2vec2": (
        "zoo_models.py:wav2vec2",
        [("input_values", [1, 1600], "float32", [-1.0, 1.0])],
        ["hidden"],
        "transformer-encoder",
        None,
    ),
    "unet": (
        "zoo_models.py:unet",
        [("latent", [1, 4, 16, 16], "float32", [-1.0, 1.0]), ("timestep", [1], "float32", [0.0, 999.0])],
        ["noise"],
        "diffusion",
        [1, 4, 16, 16],
    ),
    "lstm": (
        "zoo_models.py:lstm",
        [("frames", [1, 49, 20], "float32", [-1.0, 1.0])],
        ["logits"],
        "speech-recurrent",
        [1, 12],
    ),
    "cnn-lstm": (
        "zoo_models.py:cnn_lstm",
        [("image", [1, 1, 16, 32], "float32", [0.0, 1.0])],
        ["logits"],
        "cnn",
        [1, 16, 20],
    ),
    "vad": (
        "zoo_models.py:vad",
        [("frame", [1, 64], "float32", [-1.0, 1.0]), ("sample_rate", [], "int64", [16000, 16000])],
        ["speech"],
        "mlp",
        [1, 1],
    ),
    "conv-gru-vad": (
        "zoo_models.py:conv_gru_vad",
        [("audio", [1, 512], "float32", [-1.0, 1.0]), ("sample_rate", [], "int64", [16000, 16000])],
        ["speech"],
        "speech-recurrent",
        [1, 1],
    ),
}
INTEGER_OPS = {
    "DynamicQuantizeMatMul",
    "MatMulInteger",
    "MatMulIntegerToFloat",
    "DynamicQuantizeLSTM",
    "QLinearConv",
    "QLinearMatMul",
    "ConvInteger",
}
FAST_INT8 = 'extends = "cpu-int8"\n[check]\niterations = 30\nrepeats = 1\nwarmup_min_s = 0.05\nop_profile = false\n'


def _project(root: Path, name: str, metric: str | None = None) -> Path:
    source, inputs, outputs, _, _ = CASES[name]
    project = root / name
    project.mkdir()
    shutil.copy(Path(zoo_models.__file__), project / "zoo_models.py")
    if source == "hf":
        zoo_models.save_hf(name, project / "hf")
    metric_lines = (
        f'[evaluation]\nmetric = "zoo_models.py:{metric}"\ndirection = "higher"\nname = "cosine"\n' if metric else ""
    )
    zoo_models.write_project(project, source, inputs, outputs, metric_lines)
    (project / "int8.toml").write_text(FAST_INT8)
    return project


def _op_types(path: Path) -> set[str]:
    from tapeout.core.onnx_graphs import graphs_in

    return {n.op_type for g in graphs_in(onnx.load(str(path)).graph) for n in g.node}


@pytest.mark.parametrize("name", list(CASES))
def test_each_kind_is_detected_exported_and_really_quantized_for_the_cpu(tmp_path, name):
    project = _project(tmp_path, name)
    out = tmp_path / "build"
    result = run_cli("build", project, "--profile", project / "int8.toml", "--out", out)
    assert result.code == 0, result.err + result.out
    report = json.loads((out / "report.json").read_text())
    assert_within_bounds(out, report)
    _, _, outputs, family, shape = CASES[name]
    analysis = report["analysis"]
    assert analysis["family"] == family, analysis["families"]
    assert report["export"]["output_names"] == outputs
    exported = onnx.load(str(out / "export" / "model.onnx"), load_external_data=False)
    assert [o.name for o in exported.graph.output] == outputs
    if shape is not None:  # the task head's output, not a backbone's hidden state
        assert [d.dim_value for d in exported.graph.output[0].type.tensor_type.shape.dim] == shape
    plan = report["quantization"]["plan"]
    assert plan["quantized_groups"] > 0
    ops = _op_types(out / "artifact" / report["artifact"]["main_file"])
    quantize_linear = "QuantizeLinear" in ops and "DequantizeLinear" in ops
    assert ops & INTEGER_OPS or (plan["method"] == "static" and quantize_linear), ops

    groups = {g["group"]: g for g in plan["groups"]}
    if name == "gpt2":  # GPT-2's Conv1D exports as Gemm: rewritten, then quantized (not silently FP32)
        assert report["quantization"]["apply"]["gemm_as_matmul"] > 0
    if name == "lstm":  # the LSTM is a group, quantized by ORT's dynamic LSTM; its folded weights count
        assert "DynamicQuantizeLSTM" in ops and "LSTM" not in ops
        cell = next(g for g in analysis["groups"] if g["role"] == "recurrent_cell")
        assert cell["params"] == sum(p.numel() for p in zoo_models.lstm().lstm.parameters())  # W, R and B
    if name == "cnn-lstm":  # a CNN by MAC share: static QDQ, whose ORT has no LSTM; the cell stays float, saying so
        cell = next(g for g in groups.values() if g["role"] == "recurrent_cell")
        assert cell["precision"] == "fp32" and "no LSTM/GRU kernel" in cell["reason"]
        assert analysis["families"][1]["family"] == "speech-recurrent"
    if name == "vad":  # the whole network is in an If's branches: analysed, costed and quantized there
        assert "If " in analysis["facts"]["control_flow"] and analysis["params"] > 0
        main = {n.op_type for n in onnx.load(str(out / "artifact" / report["artifact"]["main_file"])).graph.node}
        assert all(g["precision"] == "int8" for g in groups.values())
        assert (ops - main) & INTEGER_OPS  # integer ops inside the branches, where the weights are used
    if name == "conv-gru-vad":  # convs in the If's branches INT8 (their weights moved in), the first and GRU float
        assert {g["group"]: g["precision"] for g in groups.values()} == {
            "first_conv": "fp32",
            "conv1": "int8",
            "first_conv#2": "fp32",
            "conv2": "int8",
            "recurrent_cell1": "fp32",
            "linear1": "int8",
        }
        assert not report["quantization"].get("fallbacks")
        main = {n.op_type for n in onnx.load(str(out / "artifact" / report["artifact"]["main_file"])).graph.node}
        assert "ConvInteger" in ops - main
        moved = next(p for p in report["passes"] if p["name"] == "localize-body-weights")
        assert moved["outcome"] == "applied" and moved["rewrites"] == 4  # each branch's second conv: weight, bias
    if name == "unet":
        assert any(g["role"] == "timestep_embedding" and g["precision"] == "fp32" for g in groups.values())


# name → fidelity metric: the speech and recurrent kinds on the Hexagon HTP (emulated)
NPU_CASES = {
    "lstm": "lstm_fidelity",
    "cnn-lstm": "cnn_lstm_fidelity",
    "whisper": "whisper_encoder_fidelity",
    "wav2vec2": "wav2vec2_fidelity",
}


@pytest.mark.parametrize("name", list(NPU_CASES))
def test_speech_and_recurrent_kinds_build_for_the_htp_within_their_accuracy_budget(tmp_path, name):
    project = _project(tmp_path, name, metric=NPU_CASES[name])
    profile = project / "qnn.toml"
    profile.write_text(
        'extends = "qnn-sm8650"\n[quantization]\ncalibration_samples = 16\n[check]\niterations = 10\nrepeats = 1\n'
    )
    out = tmp_path / "build"
    result = run_cli("build", project, "--profile", profile, "--out", out)
    assert result.code == 0, result.err + result.out
    report = json.loads((out / "report.json").read_text())
    verdicts = {b["budget"]: b["verdict"] for b in report["budgets"]}
    assert verdicts["accuracy_max_drop"] == "pass" and verdicts["placement_max_off_share"] == "pass", verdicts
    groups = report["quantization"]["plan"]["groups"]
    if name in ("lstm", "cnn-lstm"):  # recurrent state in 16 bits whatever the family (cnn-lstm is a "cnn")
        cell = next(g for g in groups if g["role"] == "recurrent_cell")
        assert cell["precision"] == "a16w8", cell
