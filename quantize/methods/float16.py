"""Method `float16`: the whole graph in FP16 through ORT's converter (I/O kept FP32), except the arithmetic that
overflows there and the groups the plan keeps FP32. What the GPU float rules use (ORT's CUDA EP, TensorRT at
fp16)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tapeout.core.errors import BadInput
from tapeout.quantize.methods.base import Method
from tapeout.quantize.plan import FLOAT


class Float16(Method):
    name = "float16"
    honours_float_nodes = True
    precisions = frozenset({"fp16"})
    fixed_why = "{precision} is a float conversion, not a quantization method"

    def plan(self, draft, rule, analysis, settings, isa):
        kept = tuple(n for n, r in analysis.roles.items() if r in rule.keep and analysis.group_of(n) is None)
        notes = [f"FP16 for the GPU: {rule.why}"]
        if rule.keep_ops:
            notes.append(f"op types kept FP32 wherever they occur: {', '.join(sorted(rule.keep_ops))}")
        return replace(draft, notes=tuple(notes), float_nodes=kept, float_ops=tuple(sorted(rule.keep_ops)))

    def apply(self, plan, model_in: Path, model_out: Path, calibration) -> dict:
        """ORT's FP16 converter with I/O kept FP32 (callers feed FP32): blocked are the rule's op types, the
        ungrouped nodes it keeps, and the weighted nodes of groups at fp32. Then the weights are checked."""
        import onnx
        from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

        from tapeout.quantize.passes.base import run_on_proto
        from tapeout.quantize.passes.merge_casts import MergeRepeatedCasts

        model = onnx.load(str(model_in))
        kept = [*plan.nodes_at(FLOAT), *plan.float_nodes]
        converted = convert_float_to_float16(
            model,
            keep_io_types=True,
            node_block_list=kept or None,
            op_block_list=sorted(set(DEFAULT_OP_BLOCK_LIST) | set(plan.float_ops)),
        )
        converted, records = run_on_proto(converted, [MergeRepeatedCasts()])
        onnx.save(converted, str(model_out))
        return {
            "method": "float16",
            "fp16_nodes": len(plan.nodes_at("fp16")),
            "fp32_nodes": len(kept),
            "fp32_op_types": list(plan.float_ops),
            "casts": sum(n.op_type == "Cast" for n in converted.graph.node),
            "io": "float32 (the converter keeps graph inputs and outputs FP32)",
            "passes": records,
        }

    def postcondition(self, plan, model_in: Path, model_out: Path) -> None:
        import onnx

        check_weight_precision(plan, onnx.load(str(model_out)))


def check_weight_precision(plan, model) -> None:
    """Postcondition: every planned node whose weight is an initializer of its own holds it in the
    plan's precision (the converter skips what it cannot handle without saying so). A weight is a
    floating-point initializer in any input slot: a Gather's table is its first input, and its integer
    indices (a learned position embedding's constant positions) are no weight at all."""
    from onnx import TensorProto

    floating = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)
    initializers = {i.name: i.data_type for i in model.graph.initializer if i.data_type in floating}
    uses: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    by_name = {n.name: n for n in model.graph.node}
    want = {"fp16": TensorProto.FLOAT16, FLOAT: TensorProto.FLOAT}
    planned = [(name, group.group, group.precision) for group in plan.groups for name in group.nodes]
    planned += [(name, "kept float by the rule", FLOAT) for name in plan.float_nodes]
    wrong = []
    for name, where, precision in planned:
        node = by_name.get(name)
        weight = next((i for i in (node.input if node is not None else []) if i in initializers), None)
        if weight is None or uses.get(weight, 0) != 1:  # computed or shared weights: not checkable here
            continue
        if initializers[weight] != want[precision]:
            wrong.append(f"{name} ({where}: planned {precision})")
    if wrong:
        raise BadInput(
            f"the FP16 conversion did not follow the plan for {len(wrong)} node(s): {', '.join(wrong[:3])}",
            fix='keep those groups float with [quantization] keep_float, or use precision = "fp32"',
        )
