"""The `program-bf16` method (quantize/methods/bf16_program.py) on our side and for real: the x86-inductor rule set's
BF16 plan (convs and Linear layers BF16, embeddings and norms FP32), refused on a CPU without BF16 arithmetic, and a
program whose planned Linear alone computes in BF16 (cast in and out: FP32 I/O), compiled by AOTInductor and run."""

from __future__ import annotations

import numpy as np
import pytest
from test_pt2e_x86_inductor import SCOPES, _aoti_plan
from test_pt2e_xnnpack import _cnn_analysis, _feeds, _input_spec
from test_pt2e_xnnpack import tiny_program as tiny_program  # a fixture, shared

from tapeout import targets
from tapeout.core.errors import BadInput
from tapeout.quantize.plan import FLOAT, GroupPlan, Plan

PROBE = targets.target_class("aoti").probe()
BF16 = frozenset({"avx2", "avx512_bf16"})


def _bf16_plan(analysis, flags=BF16):
    from tapeout.core.profile_schema import QuantizationSettings
    from tapeout.quantize import rules

    return rules.first_plan(
        analysis,
        "aoti",
        targets.TARGETS["aoti"].capabilities,
        "bf16",
        QuantizationSettings(),
        isa=rules.InstructionSet("x86_64", flags, "test"),
    )


def test_the_bf16_plan_takes_every_conv_and_linear_and_needs_bf16_arithmetic(tmp_path):
    analysis = _cnn_analysis(tmp_path, SCOPES)
    plan = _bf16_plan(analysis)
    assert plan.method == "program-bf16" and plan.ladder == ("bf16", "fp32")
    groups = {g.group: g for g in plan.groups}
    assert groups["conv1"].precision == "bf16" and groups["conv1"].modules == ("features.4", "features.5")
    assert groups["first_conv"].precision == "bf16" and groups["head"].precision == "bf16"  # no keeps for a float
    assert "avx512_bf16" in plan.notes[0]
    with pytest.raises(BadInput) as refused:
        _bf16_plan(analysis, flags=frozenset({"avx2", "avx512_vnni"}))
    assert "needs a CPU with BF16 arithmetic" in str(refused.value) and "\n" not in str(refused.value)
    assert _aoti_plan(analysis).method == "pt2e-x86-inductor"  # int8 is still the quantizer's


def _plan(modules: tuple[str, ...]) -> Plan:
    return Plan(
        "program-bf16",
        "mlp",
        "aoti",
        ("bf16", "fp32"),
        (
            GroupPlan("linear1", "linear", ("n1",), "bf16", "test", modules),
            GroupPlan("head", "head", ("n2",), FLOAT, "test", ("fc2",)),
        ),
    )


@pytest.mark.skipif(not PROBE.available, reason=f"aoti is not usable here: {PROBE.reason}")
@pytest.mark.slow
def test_exactly_the_planned_linear_computes_in_bf16_and_the_package_runs_it(tmp_path, tiny_program):
    import torch

    from tapeout.core import pt2
    from tapeout.quantize import methods
    from tapeout.quantize.methods.bf16_program import bf16_modules

    module, source = tiny_program
    method, out = methods.get("program-bf16"), tmp_path / "bf16.pt2"
    info = method.apply(_plan(("fc1", "act")), source, out, None)
    method.postcondition(_plan(("fc1", "act")), source, out)
    program = pt2.load(out)
    assert bf16_modules(program) == {"fc1"} and info["ops"] == 1
    outputs = next(n for n in program.graph.nodes if n.op == "output").args[0]
    assert all(o.meta["val"].dtype == torch.float32 for o in outputs)  # FP32 out, as the project declares
    with pytest.raises(BadInput, match="planned BF16 group linear1 has no convolution or Linear"):
        method.postcondition(_plan(("act",)), source, source)  # the FP32 program: nothing computes in BF16
    feeds = _feeds(7)
    expected = module(torch.from_numpy(feeds["x"])).detach().numpy()
    target = targets.create("aoti", {"threads": 1})
    got = target.session(target.compile_program(program, tmp_path / "artifact", [_input_spec()], {}, ["y"])).run(feeds)[
        "y"
    ]
    assert np.abs(got - expected).max() < 0.05 and not np.array_equal(got, expected)  # BF16: close, not equal
