"""Pass `merge-repeated-casts`: Cast nodes written twice (same name, input, output and type) kept once.

onnxruntime 1.31's FP16 converter writes one Cast back to FP32 per blocked consumer of an FP16 tensor, all
with the same name and output, which no runtime loads ("two nodes with same node name"; tiny-lm's RMSNorms,
seen on an H100 with onnxruntime-gpu 1.31.1). 1.32 writes one shared Cast; so do we. Such a model is invalid
ONNX, which onnx-ir refuses to load: this pass repairs the protobuf.
"""

from __future__ import annotations

from collections import Counter

from tapeout.quantize.passes.base import GraphPass


class MergeRepeatedCasts(GraphPass):
    name = "merge-repeated-casts"
    stage = "method"
    works_on = "proto"
    nothing_matched = "no Cast written twice (onnxruntime 1.32 and newer share one)"

    def match(self, model) -> list[int]:
        """Indices of the Casts that repeat an earlier one exactly."""
        seen, repeated = set(), []
        for i, node in enumerate(model.graph.node):
            if node.op_type != "Cast":
                continue
            key = node.SerializeToString()
            if key in seen:
                repeated.append(i)
            seen.add(key)
        return repeated

    def rewrite(self, model, matches: list[int]) -> int:
        drop = set(matches)
        nodes = [n for i, n in enumerate(model.graph.node) if i not in drop]
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        names, infos = set(), []  # the converter repeats their value_info too
        for info in model.graph.value_info:
            if info.name not in names:
                names.add(info.name)
                infos.append(info)
        del model.graph.value_info[:]
        model.graph.value_info.extend(infos)
        return len(drop)

    def postcondition(self, model) -> str | None:
        counts = Counter(n.name for n in model.graph.node if n.op_type == "Cast")
        twice = sorted(name for name, count in counts.items() if count > 1 and name)
        return f"Cast names still repeated: {', '.join(twice[:3])}" if twice else None
