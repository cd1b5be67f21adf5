"""Errors in the user's own code and values are the user's: exit 2, one line naming the file, the
reference and the exception, the traceback only under --debug; never exit 0, never "a bug in tapeout"."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import one_line_error, run_cli

LINEAR = "import torch\n\ndef build():\n    return torch.nn.Linear(4, 2)\n"
PROJECT = '[model]\nsource = "model.py:build"\n\n[[inputs]]\nname = "x"\nshape = [2, 4]\n'


def _project(tmp_path, model: str = LINEAR, extra: str = "", project: str = PROJECT):
    (tmp_path / "model.py").write_text(model)
    (tmp_path / "tapeout.toml").write_text(project + extra)
    return tmp_path


@pytest.mark.parametrize(
    ("model", "says", "line"),
    [
        ("import sys\nsys.exit(0)\n", "called sys.exit(0)", 2),
        ("def build(:\n    pass\n", "raised SyntaxError", 1),
        ("def build():\n    raise RuntimeError('weights missing')\n", "raised RuntimeError: weights missing", 2),
        (
            "import torch\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x.view(3, 5)\n\n"
            "def build():\n    return M()\n",
            "the model's forward on the project's inputs (x [2, 4]) raised RuntimeError",
            5,
        ),
    ],
)
def test_errors_in_the_model_code_are_one_line_naming_the_file(tmp_path, model, says, line):
    project = _project(tmp_path, model)
    result = run_cli("build", project, "--profile", "cpu-fp32", "--out", tmp_path / "b")
    assert result.code == 2, result.err  # sys.exit(0) in a model file used to end the build with exit 0
    message = one_line_error(result)
    assert says in message and f"model.py:{line}" in message and "internal error" not in result.err
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    ("forward", "declared", "says"),
    [
        ("x, y", 1, "forward(x, y) takes 2 input(s) (x, y), and the project declares 1 ([[inputs]] x)"),
        ("x", 2, "forward(x) takes 1 input(s) (x), and the project declares 2 ([[inputs]] x, z)"),
    ],
)
def test_a_forward_that_takes_other_inputs_than_declared_is_the_project_files_to_fix(tmp_path, forward, declared, says):
    model = (
        "import torch\n\nclass M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        f"        self.l = torch.nn.Linear(4, 2)\n\n    def forward(self, {forward}):\n        return self.l(x)\n\n"
        "def build():\n    return M()\n"
    )
    extra = '\n[[inputs]]\nname = "z"\nshape = [2, 4]\n' if declared == 2 else ""
    project = _project(tmp_path, model, extra=extra)
    result = run_cli("build", project, "--profile", "cpu-fp32", "--out", tmp_path / "b")
    message = one_line_error(result)
    assert result.code == 2 and says in message and "one [[inputs]] entry per input of forward" in message
    assert "exporters/" not in message and "torch_onnx" not in message


def test_debug_shows_the_users_traceback_and_keeps_exit_2_before_or_after_the_command(tmp_path):
    project = _project(tmp_path, "def build():\n    raise RuntimeError('weights missing')\n")
    for args in (
        ["--debug", "build", project, "--profile", "cpu-fp32"],
        ["build", project, "--profile", "cpu-fp32", "--debug"],
    ):
        result = run_cli(*args)
        assert result.code == 2, result.err
        assert "Traceback" in result.err and "RuntimeError: weights missing" in result.err
        assert 'model.py", line 2' in result.err  # the user's frame is in it


def test_a_metric_that_raises_or_reads_a_missing_feed_is_the_users(tmp_path):
    (tmp_path / "metric.py").write_text("def score(predict):\n    return predict({'nope': 1})['y'].mean()\n")
    project = _project(tmp_path, extra='\n[evaluation]\nmetric = "metric.py:score"\ndirection = "higher"\n')
    result = run_cli("build", project, "--profile", "cpu-fp32", "--out", tmp_path / "b")
    assert result.code == 2
    message = one_line_error(result)
    assert "[evaluation] metric metric.py:score raised" in message and "metric.py:2" in message


def test_calibration_data_that_raises_while_yielding_is_the_users(tmp_path):
    (tmp_path / "data.py").write_text(
        "import numpy as np\n\ndef samples():\n    yield {'x': np.zeros((2, 4), np.float32)}\n"
        "    raise ValueError('corrupt shard')\n"
    )
    project = _project(tmp_path, extra='\n[calibration]\ndata = "data.py:samples"\n')
    result = run_cli("build", project, "--profile", "cpu-fp32", "--out", tmp_path / "b")
    assert result.code == 2 and "corrupt shard" in one_line_error(result) and "data.py:5" in result.err


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        ("[dims]\nbatch = 0\n", "[dims] batch = 0: a dimension is at least 1"),
        ("[dims]\nbatch = 100000000000\n", "check [dims] and the shape for a typo"),
        ("seed = -1\n[dims]\nbatch = 2\n", "field 'seed'"),
    ],
)
def test_values_that_would_build_nonsense_are_refused(tmp_path, toml, says):
    project = PROJECT.replace("shape = [2, 4]", 'shape = ["batch", 4]')
    project = _project(tmp_path, project=toml + project)
    result = run_cli("build", project, "--profile", "cpu-fp32", "--out", tmp_path / "b")
    assert result.code == 2 and says in one_line_error(result)
    assert not (tmp_path / "b").exists()


def test_a_missing_module_is_still_named_as_missing(tmp_path):
    project = _project(tmp_path, project=PROJECT.replace("model.py:build", "no_such_package.models:build"))
    result = run_cli("lint", project)
    assert result.code == 2 and "cannot import module 'no_such_package.models'" in one_line_error(result)


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--iterations", "1000000000000000", "field '--iterations': Input should be less than or equal to 1000000"),
        ("--repeats", "1000000", "field '--repeats': Input should be less than or equal to 20"),
    ],
)
def test_check_overrides_are_bounded_like_the_profile_before_anything_is_measured(digits_build, option, value, says):
    # 10**15 iterations once reached the inference process as a 7 PiB sample array
    result = run_cli("check", digits_build, option, value)
    assert result.code == 2 and says in one_line_error(result)
    assert "measure" not in result.err


@pytest.mark.parametrize(
    ("arrays", "says"),
    [
        ({"x": np.float32(1.0)}, "array 'x' is a 0-d scalar, not a stack of samples"),
        ({"x": np.array(["a", "b"])}, "array 'x' holds <U1, not numbers"),
        ({}, "holds no arrays"),
        ({"x": np.zeros((4, 2, 4), np.float32), "y": np.zeros((3, 1), np.float32)}, "different sample counts [3, 4]"),
    ],
)
def test_calibration_arrays_that_are_not_stacked_samples_are_named(tmp_path, arrays, says):
    np.savez(tmp_path / "cal.npz", **arrays)
    project = _project(tmp_path, extra='\n[calibration]\ndata = "cal.npz"\n')
    result = run_cli("build", project, "--profile", "cpu-fp32", "--out", tmp_path / "b")
    assert result.code == 2 and says in one_line_error(result)
    assert not (tmp_path / "b").exists()


def test_calibration_samples_along_the_batch_axis_are_taken_a_batch_at_a_time():
    from tapeout.core.feeds import npz_feeds
    from tapeout.core.schemas import InputSpec

    spec = [InputSpec(name="image", shape=["batch", 3, 8, 8])]
    rng = np.random.default_rng(0)
    natural, stacked = rng.random((6, 3, 8, 8), np.float32), rng.random((6, 1, 3, 8, 8), np.float32)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        for arrays, dims, count, first in (
            (natural, 1, 6, natural[:1]),
            (stacked, 1, 6, stacked[0]),
            (natural, 2, 3, natural[:2]),
        ):
            np.savez(Path(tmp) / "cal.npz", image=arrays)
            feeds = npz_feeds(Path(tmp) / "cal.npz", spec, {"batch": dims})
            assert len(feeds) == count and np.array_equal(feeds[0]["image"], first)


def test_calibration_of_another_shape_names_the_shapes_that_work_before_the_export(tmp_path):
    np.savez(tmp_path / "cal.npz", x=np.zeros((5, 3), np.float32))
    project = _project(tmp_path, extra='\n[calibration]\ndata = "cal.npz"\n')
    result = run_cli("build", project, "--profile", "cpu-fp32", "--out", tmp_path / "b")
    message = one_line_error(result)
    assert result.code == 2 and "array 'x' has shape [5, 3]" in message
    assert "(N, 2, 4) or (N, 4)" in message
    assert "export" not in result.err.lower()  # refused before the first step


def test_a_metric_that_does_not_exist_is_refused_before_the_export(tmp_path):
    (tmp_path / "metric.py").write_text("def score(predict):\n    return 1.0\n")
    project = _project(tmp_path, extra='\n[evaluation]\nmetric = "metric.py:scroe"\ndirection = "higher"\n')
    result = run_cli("build", project, "--profile", "cpu-fp32", "--out", tmp_path / "b")
    assert result.code == 2 and "'scroe' is not a callable in metric.py" in one_line_error(result)
    assert "export" not in result.err.lower()


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ("threads = 4611686018427387904", "threads"),  # once reached ORT as a C-int overflow: exit 70
        ("inter_op_threads = 100000", "inter_op_threads"),
    ],
)
def test_runtime_options_out_of_the_runtimes_range_are_refused_up_front(tmp_path, options, says):
    project = _project(tmp_path)
    profile = tmp_path / "p.toml"
    profile.write_text(f'extends = "cpu-fp32"\n[options]\n{options}\n')
    result = run_cli("build", project, "--profile", profile, "--out", tmp_path / "b")
    assert result.code == 2 and says in one_line_error(result)


@pytest.mark.parametrize(
    ("returns", "says"), [("None", "returned None"), ("(None, None)", "returned a tuple with no tensor in it")]
)
def test_a_forward_that_returns_nothing_is_the_users_code_not_an_export_problem(tmp_path, returns, says):
    model = (
        "import torch\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n        x = x * 2\n"
        f"        return {returns}\n\ndef build():\n    return M()\n"
    )
    project = _project(tmp_path, model)
    result = run_cli("build", project, "--profile", "cpu-fp32", "--out", tmp_path / "b")
    line = one_line_error(result)
    assert result.code == 2 and f"the model's forward() {says}: there is no output to export" in line
    assert "opset" not in line and "return the output tensor" in line and not (tmp_path / "b").exists()


def test_a_check_that_cannot_write_its_report_says_so_before_measuring(digits_build, tmp_path):
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(digits_build, copy)
    (copy / "check.json").unlink(missing_ok=True)
    (copy / "check.json").mkdir()  # where the check's report goes
    result = run_cli("check", copy, "--iterations", "30", "--repeats", "1")
    line = one_line_error(result)
    assert result.code == 2 and "check.json" in line and "is a directory" in line and "Traceback" not in result.err
    assert "measure" not in result.err  # refused before the work, not after it


def test_a_hugging_face_config_that_asks_for_more_layers_than_its_weights_hold_is_refused(tmp_path):
    """transformers would initialize the missing layer at random, warn, and tapeout would ship it."""
    import json

    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=500,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf")
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**saved, "num_hidden_layers": 3}))
    (tmp_path / "tapeout.toml").write_text(
        '[model]\nsource = "hf"\n\n[[inputs]]\nname = "input_ids"\nshape = [1, 8]\ndtype = "int64"\nrange = [0, 499]\n'
    )
    result = run_cli("export", tmp_path, "--out", tmp_path / "m.onnx")
    message = one_line_error(result)
    assert result.code == 2 and "its weights do not match its config.json for LlamaForCausalLM" in message
    assert "lacks model.layers.2." in message and not (tmp_path / "m.onnx").exists()
