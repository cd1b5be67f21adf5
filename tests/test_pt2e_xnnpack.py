"""The PT2E methods (quantize/methods/pt2e_xnnpack.py) on our side and for real: the exporter's name scopes read
as data, the plan's groups mapped to torch modules (an unmapped group stays float), and torch programs quantized
by XNNPACK's quantizer at exactly the planned modules, static and dynamic, checked afterwards and lowered."""

from __future__ import annotations

import graphs
import numpy as np
import onnx
import pytest
from onnx import helper

from tapeout import targets
from tapeout.core.errors import BadInput
from tapeout.core.profile_schema import QuantizationSettings
from tapeout.graph.analyze import analyze, module_scopes
from tapeout.quantize import rules
from tapeout.quantize.plan import FLOAT, GroupPlan, Plan

PROBE = targets.target_class("executorch").probe()
needs_executorch = pytest.mark.skipif(not PROBE.available, reason=f"executorch is not usable here: {PROBE.reason}")
KEY = "pkg.torch.onnx.name_scopes"


def _scoped(node, value: str):
    node.metadata_props.add(key=KEY, value=value)
    return node


def test_module_scopes_are_read_from_the_exporters_metadata_as_data():
    nodes = [
        _scoped(helper.make_node("Relu", ["a"], ["b"], name="ok"), "['', 'features', 'features.2', 'relu_1']"),
        _scoped(helper.make_node("Relu", ["a"], ["b"], name="code"), "__import__('os').system('true')"),
        _scoped(helper.make_node("Relu", ["a"], ["b"], name="long"), "['" + "x" * 5000 + "', 'op']"),
        _scoped(helper.make_node("Relu", ["a"], ["b"], name="numbers"), "[1, 2]"),
        _scoped(helper.make_node("Relu", ["a"], ["b"], name="short"), "['op']"),
        helper.make_node("Relu", ["a"], ["b"], name="bare"),
    ]
    assert module_scopes(nodes) == {"ok": "features.2"}


def _cnn_analysis(tmp_path, scoped: dict[str, str]):
    """graphs.cnn() analysed, with the exporter's scopes on the nodes named in `scoped` (node -> module)."""
    model = graphs.cnn()
    for node in model.graph.node:
        if node.name in scoped:
            _scoped(node, str(["", scoped[node.name], node.name]))
    onnx.save(model, tmp_path / "cnn.onnx")
    return analyze(tmp_path / "cnn.onnx")


def _executorch_plan(analysis):
    return rules.first_plan(
        analysis, "executorch", targets.TARGETS["executorch"].capabilities, "int8", QuantizationSettings()
    )


def test_groups_map_to_the_modules_of_all_their_nodes_and_an_unmapped_group_stays_float(tmp_path):
    # conv_11 and its ReLU come from two modules (as nn.Sequential's conv and ReLU do); the depthwise conv has no scope
    analysis = _cnn_analysis(
        tmp_path, {"conv_3": "features.0", "conv_11": "features.4", "relu_12": "features.5", "fc_17": "head"}
    )
    plan = _executorch_plan(analysis)
    assert plan.method == "pt2e-xnnpack" and plan.ladder == ("int8", "fp32") and plan.activation_type == "int8"
    groups = {g.group: g for g in plan.groups}
    assert groups["conv1"].precision == "int8" and groups["conv1"].modules == ("features.4", "features.5")
    assert groups["depthwise_conv1"].precision == FLOAT and "no torch module maps" in groups["depthwise_conv1"].reason
    assert groups["first_conv"].precision == FLOAT and groups["head"].precision == FLOAT  # the CNN rule's keeps
    assert plan.to_json()["groups"][2]["modules"] == ("features.4", "features.5")


def test_a_model_with_no_scopes_has_nothing_pt2e_can_name(tmp_path):
    with pytest.raises(BadInput, match="nothing to quantize in this model's torch program"):
        _executorch_plan(_cnn_analysis(tmp_path, {}))


class _Tiny:
    """A module with integer index arithmetic (`arange + 0`, as Hugging Face's position ids) and float scalars."""

    @staticmethod
    def build():
        import torch
        from torch import nn

        class Tiny(nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(0)
                self.fc1, self.act, self.fc2 = nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)

            def forward(self, x):
                positions = torch.arange(x.shape[1]) + 0
                return self.fc2(self.act(self.fc1(x[:, positions]))) * 0.5 + 1.0

        return Tiny().eval()


@pytest.fixture(scope="module")
def tiny_program(tmp_path_factory):
    import torch

    from tapeout.exporters.torch_onnx import save_program

    path = tmp_path_factory.mktemp("pt2e") / "model.pt2"
    module = _Tiny.build()
    save_program(torch.export.export(module, (torch.rand(2, 5, 8),)), path)
    return module, path


def _plan(method: str, modules: tuple[str, ...]) -> Plan:
    return Plan(
        method,
        "mlp",
        "executorch",
        ("int8", "fp32"),
        (
            GroupPlan("linear1", "linear", ("n1",), "int8", "test", modules),
            GroupPlan("head", "head", ("n2",), FLOAT, "test", ("fc2",)),
        ),
    )


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).random((2, 5, 8), dtype=np.float32)}


@needs_executorch
@pytest.mark.slow
@pytest.mark.parametrize("method", ["pt2e-xnnpack", "pt2e-xnnpack-dynamic"])
def test_exactly_the_planned_modules_are_quantized_and_the_program_lowers(tmp_path, tiny_program, method):
    import torch

    from tapeout.core import pt2
    from tapeout.quantize import methods
    from tapeout.quantize.methods.pt2e import int8_modules

    module, source = tiny_program
    quantizer, plan, out = methods.get(method), _plan(method, ("fc1", "act")), tmp_path / "q.pt2"
    assert quantizer.needs_calibration(plan) is (method == "pt2e-xnnpack")
    info = quantizer.apply(plan, source, out, [_feeds(i) for i in range(8)])
    quantizer.postcondition(plan, source, out)
    program = pt2.load(out)
    assert int8_modules(program) == {"fc1"} and info["groups"] == 1
    assert not any(name.endswith("fc1.weight") for name, _ in program.named_parameters())  # the float copy dropped
    feeds = _feeds(99)
    expected = module(torch.from_numpy(feeds["x"])).detach().numpy()
    if method == "pt2e-xnnpack-dynamic":  # lowered and run (the static path is lowered by the digits-cnn build)
        artifact = targets.create("executorch", {}).compile_program(
            program, tmp_path / "artifact", [_input_spec()], {}, ["y"]
        )
        got = targets.create("executorch", {}).session(artifact).run(feeds)["y"]
    else:
        got = program.module()(torch.from_numpy(feeds["x"])).detach().numpy()
    assert np.abs(got - expected).max() < 0.05  # int8 on fc1: close to float, not equal
    assert not np.array_equal(got, expected)


def _input_spec():
    from tapeout.core.schemas import InputSpec

    return InputSpec(name="x", shape=[2, 5, 8], dtype="float32")


@needs_executorch
def test_a_planned_group_the_quantizer_has_no_pattern_for_fails_the_postcondition(tmp_path, tiny_program):
    from tapeout.quantize import methods

    _, source = tiny_program
    method, plan = methods.get("pt2e-xnnpack"), _plan("pt2e-xnnpack", ("act",))  # a ReLU alone: nothing to take
    method.apply(plan, source, tmp_path / "q.pt2", [_feeds(0)])
    with pytest.raises(BadInput, match="left the planned group linear1 float"):
        method.postcondition(plan, source, tmp_path / "q.pt2")
