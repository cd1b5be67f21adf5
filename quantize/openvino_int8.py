"""A Plan as an OpenVINO INT8 model: NNCF post-training quantization of the OpenVINO model.

NNCF quantizes every op it knows how to unless told not to, so the plan goes in as an ignored
scope: every weighted node of a group the plan keeps float (and the rule's float nodes), matched by
the ONNX node name OpenVINO keeps as the op's friendly name (a Conv/MatMul with a bias becomes
`NAME/WithoutBiases` + an Add). NNCF's model type and preset come from the rule (the transformer
model type keeps LayerNorm, Softmax and the residual stream out of INT8 and applies SmoothQuant).
Afterwards the weights are checked against the plan: a planned node must read integer weights, a
float one float weights.
"""

from __future__ import annotations

import re
from pathlib import Path

from tapeout.errors import BadInput
from tapeout.quantize.plan import FLOAT, Plan

# what lies between a quantized weight and the op that uses it, in a model NNCF has quantized:
# Constant(i8/u8) → Convert → (Subtract zero point) → Multiply scale → (Reshape/Transpose) → op
_WEIGHT_PATH = {"Convert", "Subtract", "Multiply", "Reshape", "Transpose", "Unsqueeze", "Squeeze"}
_WEIGHTED_TYPES = {"Convolution", "GroupConvolution", "MatMul", "ConvolutionBackpropData"}


def name_pattern(onnx_names: list[str]) -> list[str]:
    """Regexes matching the OpenVINO ops an ONNX node became (its own name, or NAME/suffix). Anchored at
    both ends: NNCF matches patterns from the start only, so `node_conv2d` would also ignore `node_conv2d_1`
    (the postcondition caught exactly that)."""
    return [f"^{re.escape(name)}(/.*)?$" for name in onnx_names]


def quantize(plan: Plan, model_in: Path, model_out: Path, calibration: list[dict] | None) -> dict:
    import nncf
    import openvino as ov

    if not calibration:
        raise BadInput("OpenVINO INT8 (NNCF) needs calibration data, and the project has none",
                       fix="add [calibration] data = \"….npz\" (or module:callable) with real inputs to the project")
    model = ov.Core().read_model(str(model_in))
    kept = [*plan.nodes_at(FLOAT), *plan.float_nodes]
    ignored = nncf.IgnoredScope(patterns=name_pattern(kept), validate=False) if kept else None
    model_type = nncf.ModelType.TRANSFORMER if plan.model_type == "transformer" else None
    preset = nncf.QuantizationPreset.MIXED if plan.preset == "mixed" else nncf.QuantizationPreset.PERFORMANCE
    quantized = nncf.quantize(model, nncf.Dataset(calibration), preset=preset, model_type=model_type,
                              ignored_scope=ignored, subset_size=len(calibration), fast_bias_correction=True)
    check_weights(plan, quantized)
    model_out.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(quantized, str(model_out.with_suffix(".xml")), compress_to_fp16=False)
    fake_quantize = sum(op.get_type_name() == "FakeQuantize" for op in quantized.get_ops())
    return {"method": "nncf", "nodes": len(plan.nodes_at("int8")), "kept_float": len(kept),
            "model_type": plan.model_type or "default", "preset": plan.preset, "samples": len(calibration),
            "activation_quantizers": fake_quantize, "nncf": nncf.__version__}


def _weight_source(op):
    """The op that produces `op`'s weight (input 1), walking back through dequantization and layout ops."""
    node = op.input_value(1).get_node()
    for _ in range(8):
        if node.get_type_name() not in _WEIGHT_PATH:
            return node
        node = node.input_value(0).get_node()
    return node


def check_weights(plan: Plan, model) -> None:
    """Postcondition: every planned weighted node reads an integer (or fake-quantized) weight; every node
    the plan keeps float reads a float one. NNCF leaves what it cannot handle float without saying so."""
    planned = {name: precision for g in plan.groups for name in g.nodes for precision in [g.precision]}
    patterns = [(re.compile(p), name) for name in planned for p in name_pattern([name])]
    wrong = []
    for op in model.get_ordered_ops():
        if op.get_type_name() not in _WEIGHTED_TYPES or op.get_input_size() < 2:
            continue
        onnx_name = next((name for regex, name in patterns if regex.fullmatch(op.get_friendly_name())), None)
        if onnx_name is None:
            continue
        source = _weight_source(op)
        integer = source.get_type_name() == "FakeQuantize" or (
            source.get_type_name() == "Constant" and source.get_element_type().is_integral())
        floating = source.get_type_name() == "Constant" and source.get_element_type().is_real()
        precision = planned[onnx_name]
        if (precision == "int8" and not integer) or (precision == FLOAT and not floating):
            wrong.append(f"{onnx_name} (planned {precision})")
    if wrong:
        raise BadInput(f"NNCF did not follow the plan for {len(wrong)} node(s): {', '.join(wrong[:3])}"
                       f"{' …' if len(wrong) > 3 else ''}",
                       fix="keep those groups float with [quantization] keep_float, or use precision = \"fp32\"")
