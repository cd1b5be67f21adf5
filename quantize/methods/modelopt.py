"""Method `modelopt`: explicit symmetric Q/DQ for TensorRT (INT8, FP8) placed by NVIDIA Model Optimizer where
TensorRT fuses them, calibrated on ONNX Runtime's CPU EP, the remainder cast to FP16 in the same pass
(quantize/modelopt_qdq.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tapeout.core.errors import BadInput
from tapeout.quantize.methods.base import Method
from tapeout.quantize.plan import FLOAT


class ModelOpt(Method):
    name = "modelopt"
    honours_float_nodes = True
    tool = "NVIDIA Model Optimizer"
    precisions = frozenset({"int8", "fp8"})
    fixed_why = "TensorRT takes explicit symmetric Q/DQ, placed by NVIDIA Model Optimizer"

    def plan(self, draft, rule, analysis, settings, isa):
        if settings.calibration_method not in ("minmax", "entropy"):
            raise BadInput(
                f'[quantization] calibration_method = "{settings.calibration_method}" is not one of ModelOpt\'s',
                fix='use "minmax" (ModelOpt\'s max) or "entropy"',
            )
        if not any(g.precision != FLOAT for g in draft.groups):
            raise BadInput(
                f"the {draft.family} rule found nothing to quantize in this model",
                fix='use precision = "fp16", or check `tapeout analyze` for the roles found',
            )
        precision = draft.ladder[0]
        high = draft.ladder[-1]  # what ModelOpt casts the rest to: the groups kept float run in it
        groups = [g if g.precision != FLOAT else replace(g, precision=high) for g in draft.groups]
        kept = tuple(n for n, r in analysis.roles.items() if r in rule.keep and analysis.group_of(n) is None)
        notes = [f"{precision.upper()} Q/DQ for TensorRT (symmetric, explicit): {rule.why}"]
        if precision == "int8":
            notes.append(
                f"calibration: ModelOpt's {'max' if settings.calibration_method == 'minmax' else 'entropy'} "
                "calibrator on ONNX Runtime's CPU EP"
            )
        return replace(
            draft,
            groups=tuple(groups),
            per_channel=True,
            activation_type="int8",
            weight_type="int8",
            activation_symmetric=True,
            calibration_method=settings.calibration_method,
            notes=tuple(notes),
            float_nodes=kept,
            float_ops=tuple(sorted(rule.keep_ops)),
            high_precision=high,
        )

    def apply(self, plan, model_in: Path, model_out: Path, calibration) -> dict:
        from tapeout.quantize import modelopt_qdq

        return modelopt_qdq.quantize(plan, model_in, model_out, calibration)

    def postcondition(self, plan, model_in: Path, model_out: Path) -> None:
        from tapeout.quantize import modelopt_qdq

        modelopt_qdq.check_written(plan, model_out)

    def reconcile(self, plan, model_out: Path):
        from tapeout.quantize import modelopt_qdq

        return modelopt_qdq.reconcile(plan, model_out)
