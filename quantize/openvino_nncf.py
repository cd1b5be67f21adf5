"""A Plan as an OpenVINO model quantized by NNCF: INT8 post-training quantization (`quantize`) or
INT4/INT8 weight compression (`compress_weights`).

NNCF quantizes every op it knows how to unless told not to, so the plan goes in as an ignored
scope: every weighted node of a group the plan keeps float (and the rule's float nodes). OpenVINO
keeps an ONNX node's name as its op's friendly name (a Conv/MatMul with a bias becomes
`NAME/WithoutBiases` + an Add), except where the node produces a model output: that op is named
after the output (tiny-lm's LM head MatMul is `logits`). So ops are found by name, and then by the
ONNX node's output tensor names, which OpenVINO keeps on the op's (or its bias Add's) output port.
NNCF's model type and preset come from the rule (the transformer model type keeps LayerNorm, Softmax
and the residual stream out of INT8 and applies SmoothQuant).
Weight compression (decoders: decode is memory-bound) takes the same ignored scope: one NNCF call per
rung (int4 groups, then the int8-weight groups the sensitivity loop moved up), each told to ignore
everything else, so NNCF's own choices (it would compress the embedding and the LM head to INT8, and
mix INT4 and INT8 by its own sensitivity when ratio < 1) never override the plan.
Afterwards (the methods' postcondition, `check_written`) the weights are checked against the plan: a planned
node must read integer weights, a float one float weights.
"""

from __future__ import annotations

import re
from pathlib import Path

from tapeout.core.errors import BadInput
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


def ov_ops_of(model_in: Path, ov_model, onnx_names: set[str]) -> dict[str, str]:
    """OpenVINO friendly name -> ONNX node name, for the weighted ops the nodes `onnx_names` became."""
    import onnx

    from tapeout.core.onnx_graphs import graphs_in

    graph = onnx.load(str(model_in), load_external_data=False).graph
    produced = {
        out: node.name
        for g in graphs_in(graph)
        for node in g.node
        if node.name in onnx_names
        for out in node.output
        if out
    }
    patterns = [(re.compile(p), name) for name in onnx_names for p in name_pattern([name])]
    found = {}
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() not in _WEIGHTED_TYPES:
            continue
        name = op.get_friendly_name()
        onnx_name = next((n for regex, n in patterns if regex.fullmatch(name)), None)
        if onnx_name is None:  # renamed after a model output: the tensor names on its port (or its bias Add's)
            ports = [op.output(0)] + [
                t.get_node().output(0)
                for t in op.output(0).get_target_inputs()
                if t.get_node().get_type_name() == "Add"
            ]
            onnx_name = next((produced[t] for port in ports for t in port.get_names() if t in produced), None)
        if onnx_name is not None:
            found[name] = onnx_name
    return found


def _ignored_scope(nncf, model_in: Path, ov_model, kept: list[str]):
    """NNCF's ignored scope for the ONNX nodes `kept`: by name pattern, and by the exact names of ops
    OpenVINO renamed."""
    if not kept:
        return None
    renamed = sorted(
        ov
        for ov, onnx_name in ov_ops_of(model_in, ov_model, set(kept)).items()
        if not any(re.fullmatch(p, ov) for p in name_pattern([onnx_name]))
    )
    return nncf.IgnoredScope(names=renamed, patterns=name_pattern(kept), validate=False)


