"""The `executorch` target for real: digits-cnn quantized on its torch.export program (PT2E) and lowered for XNNPACK
into a .pte, run by ExecuTorch's runtime in fresh processes, golden parity, the delegation record judged as
placement, the sensitivity loop over lowered candidates, and `check` replaying it; a model torch.export cannot
capture and an ONNX source each one line with exit 2 and no build dir."""

from __future__ import annotations

import shutil

import pytest

from conftest import SAMPLES, one_line_error, refused_build, run_cli
from tapeout import targets

PROBE = targets.target_class("executorch").probe()
pytestmark = pytest.mark.skipif(not PROBE.available, reason=f"executorch is not usable here: {PROBE.reason}")


@pytest.mark.slow
def test_digits_cnn_lowers_to_xnnpack_runs_and_checks(executorch_digits_build):
    result, out = executorch_digits_build
    assert result.code == 0, result.err
    report = result.json()
    assert report["target"]["name"] == "executorch"
    artifact = report["artifact"]
    assert artifact["main_file"] == "model.pte" and (out / "artifact" / "model.pte").read_bytes()[4:8] == b"ET12"
    assert artifact["meta"]["delegate"] == "XNNPACK" and "batch=1" in artifact["meta"]["shapes"]
    placement = report["placement"]
    # static at the project's dims, every op of the CNN is in XNNPACK's subgraph (the flatten's view too)
    assert placement["accelerator"] == "XNNPACK" and placement["off_share"] == 0 and placement["total_nodes"] >= 8
    verdicts = {b["budget"]: b["verdict"] for b in report["budgets"]}
    assert verdicts == {"placement_max_off_share": "pass", "parity_min_cosine": "pass", "accuracy_max_drop": "pass"}
    assert report["measurement"]["latency_ms"]["quantiles"]["p50"]["point"] > 0
    # ETDump: XNNPACK's own kernels inside the delegate, by its profiler's names (the op_profile hook, in-process)
    import numpy as np

    from tapeout.core.artifact import Artifact

    with np.load(out / "golden.npz") as golden:
        feeds = {"image": golden["input.image"][0]}
    target = targets.create("executorch", {})
    profile = target.op_profile(Artifact("executorch", out / "artifact", "model.pte"), feeds, iterations=5)
    kernels = {(o["op_type"], o["provider"]) for o in profile.by_op_type()}
    assert profile.runs == 5 and profile.run_total_us > 0
    assert ("Convolution (NHWC, F32) IGEMM", "XNNPACK") in kernels and all(p == "XNNPACK" for _, p in kernels)
    # `tapeout check` of this build runs in test_device_install, in an environment of the executorch extra only


def test_a_model_torch_export_cannot_capture_is_one_line(tmp_path):
    """Data-dependent control flow: the ONNX exporter's TorchScript fallback traces the branch every input takes
    (so the ONNX export verifies), torch.export refuses; the executorch target compiles from torch.export, so the
    build stops there with the exporter's reason."""
    project = tmp_path / "branchy"
    project.mkdir()
    (project / "model.py").write_text(
        "import torch\n\nclass Branchy(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 4)\n\n    def forward(self, x):\n"
        "        y = self.fc(x)\n        if (y * y).sum() >= 0:\n            return y * 2\n        return y - 1\n\n"
        "def build():\n    return Branchy().eval()\n"
    )
    (project / "tapeout.toml").write_text(
        '[model]\nname = "branchy"\nsource = "model.py:build"\n\n[[inputs]]\nname = "x"\nshape = [1, 4]\n'
    )
    line = refused_build(tmp_path, project, "--profile", "executorch-xnnpack-fp32")
    assert "torch.export could not capture the model" in line and "torch.cond" in line


@pytest.mark.slow
def test_an_onnx_source_is_refused_by_a_target_that_compiles_from_torch_export(tmp_path, digits_build):
    project = tmp_path / "onnx-source"
    shutil.copytree(SAMPLES / "digits-cnn", project, ignore=shutil.ignore_patterns("build", "__pycache__"))
    shutil.copy(digits_build / "export" / "model.onnx", project / "model.onnx")
    text = (project / "tapeout.toml").read_text()
    (project / "tapeout.toml").write_text(text.replace('source = "model.py:build"', 'source = "model.onnx"'))
    line = refused_build(tmp_path, project, "--profile", "executorch-xnnpack-fp32")
    assert "compiles from a torch.export program" in line and "ONNX file" in line


CORE_ML = targets.target_class("executorch-coreml")


@pytest.mark.slow
@pytest.mark.skipif(CORE_ML.probe().available, reason="this host runs Core ML: the device-side path, not tested here")
def test_a_core_ml_build_lowers_here_and_check_exits_4_naming_what_is_missing(tmp_path):
    """coremltools converts on Linux, so the .pte with its Core ML subgraph is built here; ExecuTorch's runtime
    here has no Core ML backend, so the build's timings are the ONNX stand-in's (never judged) and `check` exits 4."""
    out = tmp_path / "b"
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", "executorch-coreml-fp16", "--out", out, "--json")
    assert result.code == 0, result.err
    report = result.json()
    assert (
        report["artifact"]["meta"]["delegate"] == "Core ML"
        and report["artifact"]["meta"]["compute_precision"] == "float16"
    )
    assert report["placement"]["accelerator"] == "Core ML" and report["placement"]["off_share"] == 0
    assert "CoreMLBackend" in report["target"]["emulated"] and (out / "artifact" / "model.pte").is_file()
    check = run_cli("check", out)
    assert check.code == 4, check.err
    line = one_line_error(check)
    assert "no CoreMLBackend: Core ML runs on macOS and iOS only" in line and "pip install executorch" in line


