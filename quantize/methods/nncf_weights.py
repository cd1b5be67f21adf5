"""Method `nncf-weights`: OpenVINO INT4 (and, a rung up, INT8) weight compression by NNCF, block-wise,
symmetric; data-free (RTN) or data-aware (AWQ). Embeddings stay float and a decoder's LM head goes to 8 bits, as the
plan says."""

from __future__ import annotations

import shutil
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
            raise BadInput(
                f"the {draft.family} rule found nothing to compress in this model",
                fix='use precision = "fp32", or check `tapeout analyze` for the roles found',
            )
        how = "data-aware (AWQ on the calibration data)" if settings.int4_algorithm == "awq" else "data-free (RTN)"
        return replace(
            draft,
            block_size=settings.block_size,
            int4_algorithm=settings.int4_algorithm,
            notes=(f"{rule.why}; group size {settings.block_size}, {how}",),
        )

    def needs_calibration(self, plan) -> bool:
        return plan.int4_algorithm != "rtn"

    def apply(self, plan, model_in: Path, model_out: Path, calibration) -> dict:
        import onnx

        from tapeout.quantize import openvino_nncf
        from tapeout.quantize.passes.base import run_on_proto
        from tapeout.quantize.passes.untie_transposed_weight import UntieTransposedWeight

        # A tied LM head (MatMul on the embedding table's Transpose, samples/llama-40m) shares its constant with the
        # embedding Gather, and NNCF leaves a shared weight uncompressed: the head gets its own transposed copy first.
        planned = {n for g in plan.groups if g.precision != FLOAT for n in g.nodes}
        model, records = run_on_proto(onnx.load(str(model_in)), [UntieTransposedWeight(planned)])
        source = model_in
        if any(r["outcome"] == "applied" for r in records):
            source = model_out.parent / "untied" / "model.onnx"
            source.parent.mkdir(parents=True, exist_ok=True)
            onnx.save(model, str(source), save_as_external_data=True, location="model.onnx.data")
        try:
            info = openvino_nncf.compress_weights(plan, source, model_out, calibration)
        finally:
            if source != model_in:
                shutil.rmtree(source.parent, ignore_errors=True)
        return {**info, "passes": records}

    def postcondition(self, plan, model_in: Path, model_out: Path) -> None:
        from tapeout.quantize import openvino_nncf

        openvino_nncf.check_written(plan, model_in, model_out)