def quantize(plan: Plan, model_in: Path, model_out: Path, calibration: list[dict] | None) -> dict:
    """INT8: weights and activations (FakeQuantize), calibrated on the project's data."""
    import nncf
    import openvino as ov

    if not calibration:
        raise BadInput(
            "OpenVINO INT8 (NNCF) needs calibration data, and the project has none",
            fix='add [calibration] data = "….npz" (or module:callable) with real inputs to the project',
        )
    model = ov.Core().read_model(str(model_in))
    kept = [*plan.nodes_at(FLOAT), *plan.float_nodes]
    ignored = _ignored_scope(nncf, model_in, model, kept)
    model_type = nncf.ModelType.TRANSFORMER if plan.model_type == "transformer" else None
    preset = nncf.QuantizationPreset.MIXED if plan.preset == "mixed" else nncf.QuantizationPreset.PERFORMANCE
    quantized = nncf.quantize(
        model,
        nncf.Dataset(calibration),
        preset=preset,
        model_type=model_type,
        ignored_scope=ignored,
        subset_size=len(calibration),
        fast_bias_correction=True,
    )
    _save(quantized, model_out)
    fake_quantize = sum(op.get_type_name() == "FakeQuantize" for op in quantized.get_ops())
    return {
        "method": "nncf",
        "nodes": len(plan.nodes_at("int8")),
        "kept_float": len(kept),
        "model_type": plan.model_type or "default",
        "preset": plan.preset,
        "samples": len(calibration),
        "activation_quantizers": fake_quantize,
        "nncf": nncf.__version__,
    }


# the rungs weight compression writes, with NNCF's mode for each: symmetric INT4 (measured on tiny-lm:
# perplexity +0.5 % against +0.8 % asymmetric, and smaller), asymmetric per-channel INT8 (NNCF's default)
_WEIGHT_MODES = {"int4": "INT4_SYM", "int8-weight": "INT8_ASYM"}
MIN_GROUP_SIZE = 8  # smaller groups cost more in scales than 8 bits would: below it a layer moves up the ladder


def compress_weights(plan: Plan, model_in: Path, model_out: Path, calibration: list[dict] | None) -> dict:
    """INT4 (block-wise) and INT8 weight-only: activations stay float; data-free (RTN) or data-aware (AWQ)."""
    import nncf
    import openvino as ov

    data_aware = plan.int4_algorithm == "awq"
    if data_aware and not calibration:
        raise BadInput(
            'int4_algorithm = "awq" needs calibration data, and the project has none',
            fix='add [calibration] data to the project, or use int4_algorithm = "rtn"',
        )
    model = ov.Core().read_model(str(model_in))
    every = [n for g in plan.groups for n in g.nodes] + list(plan.float_nodes)
    done = {}
    for rung, mode in _WEIGHT_MODES.items():
        nodes = plan.nodes_at(rung)
        if not nodes:
            continue
        chosen = set(nodes)
        others = [n for n in every if n not in chosen]
        # all_layers: the plan, not NNCF's first/last-layer rule, says what is INT4 (an INT8 mode takes no such option);
        # a layer whose input channels the group size does not divide gets the largest group that does (NNCF's ADJUST)
        options = (
            {
                "group_size": plan.block_size,
                "ratio": 1.0,
                "all_layers": True,
                "advanced_parameters": nncf.AdvancedCompressionParameters(
                    group_size_fallback_mode=nncf.GroupSizeFallbackMode.ADJUST, min_adjusted_group_size=MIN_GROUP_SIZE
                ),
            }
            if rung == "int4"
            else {}
        )
        if rung == "int4" and data_aware:
            options.update(dataset=nncf.Dataset(calibration), subset_size=len(calibration), awq=True)
        model = nncf.compress_weights(
            model,
            mode=getattr(nncf.CompressWeightsMode, mode),
            ignored_scope=_ignored_scope(nncf, model_in, model, others),
            **options,
        )
        done[rung] = len(nodes)
    _save(model, model_out)
    return {
        "method": "nncf-weights",
        "nodes": done,
        "kept_float": len(plan.nodes_at(FLOAT)) + len(plan.float_nodes),
        "block_size": plan.block_size,
        "algorithm": plan.int4_algorithm,
        "group_sizes": other_group_sizes(plan, model_in, model),
        "samples": len(calibration) if data_aware else 0,
        "nncf": nncf.__version__,
    }


