"""Method `nncf-weights`: OpenVINO INT4 (and, a rung up, INT8) weight compression by NNCF, block-wise,
symmetric; data-free (RTN) or data-aware (AWQ). Embeddings and the LM head stay float, as the plan says."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tapeout.core.errors import BadInput
from tapeout.quantize.methods.base import Method
from tapeout.quantize.plan import FLOAT


class NncfWeights(Method):
    name = "nncf-weights"
    tool = "NNCF"
    model_suffix = ".xml"
    precisions = frozenset({"int4"})
    # NNCF's GPTQ fails on transposed (torch Linear) weights ("Transpose is not supported", nncf 3.4)
    algorithms = ("rtn", "awq")
    fixed_why = "OpenVINO INT4 is NNCF's weight compression"

    def plan(self, draft, rule, analysis, settings, isa):
        if not any(g.precision != FLOAT for g in draft.groups):
            raise BadInput(f"the {draft.family} rule found nothing to compress in this model",
                           fix="use precision = \"fp32\", or check `tapeout analyze` for the roles found")
        how = "data-aware (AWQ on the calibration data)" if settings.int4_algorithm == "awq" else "data-free (RTN)"
        return replace(draft, block_size=settings.block_size, int4_algorithm=settings.int4_algorithm,
                       notes=(f"{rule.why}; group size {settings.block_size}, {how}",))

    def needs_calibration(self, plan) -> bool:
        return plan.int4_algorithm != "rtn"

    def apply(self, plan, model_in: Path, model_out: Path, calibration) -> dict:
        from tapeout.quantize import openvino_nncf

        return openvino_nncf.compress_weights(plan, model_in, model_out, calibration)

    def postcondition(self, plan, model_in: Path, model_out: Path) -> None:
        from tapeout.quantize import openvino_nncf

        openvino_nncf.check_written(plan, model_in, model_out)
