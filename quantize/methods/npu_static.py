"""Method `npu-static`: full-integer QDQ for the Hexagon HTP through ORT's QNN config — every op quantized,
except what the plan keeps at FP16 (float on the HTP is FP16, never the CPU); groups at A16W8 get 16-bit
activations by tensor overrides (the config inserts the 8↔16-bit converts)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tapeout.core.errors import BadInput
from tapeout.quantize.methods.base import Method
from tapeout.quantize.ort_tools import CALIBRATION, QTYPE, calibration_reader, check_quantized


class NpuStatic(Method):
    name = "npu-static"
    honours_float_nodes = True
    fixed_why = "the NPU runs full-integer static QDQ graphs"

    def needs_calibration(self, plan) -> bool:
        return True  # full-integer: every activation's range comes from the project's data

    def plan(self, draft, rule, analysis, settings, isa):
        act = rule.options["activation_type"]
        rung = "a16w8" if act == "uint16" else "int8"
        # Float on the HTP is FP16: groups kept float by the user run there in FP16, never on the CPU.
        groups = [
            replace(g, precision=rung) if g.precision == draft.ladder[0] else replace(g, precision="fp16")
            for g in draft.groups
        ]
        if rung == "int8":
            # Recurrent state is carried through every time step (research §2.5: int16 for recurrent paths on
            # NPUs), whatever family the convolutions make the model (a CNN+LSTM OCR model is a "cnn").
            groups = [
                replace(
                    g,
                    precision="a16w8",
                    reason="recurrent cell: 16-bit activations for its state and "
                    "I/O (quantized state accumulates error over the time steps)",
                )
                if g.role == "recurrent_cell" and g.precision == "int8"
                else g
                for g in groups
            ]
        # Attention masks carry huge negatives next to the real scores: quantized, the scores collapse
        # to one level (MiniLM: mean cosine 0.42 → 0.97 with masks and softmax kept float).
        masked = tuple(n for n, r in analysis.roles.items() if r in ("attn_mask", "attn_softmax"))
        notes = [f"full-integer QDQ for the HTP: {rule.why}"]
        if masked:
            notes.append(f"{len(masked)} attention mask / softmax node(s) kept float (FP16 on the HTP)")
        return replace(
            draft,
            groups=tuple(groups),
            per_channel=True if settings.per_channel is None else settings.per_channel,
            activation_type=act,
            weight_type="uint8",
            calibration_method=settings.calibration_method,
            notes=tuple(notes),
            float_nodes=masked,
        )

    def carry(self, plan, state):
        """In a plan of 8-bit activations, what a call hands the next gets a recurrent state's 16-bit activations:
        the carried tensors and every activation of the nodes that write them (their groups at A16W8)."""
        if plan.activation_type == "uint16" or not state:
            return plan
        writers = set(state.nodes)
        groups = tuple(
            replace(
                g,
                precision="a16w8",
                reason="writes state carried to the next call: 16-bit activations, as a recurrent state (8-bit, "
                "its error compounds call after call)",
            )
            if g.precision == "int8" and writers & set(g.nodes)
            else g
            for g in plan.groups
        )
        note = (
            f"{len(state.tensors)} activation(s) carried between calls or written on their way at 16 bits "
            f"(A16W8), whatever the family: {', '.join(state.tensors[:6])}{' …' if len(state.tensors) > 6 else ''}"
        )
        return replace(plan, groups=groups, wide_tensors=state.tensors, notes=(*plan.notes, note))

    def apply(self, plan, model_in: Path, model_out: Path, calibration) -> dict:
        """Full-integer QDQ through ORT's QNN config: every op quantized, except the groups the ladder moved
        to FP16 (they run as float, in FP16 on the HTP); groups at a16w8 get 16-bit activations by tensor
        overrides (the config inserts the 8↔16-bit converts)."""
        import onnx
        from onnxruntime.quantization import CalibrationMethod, QuantType, quantize
        from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

        if not calibration:
            raise BadInput(
                "NPU (full-integer) quantization needs calibration data, and the project has none",
                fix='add [calibration] data = "….npz" (or module:callable) with real inputs to the project',
            )
        act16 = plan.activation_type == "uint16"
        overrides: dict[str, list[dict]] = {}
        if not act16:
            for tensor in plan.wide_tensors:  # carried between calls (quantize/carried.py)
                overrides[tensor] = [{"quant_type": QuantType.QUInt16}]
            wanted = set(plan.nodes_at("a16w8"))
            model = onnx.load(str(model_in), load_external_data=False)
            weights = {i.name for i in model.graph.initializer}
            for node in model.graph.node:
                if node.name in wanted:  # every activation in and out: a recurrent cell's state too
                    for tensor in [*node.input, *node.output]:
                        if tensor and tensor not in weights:
                            overrides[tensor] = [{"quant_type": QuantType.QUInt16}]
        # float on the HTP is FP16 (fp32: ranking isolation); float_nodes are the rule's (attention masks, softmax)
        excluded = plan.nodes_at("fp16") + plan.nodes_at("fp32") + list(plan.float_nodes)
        config = get_qnn_qdq_config(
            str(model_in),
            calibration_reader(calibration),
            calibrate_method=getattr(CalibrationMethod, CALIBRATION[plan.calibration_method]),
            activation_type=QuantType.QUInt16 if act16 else QuantType.QUInt8,
            # uint8 weights, per-channel or not: with int8 per-channel weights the HTP rejects QDQ LayerNorm
            # ("Failed to add node"; MiniLM: 66 nodes fell back to the CPU, 1 with uint8)
            weight_type=getattr(QuantType, QTYPE[plan.weight_type]),
            per_channel=plan.per_channel,
            init_overrides=overrides or None,
            nodes_to_exclude=excluded or None,
        )
        quantize(str(model_in), str(model_out), config)
        return {
            "method": "npu-static",
            "activation_type": plan.activation_type,
            "per_channel": plan.per_channel,
            "a16_tensors": len(overrides),
            "fp16_nodes": len(excluded),
            "samples": len(calibration),
        }

    def postcondition(self, plan, model_in: Path, model_out: Path) -> None:
        check_quantized(plan.nodes_at("int8") + plan.nodes_at("a16w8"), model_out, "NPU full-integer QDQ")
        check_activation_bits(plan.nodes_at("a16w8") if plan.activation_type != "uint16" else [], model_out)


def check_activation_bits(nodes: list[str], model_out: Path) -> None:
    """Postcondition for groups the plan put at A16W8 in an 8-bit plan (recurrent state, groups the loop
    moved): their activation inputs arrive through a 16-bit DequantizeLinear."""
    import onnx
    from onnx import TensorProto

    if not nodes:
        return
    model = onnx.load(str(model_out), load_external_data=False)
    inits = {i.name: i.data_type for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    wide = (TensorProto.UINT16, TensorProto.INT16)
    planned = set(nodes)
    narrow = []
    for node in model.graph.node:
        if node.name not in planned:
            continue
        source = producer.get(node.input[0])
        if (
            source is not None
            and source.op_type == "DequantizeLinear"
            and len(source.input) > 2
            and inits.get(source.input[2]) not in wide
        ):
            narrow.append(node.name)
    if narrow:
        raise BadInput(
            f"NPU full-integer QDQ: {len(narrow)} node(s) planned at A16W8 got 8-bit activations: "
            f"{', '.join(narrow[:3])}",
            fix="keep them float with [quantization] keep_float, or report the model's pattern",
        )