def other_group_sizes(plan: Plan, model_in: Path, model) -> dict[str, int]:
    """INT4 nodes whose weights NNCF grouped by another size than the plan's (their input channels are not a multiple
    of it): ONNX node name → the group size it used."""
    planned = set(plan.nodes_at("int4"))
    ops = ov_ops_of(model_in, model, planned)
    found = {}
    for op in model.get_ordered_ops():
        name = ops.get(op.get_friendly_name())
        if name is None or op.get_input_size() < 2:
            continue
        source = _weight_source(op)
        shape = list(source.get_output_partial_shape(0).to_shape()) if source.get_type_name() == "Constant" else []
        if len(shape) != 3:
            continue
        # grouped weights split the input channels in two: [groups, group, out] or, transposed, [out, groups, group]
        outputs = op.get_output_partial_shape(0)[-1]
        group = shape[1] if outputs.is_static and shape[2] == outputs.get_length() else shape[2]
        if group != plan.block_size:
            found[name] = int(group)
    return found


def _save(model, model_out: Path) -> None:
    import openvino as ov

    model_out.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(model_out.with_suffix(".xml")), compress_to_fp16=False)


def _weight_source(op):
    """The op that produces `op`'s weight (input 1), walking back through dequantization and layout ops."""
    node = op.input_value(1).get_node()
    for _ in range(8):
        if node.get_type_name() not in _WEIGHT_PATH:
            return node
        node = node.input_value(0).get_node()
    return node


def check_written(plan: Plan, model_in: Path, model_out: Path) -> None:
    """The postcondition on the OpenVINO IR a method wrote."""
    import openvino as ov

    check_weights(plan, ov.Core().read_model(str(model_out.with_suffix(".xml"))), model_in)


def check_weights(plan: Plan, model, model_in: Path) -> None:
    """Postcondition: every planned weighted node reads an integer (or fake-quantized) weight of its rung's
    width; every node the plan keeps float reads a float one; and every planned node is found. NNCF leaves
    what it cannot handle float without saying so."""
    planned = {name: g.precision for g in plan.groups for name in g.nodes}
    ops = ov_ops_of(model_in, model, set(planned))
    wrong = []
    for op in model.get_ordered_ops():
        onnx_name = ops.get(op.get_friendly_name())
        if onnx_name is None or op.get_input_size() < 2:
            continue
        source = _weight_source(op)
        kind = source.get_type_name()
        element = source.get_element_type() if kind == "Constant" else None
        precision = planned[onnx_name]
        if precision == FLOAT:
            ok = element is not None and element.is_real()
        elif precision == "int4":
            ok = element is not None and element.is_integral() and element.bitwidth == 4
        else:  # int8 (a fake-quantized or integer weight) or int8-weight
            ok = kind == "FakeQuantize" or (element is not None and element.is_integral() and element.bitwidth == 8)
        if not ok:
            wrong.append(f"{onnx_name} (planned {precision})")
    missing = sorted({n for n, p in planned.items() if p != FLOAT} - set(ops.values()))
    wrong += [f"{n} (planned {planned[n]}; not found in the OpenVINO model)" for n in missing]
    short = [n for n in wrong if n.endswith("(planned int4)")]
    if short and len(short) == len(wrong):
        from tapeout.quantize.apply import QuantizerFailed

        node = short[0].removesuffix(" (planned int4)")
        raise QuantizerFailed(
            f"NNCF left {node} at another width than INT4 (a power-of-two group size of at least "
            f"{MIN_GROUP_SIZE} must divide its input channels)",
            node=node,
            fix='keep its group at 8 bits with [quantization] overrides, or use precision = "fp32"',
        )
    if wrong:
        raise BadInput(
            f"NNCF did not follow the plan for {len(wrong)} node(s): {', '.join(wrong[:3])}"
            f"{' …' if len(wrong) > 3 else ''}",
            fix='keep those groups float with [quantization] keep_float, or use precision = "fp32"',
        )
