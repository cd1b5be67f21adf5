"""`tapeout init MODEL`: a project file read from the model where it says its inputs, asked for where it does not,
validated as `build` reads it, and never written over one that exists."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import one_line_error, run_cli
from tapeout.core.config import load_project


def _hf_dir(path, architecture: str, **config) -> None:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": [architecture], **config}))


def test_a_causal_lm_directory_becomes_a_generator_with_its_vocabulary(tmp_path):
    _hf_dir(tmp_path / "lm", "LlamaForCausalLM", model_type="llama", vocab_size=49152, max_position_embeddings=8192)
    result = run_cli("init", "lm", cwd=tmp_path)
    assert result.code == 0, result.err
    project = load_project(tmp_path)
    assert project.workload.kind == "generate" and project.workload.max_context == 256
    assert project.inputs[0].name == "input_ids" and project.inputs[0].range == (0, 49151)
    assert project.model.source == "lm" and "tapeout build" in result.out and "generator" in result.out
    text = (tmp_path / "tapeout.toml").read_text()
    assert "[budgets]" in text and "# tpot_p90_ms" in text and "# greedy_min_agreement" in text


def test_an_encoder_and_an_image_classifier_get_their_inputs_from_the_config(tmp_path):
    _hf_dir(tmp_path / "bert", "BertModel", model_type="bert", vocab_size=30522)
    assert run_cli("init", "bert", "--dir", "a", cwd=tmp_path).code == 0
    encoder = load_project(tmp_path / "a")
    assert [s.name for s in encoder.inputs] == ["input_ids", "attention_mask"] and encoder.dims["sequence"] == 128
    _hf_dir(tmp_path / "vit", "ViTForImageClassification", model_type="vit", image_size=32, num_channels=3)
    assert run_cli("init", "vit", "--dir", "b", cwd=tmp_path).code == 0
    image = load_project(tmp_path / "b")
    assert image.inputs[0].name == "pixel_values" and image.inputs[0].shape == ["batch", 3, 32, 32]


def _onnx(path, inputs: dict, outputs: dict) -> None:
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Identity", [i], [o]) for i, o in zip(inputs, outputs, strict=True)]
    graph = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_an_onnx_streaming_model_whose_state_outputs_are_named_after_its_inputs_becomes_a_stream(tmp_path):
    _onnx(
        tmp_path / "vad.onnx",
        {"audio": ["batch", 512], "h": [1, 1, 64]},
        {"speech": ["batch", 512], "h_out": [1, 1, 64]},
    )
    result = run_cli("init", "vad.onnx", cwd=tmp_path)
    assert result.code == 0, result.err
    project = load_project(tmp_path)
    assert project.workload.kind == "stream" and project.workload.state == {"h": "h_out"}
    assert project.dims == {"batch": 1} and project.model.outputs == ["speech", "h_out"]


def test_a_module_whose_forward_does_not_say_its_shapes_asks_for_them(tmp_path):
    (tmp_path / "model.py").write_text("import torch\n\ndef build():\n    return torch.nn.Conv2d(3, 8, 3)\n")
    asked = run_cli("init", "model.py:build", cwd=tmp_path)  # stdin is not a terminal here: no question to ask
    assert asked.code == 2 and "--input input=1x…:float32" in one_line_error(asked)
    given = run_cli("init", "model.py:build", "--input", "input=1x3x32x32", cwd=tmp_path)
    assert given.code == 0, given.err
    project = load_project(tmp_path)
    assert project.inputs[0].shape == [1, 3, 32, 32] and project.model.source == "model.py:build"
    np.testing.assert_equal(project.inputs[0].dtype, "float32")


STREAMING_MODULE = """import torch


class Cell(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRU(160, 32, batch_first=True)
        self.head = torch.nn.Linear(32, 1)

    def forward(self, audio, h):
        out, h_next = self.gru(audio.reshape(1, 1, 160), h)
        return torch.sigmoid(self.head(out[:, -1])), h_next


def build():
    return Cell().eval()
"""


def test_a_module_with_an_input_one_output_shares_the_shape_of_becomes_a_stream_carrying_it(tmp_path):
    """One call on zeros of the given shapes: the output shaped as `h` is the state that feeds it (named h_out),
    the others are named by position, and the project file init writes builds a stream."""
    (tmp_path / "model.py").write_text(STREAMING_MODULE)
    result = run_cli("init", "model.py:build", "--input", "audio=1x160", "--input", "h=1x1x32", cwd=tmp_path)
    assert result.code == 0, result.err
    project = load_project(tmp_path)
    assert project.workload.kind == "stream" and project.workload.state == {"h": "h_out"}
    assert project.model.outputs == ["output0", "h_out"]
    assert "set deadline_ms" in " ".join(result.out.split())


def test_a_module_whose_every_output_matches_an_input_is_no_stream_and_a_failing_maker_is_one_line(tmp_path):
    (tmp_path / "model.py").write_text(
        "import torch\n\ndef build():\n    return torch.nn.Linear(4, 4)\n\ndef broken():\n    return 1 / 0\n"
    )
    result = run_cli("init", "model.py:build", "--input", "input=1x4", cwd=tmp_path)
    assert result.code == 0, result.err
    assert load_project(tmp_path).workload.kind == "forward"
    (tmp_path / "tapeout.toml").unlink()
    failed = run_cli("init", "model.py:broken", cwd=tmp_path)
    line = one_line_error(failed)
    assert failed.code == 2 and "raised ZeroDivisionError" in line and "model.py:7" in line, failed.err
    assert not (tmp_path / "tapeout.toml").exists()


@pytest.mark.parametrize(
    ("args", "says", "mine"),
    [
        (["nowhere.onnx"], "nowhere.onnx not found", False),
        (["model.onnx", "--input", "x=1x?"], "--input 'x=1x?' is not NAME=SHAPE[:DTYPE]", False),
        (["model.onnx"], "tapeout.toml exists", True),
    ],
)
def test_bad_init_input_is_one_line_and_nothing_is_written_over(tmp_path, args, says, mine):
    _onnx(tmp_path / "model.onnx", {"x": [1, 4]}, {"y": [1, 4]})
    if mine:
        (tmp_path / "tapeout.toml").write_text("# mine\n")
    result = run_cli("init", *args, cwd=tmp_path)
    assert result.code == 2 and says in one_line_error(result)
    assert (tmp_path / "tapeout.toml").read_text() == "# mine\n" if mine else not (tmp_path / "tapeout.toml").exists()
    assert not list(tmp_path.glob(".tapeout.toml.partial"))
