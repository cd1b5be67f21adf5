"""Method `static`: ORT's static QDQ INT8 — per-channel weights, activations calibrated per tensor on the
project's data, in the formats the CPU's INT8 dot products take. What the CPU rules use for CNNs and UNets."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from tapeout.core.errors import BadInput
from tapeout.quantize.methods.base import Method
from tapeout.quantize.methods.cpu import cpu_plan
from tapeout.quantize.ort_tools import CALIBRATION, QTYPE, calibration_reader, check_quantized, op_types

RECURRENCE_FLOAT = "static QDQ has no LSTM/GRU kernel in ORT: the recurrence stays float"


class Static(Method):
    name = "static"
    stands_in_for = frozenset({"dynamic"})
    rungs = frozenset({"int8"})

    def plan(self, draft, rule, analysis, settings, isa):
        from tapeout.quantize.plan import FLOAT
        from tapeout.quantize.rules import static_formats

        act, reduce_range, why = static_formats(isa)
        # a rule whose own method is dynamic quantizes LSTM cells (DynamicQuantizeLSTM); ORT's QDQ has no LSTM or
        # GRU kernel, so under static the recurrence stays float, saying so
        groups = tuple(
            replace(g, precision=FLOAT, reason=RECURRENCE_FLOAT)
            if g.role == "recurrent_cell" and g.precision != FLOAT
            else g
            for g in draft.groups
        )
        return cpu_plan(
            replace(
                draft,
                groups=groups,
                activation_type=act,
                reduce_range=reduce_range,
                notes=(f"CPU instruction set from {isa.origin}: {why}",),
            ),
            rule,
            analysis,
            settings,
        )

    def needs_calibration(self, plan) -> bool:
        return True

    def apply(self, plan, model_in: Path, model_out: Path, calibration) -> dict:
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

        nodes = plan.nodes_at("int8")
        if not nodes:
            shutil.copyfile(model_in, model_out)
            return {"method": "static", "nodes": 0}
        if not calibration:
            raise BadInput(
                "static INT8 needs calibration data, and the project has none",
                fix='add [calibration] data = "….npz" (or module:callable) with real inputs to the project',
            )
        quantize_static(
            model_in,
            model_out,
            calibration_reader(calibration),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=op_types(model_in, nodes),
            nodes_to_quantize=nodes,
            per_channel=plan.per_channel,
            reduce_range=plan.reduce_range,
            activation_type=getattr(QuantType, QTYPE[plan.activation_type]),
            weight_type=getattr(QuantType, QTYPE[plan.weight_type]),
            calibrate_method=getattr(CalibrationMethod, CALIBRATION[plan.calibration_method]),
            extra_options={
                "ActivationSymmetric": plan.activation_symmetric,
                "WeightSymmetric": True,
                "CalibTensorRangeSymmetric": plan.activation_symmetric,
            },
            calibration_providers=["CPUExecutionProvider"],
            use_external_data_format=False,
        )
        return {
            "method": "static",
            "nodes": len(nodes),
            "samples": len(calibration),
            "calibration": plan.calibration_method,
            "activation_type": plan.activation_type,
            "reduce_range": plan.reduce_range,
            "per_channel": plan.per_channel,
        }

    def postcondition(self, plan, model_in: Path, model_out: Path) -> None:
        nodes = plan.nodes_at("int8")
        if nodes:
            check_quantized(nodes, model_out, "static INT8")
