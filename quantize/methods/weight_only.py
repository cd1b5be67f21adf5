"""Method `weight-only`: INT4 (and, a rung up, INT8) weights as ORT's MatMulNBits, block-wise, symmetric; the
activations stay float. What the CPU rules use for decoders at int4: decode is memory-bound. RTN, or GPTQ on
the project's calibration data.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

from tapeout.core.errors import BadInput
from tapeout.core.onnx_graphs import save_model
from tapeout.quantize.methods.base import Method
from tapeout.quantize.methods.cpu import cpu_plan
from tapeout.quantize.ort_tools import calibration_reader


class WeightOnly(Method):
    name = "weight-only"
    precisions = frozenset({"int4"})
    algorithms = ("rtn", "gptq")  # ORT's MatMulNBits quantizer has no AWQ

    def plan(self, draft, rule, analysis, settings, isa):
        from tapeout.quantize.plan import FLOAT
        from tapeout.quantize.rules import weight_only_compute

        level, why = weight_only_compute(isa)
        groups = draft.groups
        if level is None:  # without int8 compute an 8-bit MatMulNBits is far slower than FP32: a rule's 8-bit start
            groups = tuple(
                replace(g, precision=FLOAT, reason=f"{g.reason}; kept FP32 instead: {why}")
                if g.precision == "int8-weight"
                else g
                for g in groups
            )
        notes = (*draft.notes, f"MatMulNBits compute from the CPU instruction set ({isa.origin}): {why}")
        return cpu_plan(
            replace(
                draft, activation_type="uint8", reduce_range=False, groups=groups, accuracy_level=level, notes=notes
            ),
            rule,
            analysis,
            settings,
        )

    def needs_calibration(self, plan) -> bool:
        return plan.int4_algorithm != "rtn"

    def apply(self, plan, model_in: Path, model_out: Path, calibration) -> dict:
        """MatMulNBits for the groups at int4 (and int8-weight, the ladder's next rung); nothing else."""
        import onnx

        model, done, records = to_matmul_nbits(onnx.load(str(model_in)), plan, ("int4", "int8-weight"), calibration)
        save_model(model, model_out)
        return {
            "method": "weight-only",
            "nodes": done,
            "block_size": plan.block_size,
            "algorithm": plan.int4_algorithm,
            "gemm_as_matmul": sum(r["rewrites"] for r in records if r["name"] == "gemm-as-matmul"),
            "passes": records,
        }


_BITS = {"int4": 4, "int8-weight": 8}


def to_matmul_nbits(model, plan, rungs: tuple[str, ...], calibration=None):
    """`model` (an ONNX proto) with the plan's nodes at `rungs` ("int4", "int8-weight") as ORT's MatMulNBits,
    block-wise and symmetric; nothing else. Returns (model, nodes per rung, the passes' records).

    ORT's quantizer ORs `nodes_to_include` with its op types, so it would quantize every MatMul (the lm_head the
    rules keep float, the groups the loop moved up): the plan goes in as `nodes_to_exclude` (everything not at
    this rung), and the result is checked against the plan."""
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits

    from tapeout.quantize.passes.base import run_on_proto
    from tapeout.quantize.passes.gemm_as_matmul import GemmAsMatMul
    from tapeout.quantize.passes.untie_transposed_weight import UntieTransposedWeight

    # MatMulNBits replaces MatMul with a constant weight only: a Linear exported as Gemm becomes MatMul (+ Add)
    # first, and a tied LM head (MatMul on the embedding table's Transpose) gets its weight as its own constant
    planned = {n for rung in rungs for n in plan.nodes_at(rung)}
    model, records = run_on_proto(model, [GemmAsMatMul(planned), UntieTransposedWeight(planned)])
    done = {}
    for precision in rungs:
        nodes, bits = set(plan.nodes_at(precision)), _BITS[precision]
        if not nodes:
            continue
        if plan.int4_algorithm == "gptq" and bits == 4:
            if not calibration:
                raise BadInput(
                    'int4_algorithm = "gptq" needs calibration data, and the project has none',
                    fix='add [calibration] data to the project, or use int4_algorithm = "rtn"',
                )
            algo = nbits.GPTQWeightOnlyQuantConfig(
                calibration_data_reader=calibration_reader(calibration),
                block_size=plan.block_size,
                percdamp=0.01,
                actorder=False,
            )
        else:
            algo = nbits.DefaultWeightOnlyQuantConfig(
                block_size=plan.block_size, is_symmetric=True, accuracy_level=plan.accuracy_level, bits=bits
            )
        others = sorted(n.name for n in model.graph.node if n.name not in nodes)
        quantizer = planned_nbits()(
            model,
            bits=bits,
            block_size=plan.block_size,
            is_symmetric=True,
            accuracy_level=plan.accuracy_level,
            nodes_to_exclude=others,
            algo_config=algo,
        )
        quantizer.process()
        model = quantizer.model.model if hasattr(quantizer.model, "model") else quantizer.model
        quantized = {
            n.name.rsplit("_Q", 1)[0]
            for n in model.graph.node
            if n.op_type == "MatMulNBits" and n.name.endswith(f"_Q{bits}")
        }
        if quantized != nodes:
            raise BadInput(
                f"onnxruntime's weight-only quantizer did not follow the plan at {precision}: quantized "
                f"{sorted(quantized - nodes)[:3]} (kept float by the plan), missed {sorted(nodes - quantized)[:3]}",
                fix='use int4_algorithm = "rtn", or report this with the onnxruntime version',
            )
        done[precision] = len(nodes)
    return model, done, records


@functools.cache
def planned_nbits():
    """ORT's MatMulNBitsQuantizer, defined on first use (onnxruntime loads lazily), that skips excluded
    nodes on every algorithm path."""
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits

    class PlannedNBits(nbits.MatMulNBitsQuantizer):
        """The GPTQ path (Intel Neural Compressor code vendored in ORT) ignores `nodes_to_exclude`; its
        per-node config takes "fp32" as "skip" (as ORT's own RTN path writes it)."""

        def _generate_q4_node_config(self):
            config = super()._generate_q4_node_config()
            return {name: "fp32" if name in self.nodes_to_exclude else cfg for name, cfg in config.items()}

    return PlannedNBits
