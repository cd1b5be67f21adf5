"""Method `dynamic`: ORT's dynamic INT8 — weights quantized per channel, activations per inference (no
calibration). What the CPU rules use for transformers, decoders and LSTMs (DynamicQuantizeLSTM). Groups a plan
puts at `int4` (a decoder's LM head) become 4-bit block-wise MatMulNBits first, as the weight-only method writes
them."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from tapeout.quantize.methods.base import Method
from tapeout.quantize.methods.cpu import cpu_plan
from tapeout.quantize.ort_tools import QTYPE, check_nbits, check_quantized, op_types, planned_ops


class Dynamic(Method):
    name = "dynamic"
    reaches_bodies = True  # EnableSubgraph: planned nodes inside If/Loop/Scan bodies are quantized too
    rungs = frozenset({"int8", "int4"})
    stands_in_for = frozenset({"static"})

    def plan(self, draft, rule, analysis, settings, isa):
        from tapeout.quantize.rules import weight_only_compute

        # ORT's dynamic activations are uint8; per-channel as fast as per-tensor and far more accurate on
        # AVX512-VNNI (MiniLM 2.08× at cosine 0.9935 vs 2.08× at 0.9633). Without VNNI the u8×s8 pair sums of
        # AVX2's vpmaddubsw saturate int16 with full 8-bit weights (a 3-layer MLP: cosine 0.956 against FP32 on an
        # AMD Zen 3, 0.99993 with 7-bit weights), so 7-bit weights there, as static QDQ does.
        reduce_range = isa.arch == "x86_64" and not isa.vnni
        notes = [
            f"CPU instruction set from {isa.origin} ({isa.arch}{', VNNI' if isa.vnni else ''}): dynamic INT8, "
            "uint8 activations, "
            + (
                "7-bit per-channel weights (reduce_range: without VNNI, u8×s8 pair sums saturate with 8 bits)"
                if reduce_range
                else "8-bit per-channel weights"
            )
        ]
        groups, level = draft.groups, None
        if any(g.precision == "int4" for g in groups):
            level, why = weight_only_compute(isa)
            if level is None:  # unpacked to float on every call, a 4-bit MatMulNBits is slower than dynamic INT8
                groups = tuple(
                    replace(g, precision="int8", reason=f"{g.reason}; INT8 instead: {why}")
                    if g.precision == "int4"
                    else g
                    for g in groups
                )
            notes.append(f"4-bit groups as MatMulNBits, compute from the CPU instruction set ({isa.origin}): {why}")
        # the ladder keeps its rung under INT8 only while a group is there
        ladder = tuple(r for r in draft.ladder if r != "int4" or any(g.precision == "int4" for g in groups))
        return cpu_plan(
            replace(
                draft,
                activation_type="uint8",
                reduce_range=reduce_range,
                groups=groups,
                ladder=ladder,
                accuracy_level=level,
                notes=tuple(notes),
            ),
            rule,
            analysis,
            settings,
        )

    def apply(self, plan, model_in: Path, model_out: Path, calibration) -> dict:
        import onnx

        nodes, staged, nbits = plan.nodes_at("int8"), None, {}
        if plan.nodes_at("int4"):  # MatMulNBits first; the dynamic quantizer then leaves those nodes alone
            from tapeout.quantize.methods.weight_only import to_matmul_nbits

            model, done, _ = to_matmul_nbits(onnx.load(str(model_in)), plan, ("int4",))
            nbits = {"nodes": done["int4"], "block_size": plan.block_size, "accuracy_level": plan.accuracy_level}
            staged = model_out.with_name(f"{model_out.stem}.nbits.onnx")
            onnx.save(model, str(staged))
            model_in = staged
        try:
            return {**self._dynamic(plan, nodes, model_in, model_out), **({"matmul_nbits": nbits} if nbits else {})}
        finally:
            if staged is not None:
                staged.unlink(missing_ok=True)

    def _dynamic(self, plan, nodes: list[str], model_in: Path, model_out: Path) -> dict:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic

        from tapeout.quantize.passes.base import run_on_proto
        from tapeout.quantize.passes.gemm_as_matmul import GemmAsMatMul
        from tapeout.quantize.passes.localize_body_weights import LocalizeBodyWeights
        from tapeout.quantize.passes.untie_transposed_weight import UntieTransposedWeight, tied_nodes

        if not nodes:
            shutil.copyfile(model_in, model_out)
            return {"method": "dynamic", "nodes": 0}
        # ORT's dynamic quantizer has no Gemm: a planned Gemm becomes MatMul (+ Add) first, under its own name; and
        # a weight only a control-flow body reads moves into it (ORT's ConvInteger finds no outer-scope weight). A
        # model that needs neither is passed through untouched (no second copy of 90 MB of MiniLM)
        source, records = model_in, []
        types, in_bodies = planned_ops(model_in, nodes)
        # a tied LM head (MatMul on the embedding table's Transpose) gets its weight as a constant of its own: the
        # dynamic quantizer takes constant weights only (MatMulConstBOnly) and would leave it FP32 without a word
        passes = [
            *([GemmAsMatMul(set(nodes))] if "Gemm" in types else []),
            *([LocalizeBodyWeights(set(nodes))] if in_bodies else []),
            *([UntieTransposedWeight(set(nodes))] if tied_nodes(model_in, set(nodes)) else []),
        ]
        if passes:
            model, records = run_on_proto(onnx.load(str(model_in)), passes)
            source = model_out.with_name(f"{model_out.stem}.passes.onnx")
            onnx.save(model, str(source))
        try:
            # a pass can change the planned op types (Gemm → MatMul); without one the model is read once
            quantize_dynamic(
                source,
                model_out,
                op_types_to_quantize=op_types(source, nodes) if passes else types,
                nodes_to_quantize=nodes,
                per_channel=plan.per_channel,
                reduce_range=plan.reduce_range,
                weight_type=getattr(QuantType, QTYPE[plan.weight_type]),
                # EnableSubgraph: planned nodes inside If/Loop/Scan bodies are quantized too
                extra_options={"MatMulConstBOnly": True, "EnableSubgraph": True},
            )
        finally:
            if source != model_in:
                source.unlink(missing_ok=True)
        return {
            "method": "dynamic",
            "nodes": len(nodes),
            "per_channel": plan.per_channel,
            "reduce_range": plan.reduce_range,
            "gemm_as_matmul": sum(r["rewrites"] for r in records),
            "passes": records,
        }

    def postcondition(self, plan, model_in: Path, model_out: Path) -> None:
        check_quantized(plan.nodes_at("int8"), model_out, "dynamic INT8")
        check_nbits(plan.nodes_at("int4"), 4, model_out)
