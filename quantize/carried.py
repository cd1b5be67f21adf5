"""What a call hands the next: the carried tensors (a stream's state inputs and outputs, a recurrent cell's h and c)
and the nodes that write a carried output, followed back through the ops that only move data (a Slice of a Concat
that keeps the last samples of audio) to the node that computes it.

Quantized to 8 bits, a carried tensor is quantized again every call and its error compounds along the stream, so a
plan keeps these at the precision the recurrent rule gives a state (16-bit activations on the HTP), whatever family
the model's convolutions make it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

# ops whose output holds the values of their input, rearranged: the state is still there after them
MOVES_DATA = frozenset(
    {
        "Concat",
        "Slice",
        "Split",
        "Gather",
        "Reshape",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "Transpose",
        "Identity",
        "Expand",
        "Pad",
    }
)


@dataclass(frozen=True)
class CarriedState:
    tensors: tuple[str, ...]  # carried inputs and outputs, and every activation in or out of `nodes`
    nodes: tuple[str, ...]  # the nodes that write a carried output, back to the one that computes it

    def __bool__(self) -> bool:
        return bool(self.tensors)


def carried_state(model_path: Path, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> CarriedState:
    """The carried tensors of an ONNX model and the nodes that write its carried outputs (main graph only); only
    float activations are listed (a Slice's bounds, a Reshape's shape are not)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    with contextlib.suppress(Exception):  # the types are a filter: without them the graph's declared ones still hold
        model = onnx.shape_inference.infer_shapes(model)
    graph = model.graph
    weights = {i.name for i in graph.initializer}
    floats = {
        v.name
        for v in (*graph.input, *graph.output, *graph.value_info)
        if v.type.tensor_type.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
        and v.name not in weights
    }
    producer = {o: n for n in graph.node for o in n.output if o}
    tensors = [t for t in (*inputs, *outputs) if t in floats]
    nodes: list[str] = []
    for output in outputs:
        stack = [output]
        while stack:
            node = producer.get(stack.pop())
            if node is None or node.name in nodes or node.op_type == "Constant":
                continue
            nodes.append(node.name)
            tensors += [t for t in (*node.input, *node.output) if t in floats]
            if node.op_type in MOVES_DATA:  # its values were computed before it: follow them back
                stack += [t for t in (node.input if node.op_type == "Concat" else node.input[:1]) if t in floats]
    return CarriedState(tuple(dict.fromkeys(tensors)), tuple(nodes))