@pytest.mark.slow
def test_digits_cnn_int8_is_quantized_on_the_program_and_runs_integer_kernels(executorch_digits_build):
    """PT2E with XNNPACK's quantizer at the CNN rule's groups: the .pte's own kernels are integer where the plan says
    int8 (QC8 convolutions, QS8 fully connected) and float where it keeps float (the first conv, the head)."""
    import numpy as np

    from tapeout.core.artifact import Artifact

    result, out = executorch_digits_build
    assert result.code == 0, result.err
    report = result.json()
    quantization = report["quantization"]
    plan = {g["group"]: (g["precision"], tuple(g["modules"])) for g in quantization["plan"]["groups"]}
    assert (
        quantization["plan"]["method"] == "pt2e-xnnpack" and quantization["evaluated_on"] == "executorch, on this host"
    )
    assert plan["conv1"] == ("int8", ("features.2", "features.3")) and plan["linear1"][0] == "int8"
    assert plan["first_conv"][0] == "fp32" and plan["head"][0] == "fp32"
    assert quantization["quantized_bytes"] < quantization["fp32_bytes"]  # int8 weights, the float copies dropped
    assert (out / "quantized" / "model.pt2").is_file() and not (out / "quantized" / ".compiled").exists()
    assert not (
        out / "quantized" / ".kept"
    ).exists()  # the kept candidate's .pte became the artifact, not lowered again
    assert report["accuracy"]["artifact"] == quantization["search"]["metric"]  # and its evaluation stands
    assert "loop's evaluation" in report["accuracy"]["where"]
    assert report["placement"]["off_share"] == 0
    verdicts = {b["budget"]: b["verdict"] for b in report["budgets"]}
    assert verdicts == {"placement_max_off_share": "pass", "parity_min_cosine": "pass", "accuracy_max_drop": "pass"}
    with np.load(out / "golden.npz") as golden:
        feeds = {"image": golden["input.image"][0]}
    profile = targets.create("executorch", {}).op_profile(
        Artifact("executorch", out / "artifact", "model.pte"), feeds, 3
    )
    kernels = {o["op_type"] for o in profile.by_op_type()}
    assert "Convolution (NHWC, QC8) IGEMM" in kernels and "Convolution (NHWC, F32) IGEMM" in kernels
    assert any("Fully Connected" in k and "QS8" in k for k in kernels), kernels


@pytest.mark.slow
def test_the_sensitivity_loop_ranks_and_moves_program_groups_through_executorch(tmp_path, executorch_digits_build):
    """The loop over .pt2 candidates, each lowered and run in ExecuTorch: with a budget only the float program meets
    (outputs within XNNPACK's float rounding of torch's), the largest INT8 group is ranked and moved to FP32 first;
    the loop stops at its evaluation cap (two, for the suite's time: each candidate is a lowering), and the program
    it keeps is the plan it reports."""
    import itertools

    import numpy as np
    import torch

    from tapeout.core import pt2
    from tapeout.core.feeds import npz_feeds
    from tapeout.core.profile_schema import QuantizationSettings
    from tapeout.core.schemas import InputSpec
    from tapeout.graph.analyze import analyze
    from tapeout.quantize import rules, sensitivity
    from tapeout.quantize.methods.pt2e import int8_modules

    _, out = executorch_digits_build
    target, spec = targets.create("executorch", {}), [InputSpec(name="image", shape=[1, 1, 8, 8], dtype="float32")]
    made = itertools.count()

    def session(path):
        artifact = target.compile_program(pt2.load(path), tmp_path / f"c{next(made)}", spec, {}, ["logits"])
        return target.session(artifact).run

    samples = npz_feeds(SAMPLES / "digits-cnn" / "data" / "calibration.npz", spec, {}, "test")[:8]
    program = pt2.load(out / "quantized" / "fp32.pt2").module()
    expected = [program(torch.from_numpy(f["image"])).detach().numpy() for f in samples]

    def error(predict) -> float:
        return max(float(np.abs(predict(f)["logits"] - e).max()) for f, e in zip(samples, expected, strict=True))

    plan = rules.first_plan(
        analyze(out / "export" / "model.onnx"),
        "executorch",
        targets.TARGETS["executorch"].capabilities,
        "int8",
        QuantizationSettings(),
    )
    candidates = sensitivity.Candidates(
        session=session,
        evaluate=error,
        judge=lambda e: (e, e < 1e-4),
        calibration=samples,
        rank_samples=samples[:2],
        latency_feeds=samples[0],
        log=lambda _msg: None,
    )
    result = sensitivity.search(
        plan,
        out / "quantized" / "fp32.pt2",
        tmp_path / "q" / "model.pt2",
        candidates,
        sensitivity.Limits(max_evaluations=2, max_ranked_groups=1),
    )
    assert [r["group"] for r in result.ranking] == ["conv1"] and result.unranked[0]["group"] == "linear1"
    assert result.steps[0].drop > 1e-3  # INT8 logits, not float rounding
    assert [s.action for s in result.steps[1:]] == ["conv1: int8 → fp32"] and not result.steps[-1].meets_accuracy
    assert result.stopped.startswith("evaluation cap reached (2)")
    assert [g.group for g in result.plan.quantized()] == ["linear1"]
    assert sorted(p.name for p in (tmp_path / "q").iterdir()) == ["model.pt2"]  # candidates and ranking files gone
    assert int8_modules(pt2.load(tmp_path / "q" / "model.pt2")) == {"classifier.1"}  # the kept program is that plan
