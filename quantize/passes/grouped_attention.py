"""Pass `grouped-attention`: grouped-query attention computed on the key/value heads as they are, instead of on
copies repeated to the query heads' count.

A GQA decoder (Llama, Qwen, Gemma, samples/llama-40m) repeats each key/value head for its group of query heads
before attention (transformers' repeat_kv), and torch's exporter writes that as Unsqueeze(axis 2) → Expand →
Reshape: every call copies the whole KV cache n_rep times, K and V, in every layer. On llama-40m's INT4 decode
step at position 192 the Expands were 14.5 % of the kernel time (ORT profiler, 2 threads), the largest cost
after the weight matmuls. Query head h = kv · n_rep + r reads kv head kv, so the queries of one group are
contiguous: reshaped to [B, KVH, n_rep · S, D] they multiply the un-repeated cache directly, and the result,
reshaped back to [B, H, S, ·], is the same tensor. The scale, the mask and the softmax between the two matmuls
are untouched. Reshapes move no data; the Expands and their repeats go.

    scores  = MatMul(Q, Transpose(Reshape(Expand(Unsqueeze(K, 2)))))
           -> Reshape(MatMul(Reshape(Q, [0, KVH, -1, D]), Transpose(K)), [0, H, -1, 0])
    context = MatMul(P, Reshape(Expand(Unsqueeze(V, 2))))
           -> Reshape(MatMul(Reshape(P, [0, KVH, -1, 0]), V), [0, H, -1, D])

An export pass: the graph it leaves is verified against torch like every export (and, for a generate workload,
by greedy decoding through the cache).
"""

from __future__ import annotations

import numpy as np

from tapeout.core.onnx_graphs import attribute_ints, drop_unused, static_dims
from tapeout.quantize.passes.base import GraphPass

_SWAP_LAST = [0, 1, 3, 2]


class GroupedAttention(GraphPass):
    name = "grouped-attention"
    stage = "export"
    works_on = "proto"
    nothing_matched = "no attention matmul on key/value heads repeated by Unsqueeze → Expand → Reshape"

    def match(self, model) -> list[dict]:
        graph = model.graph
        producer = {o: n for n in graph.node for o in n.output}
        consts = {i.name: i for i in graph.initializer}
        dims = static_dims(model)
        found = []
        for node in graph.node:
            if node.op_type != "MatMul":
                continue
            right = producer.get(node.input[1])
            transposed = (
                right is not None and right.op_type == "Transpose" and attribute_ints(right, "perm") == _SWAP_LAST
            )
            reshape = producer.get(right.input[0]) if transposed else right
            expand = producer.get(reshape.input[0]) if reshape is not None and reshape.op_type == "Reshape" else None
            unsqueeze = producer.get(expand.input[0]) if expand is not None and expand.op_type == "Expand" else None
            if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or _axes(unsqueeze, consts) != [2]:
                continue
            kv, left = unsqueeze.input[0], node.input[0]
            kv_shape, left_shape = dims.get(kv), dims.get(left)
            if kv_shape is None or left_shape is None or len(kv_shape) != 4 or len(left_shape) != 4:
                continue
            kv_heads, head_dim, heads = kv_shape[1], kv_shape[3], left_shape[1]
            if not (kv_heads and head_dim and heads) or heads % kv_heads or heads == kv_heads:
                continue
            found.append(
                {
                    "matmul": node,
                    "kv": kv,
                    "transposed": transposed,
                    "kv_heads": kv_heads,
                    "heads": heads,
                    "head_dim": head_dim,
                }
            )
        return found

    def rewrite(self, model, matches: list[dict]) -> int:
        from onnx import helper, numpy_helper

        graph = model.graph
        for m in matches:
            node, tag = m["matmul"], m["matmul"].name or m["matmul"].output[0]
            kv_heads, heads, head_dim = m["kv_heads"], m["heads"], m["head_dim"]
            # scores: the queries [B, H, S, D] as [B, KVH, n_rep·S, D], back as [B, H, S, T];
            # context: the probabilities [B, H, S, T] as [B, KVH, n_rep·S, T], back as [B, H, S, D]
            into, back = (
                ([0, kv_heads, -1, head_dim], [0, heads, -1, 0])
                if m["transposed"]
                else ([0, kv_heads, -1, 0], [0, heads, -1, head_dim])
            )
            shapes = [
                numpy_helper.from_array(np.array(s, np.int64), f"{tag}/grouped_shape_{i}")
                for i, s in enumerate((into, back))
            ]
            graph.initializer.extend(shapes)
            grouped, right = f"{tag}/grouped_left", m["kv"]
            new = [helper.make_node("Reshape", [node.input[0], shapes[0].name], [grouped], name=f"{tag}/group")]
            if m["transposed"]:
                right = f"{tag}/kv_transposed"
                new.append(
                    helper.make_node("Transpose", [m["kv"]], [right], name=f"{tag}/transpose_kv", perm=_SWAP_LAST)
                )
            new += [
                helper.make_node("MatMul", [grouped, right], [f"{tag}/grouped_out"], name=f"{tag}/grouped"),
                helper.make_node(
                    "Reshape", [f"{tag}/grouped_out", shapes[1].name], [node.output[0]], name=f"{tag}/ungroup"
                ),
            ]
            at = list(graph.node).index(node)
            graph.node.remove(node)
            for offset, made in enumerate(new):
                graph.node.insert(at + offset, made)
        drop_unused(graph)  # the repeats' Unsqueeze → Expand → Reshape → Transpose and their shape arithmetic
        return len(matches)

    def postcondition(self, model) -> str | None:
        left = self.match(model)
        return f"{len(left)} repeated key/value matmul(s) left after the rewrite" if left else None


def _axes(unsqueeze, consts) -> list[int] | None:
    from onnx import numpy_helper

    if len(unsqueeze.input) > 1 and unsqueeze.input[1] in consts:
        return [int(a) for a in numpy_helper.to_array(consts[unsqueeze.input[1]]).ravel()]
    return attribute_ints(unsqueeze, "axes")
