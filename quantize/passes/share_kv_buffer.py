"""Pass `share-kv-buffer`: the KV cache of a graph whose attention is ONNX Runtime's GroupQueryAttention as one
buffer per layer that the kernel appends to in place, instead of a present of past + new positions written anew by
every call.

After `group-query-attention` each decode step still copies the whole cache into a fresh present, so a step costs
more the longer the cache. The kernel appends in place where its past and present are one buffer (bound to the
same memory through IOBinding) of a fixed length; the lengths then cannot come from the past's shape, so the graph
takes one more input, `past_length` (int64 scalar: the positions the buffer already holds), and its past_* inputs
and present_* outputs become [batch, kv_heads, max_context, head_dim]. Every Shape of a past input is replaced by
the cache's logical shape [batch, kv_heads, past_length, head_dim], so the kernel's lengths and anything else read
from it (positions, masks) stay what they were.

It applies only where every past_* input is read by GroupQueryAttention nodes (as their past) and Shape nodes and
nothing else. The ONNX Runtime target keeps the cache graph's interface for every other caller (targets/ort_ep.py):
a call with a past of P positions is copied into the buffer and its present cut back to P + new positions; its
decoder binds past and present to one buffer per layer.
"""

from __future__ import annotations

import numpy as np

from tapeout.core.decoding import INPUT_IDS, PAST_LENGTH
from tapeout.core.onnx_graphs import drop_unused
from tapeout.quantize.passes.base import NOT_A_CACHE_GRAPH, GraphPass, cache_graph

_GQA = "GroupQueryAttention"


class ShareKvBuffer(GraphPass):
    name = "share-kv-buffer"
    stage = "target"
    works_on = "proto"
    nothing_matched = "no GroupQueryAttention reads the cache (the group-query-attention pass fused none)"

    def __init__(self, inputs: list, dims: dict[str, int]):
        # dims["past"] = max_context - 1 (exporters/generation.py): the buffer holds every position the cache holds
        self.cache_graph = cache_graph(inputs) and "past" in dims
        self.max_context = dims.get("past", 0) + 1

    def precondition(self, model) -> str | None:
        return None if self.cache_graph else NOT_A_CACHE_GRAPH

    def match(self, model) -> list[dict]:
        graph = model.graph
        past = [i.name for i in graph.input if i.name.startswith("past_") and i.name != PAST_LENGTH]
        if (
            not past
            or any(i.name == PAST_LENGTH for i in graph.input)
            or INPUT_IDS not in {i.name for i in graph.input}
        ):
            return []
        readers: dict[str, list] = {name: [] for name in past}
        for node in graph.node:
            for i, name in enumerate(node.input):
                if name in readers:
                    readers[name].append((node, i))
        attention, shapes = [], []
        for name, found in readers.items():
            for node, i in found:
                if node.op_type == _GQA and node.domain == "com.microsoft" and i in (3, 4):
                    if i == 3:
                        attention.append(node)
                elif node.op_type == "Shape":
                    shapes.append(node)
                else:
                    self.nothing_matched = (
                        f"{name} is read by a {node.op_type} ({node.name or 'unnamed'}), not only by "
                        "GroupQueryAttention and Shape: its buffer cannot be shared"
                    )
                    return []
            if not any(node.op_type == _GQA for node, _ in found):
                self.nothing_matched = f"{name} is not a GroupQueryAttention's past"
                return []
        present = {out for node in attention for out in node.output[1:3]}
        outputs = {o.name for o in graph.output}
        if not present <= outputs or len(present) != len(past):
            self.nothing_matched = "the attention's present keys and values are not the graph's present_* outputs"
            return []
        return [{"past": past, "present": sorted(present), "shapes": shapes, "attention": attention}]

    def rewrite(self, model, matches: list[dict]) -> int:
        from onnx import TensorProto, helper, numpy_helper

        graph, (m,) = model.graph, matches
        tag = "share_kv_buffer"
        graph.input.append(helper.make_tensor_value_info(PAST_LENGTH, TensorProto.INT64, []))
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.array([0], np.int64), f"{tag}/zero"),
                numpy_helper.from_array(np.array([2], np.int64), f"{tag}/two"),
                numpy_helper.from_array(np.array([3], np.int64), f"{tag}/three"),
                numpy_helper.from_array(np.array([4], np.int64), f"{tag}/four"),
                numpy_helper.from_array(np.array([1], np.int64), f"{tag}/shape1"),
            ]
        )
        length = helper.make_node("Reshape", [PAST_LENGTH, f"{tag}/shape1"], [f"{tag}/length"])
        made = [length]
        for k, shape in enumerate(m["shapes"]):
            # Shape(past) -> [its batch, heads] ++ [past_length] ++ [its head_dim], sliced as the Shape's start/end did
            start = next((a.i for a in shape.attribute if a.name == "start"), 0)
            end = next((a.i for a in shape.attribute if a.name == "end"), None)
            stored, out = f"{tag}/{k}/stored", shape.output[0]
            whole = f"{tag}/{k}/logical" if (start, end) != (0, None) else out
            made += [
                helper.make_node("Shape", [shape.input[0]], [stored]),
                helper.make_node("Slice", [stored, f"{tag}/zero", f"{tag}/two"], [f"{tag}/{k}/head"]),
                helper.make_node("Slice", [stored, f"{tag}/three", f"{tag}/four"], [f"{tag}/{k}/tail"]),
                helper.make_node("Concat", [f"{tag}/{k}/head", f"{tag}/length", f"{tag}/{k}/tail"], [whole], axis=0),
            ]
            if whole != out:
                bounds = [f"{tag}/{k}/start", f"{tag}/{k}/end"]
                graph.initializer.extend(
                    [
                        numpy_helper.from_array(np.array([start], np.int64), bounds[0]),
                        numpy_helper.from_array(np.array([4 if end is None else end], np.int64), bounds[1]),
                    ]
                )
                made.append(helper.make_node("Slice", [whole, *bounds], [out]))
            graph.node.remove(shape)
        for node in reversed(made):
            graph.node.insert(0, node)
        for value in [*graph.input, *graph.output]:
            if value.name in m["past"] or value.name in m["present"]:
                dim = value.type.tensor_type.shape.dim[2]
                dim.Clear()
                dim.dim_value = self.max_context
        stale = [v for v in graph.value_info if v.name in m["present"]]  # shapes of the cache as it was
        for value in stale:
            graph.value_info.remove(value)
        drop_unused(graph)
        return len(m["attention"])

    def postcondition(self, model) -> str | None:
        cache = {i.name for i in model.graph.input if i.name.startswith("past_") and i.name != PAST_LENGTH}
        readers = {n.op_type for n in model.graph.node for i in n.input if i in cache}
        return None if readers <= {_GQA, "Shape"} else f"the cache is read by {', '.join(sorted(readers))}"
