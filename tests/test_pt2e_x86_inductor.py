"""The PT2E methods for AOTInductor (quantize/methods/pt2e_x86_inductor.py) on our side and for real: the x86 rule
set's plans (uint8 activations, per-channel weights, 7-bit activations before VNNI, refused off x86 and for
per-tensor weights), and a program quantized at exactly the planned module, compiled by Inductor into oneDNN's
integer Linear kernel; the same program compiled as Inductor does without freezing (dequantize + float GEMM) is
refused by the target, not shipped as INT8."""

from __future__ import annotations

import numpy as np
import pytest
from test_pt2e_xnnpack import _cnn_analysis, _feeds, _input_spec, _plan
from test_pt2e_xnnpack import tiny_program as tiny_program  # a fixture, shared

from tapeout import targets
from tapeout.core.errors import BadInput
from tapeout.core.profile_schema import QuantizationSettings
from tapeout.quantize import rule_tables, rules

PROBE = targets.target_class("aoti").probe()
needs_aoti = pytest.mark.skipif(not PROBE.available, reason=f"aoti is not usable here: {PROBE.reason}")
SCOPES = {"conv_3": "features.0", "conv_11": "features.4", "relu_12": "features.5", "fc_17": "head"}


def _aoti_plan(analysis, flags=frozenset({"avx2", "avx512_vnni"}), arch="x86_64", **settings):
    return rules.first_plan(
        analysis,
        "aoti",
        targets.TARGETS["aoti"].capabilities,
        "int8",
        QuantizationSettings(**settings),
        isa=rules.InstructionSet(arch, flags, "test"),
    )


def test_the_cnn_rule_plans_uint8_activations_per_channel_weights_and_7_bits_before_vnni(tmp_path):
    analysis = _cnn_analysis(tmp_path, SCOPES)
    plan = _aoti_plan(analysis)
    assert plan.method == "pt2e-x86-inductor" and plan.ladder == ("int8", "fp32")
    assert plan.activation_type == "uint8" and plan.per_channel and not plan.reduce_range
    groups = {g.group: g for g in plan.groups}
    assert groups["conv1"].precision == "int8" and groups["conv1"].modules == ("features.4", "features.5")
    assert groups["first_conv"].precision == "fp32" and groups["head"].precision == "fp32"
    assert any("oneDNN" in note for note in plan.notes)
    assert _aoti_plan(analysis, flags=frozenset({"avx2"})).reduce_range  # u8 × s8 pair sums saturate pre-VNNI
    assert rule_tables.RULE_SETS["x86-inductor"][("transformer-encoder", "int8")].method == "pt2e-x86-inductor-dynamic"


@pytest.mark.parametrize(
    ("settings", "said"),
    [({"arch": "arm64"}, "this build's CPU is arm64"), ({"per_channel": False}, "per output channel only")],
)
def test_what_the_recipe_cannot_do_is_one_line(tmp_path, settings, said):
    with pytest.raises(BadInput) as refused:
        _aoti_plan(_cnn_analysis(tmp_path, SCOPES), **settings)
    assert said in str(refused.value) and "\n" not in str(refused.value)


@needs_aoti
@pytest.mark.slow
def test_the_planned_module_compiles_to_an_integer_kernel_and_a_float_fallback_is_refused(
    tmp_path, tiny_program, monkeypatch
):
    import torch

    from tapeout.core import pt2
    from tapeout.quantize import methods
    from tapeout.quantize.methods.pt2e import int8_modules

    module, source = tiny_program
    method, plan, out = (
        methods.get("pt2e-x86-inductor-dynamic"),
        _plan("pt2e-x86-inductor-dynamic", ("fc1", "act")),
        tmp_path / "q.pt2",
    )
    assert not method.needs_calibration(plan)
    method.apply(plan, source, out, None)
    method.postcondition(plan, source, out)
    program = pt2.load(out)
    assert int8_modules(program) == {"fc1"}
    target = targets.create("aoti", {"threads": 1})
    artifact = target.compile_program(program, tmp_path / "artifact", [_input_spec()], {}, ["y"])
    assert artifact.meta["integer_kernels"] == {"qconv": 0, "qlinear": 1}
    feeds = _feeds(99)
    got = target.session(artifact).run(feeds)["y"]
    expected = module(torch.from_numpy(feeds["x"])).detach().numpy()
    assert np.abs(got - expected).max() < 0.05 and not np.array_equal(got, expected)
    # Inductor without freezing: the same program compiles to dequantize + float GEMM (pytorch/ao#4566)
    compile_and_package = torch._inductor.aoti_compile_and_package
    monkeypatch.setattr(
        torch._inductor,
        "aoti_compile_and_package",
        lambda program, package_path, inductor_configs: compile_and_package(program, package_path=package_path),
    )
    with pytest.raises(BadInput, match="without one integer kernel"):
        target.compile_program(program, tmp_path / "float", [_input_spec()], {}, ["y"])
