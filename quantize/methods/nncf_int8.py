"""Method `nncf`: OpenVINO INT8 by NNCF's post-training quantization, calibrated on the project's data; the
plan's float groups and the rule's float nodes go in as NNCF's ignored scope (quantize/openvino_nncf.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tapeout.core.errors import BadInput
from tapeout.quantize.methods.base import Method
from tapeout.quantize.plan import FLOAT


class NncfInt8(Method):
    name = "nncf"
    honours_float_nodes = True
    tool = "NNCF"
    model_suffix = ".xml"
    fixed_why = "OpenVINO models are quantized by NNCF (static, calibrated)"

    def needs_calibration(self, plan) -> bool:
        return True  # static: activation ranges come from the project's data

    def plan(self, draft, rule, analysis, settings, isa):
        model_type, preset = rule.options.get("model_type"), rule.options["preset"]
        if not any(g.precision != FLOAT for g in draft.groups):
            raise BadInput(
                f"the {draft.family} rule found nothing to quantize in this model",
                fix='use precision = "fp32", or check `tapeout analyze` for the roles found',
            )
        notes = (f"NNCF {model_type or 'default'} model type, {preset} preset: {rule.why}",)
        return replace(
            draft, calibration_method=settings.calibration_method, notes=notes, model_type=model_type, preset=preset
        )

    def apply(self, plan, model_in: Path, model_out: Path, calibration) -> dict:
        from tapeout.quantize import openvino_nncf

        return openvino_nncf.quantize(plan, model_in, model_out, calibration)

    def postcondition(self, plan, model_in: Path, model_out: Path) -> None:
        from tapeout.quantize import openvino_nncf

        openvino_nncf.check_written(plan, model_in, model_out)
