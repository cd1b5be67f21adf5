"""Pass `fold-recurrent-weights`: the weights of recurrent ops that an exporter computes at run time, folded
into initializers.

torch's dynamo exporter writes an LSTM's W, R and B as Slice/Concat of the PyTorch weights (it reorders the
gates from PyTorch's i,f,g,o to ONNX's i,o,f,c). To ORT's quantizer (which quantizes only LSTM weights that
are initializers), to the HTP compiler and to the cost model such a weight is an activation: the LSTM stays
float and its parameters count as 0. Folded, it is a plain weight. Only the subgraphs that end in a
recurrent op's weight inputs are folded: nothing else changes. It works on the export's protobuf, before the
export is saved and verified against torch.
"""

from __future__ import annotations

from tapeout.core.onnx_graphs import drop_unused
from tapeout.quantize.passes.base import GraphPass

_RECURRENT = {"LSTM": (1, 2, 3), "GRU": (1, 2, 3), "RNN": (1, 2, 3)}
# Ops a weight reaches a recurrent op through (layout and dtype only): nothing data dependent
_LAYOUT_OPS = {
    "Slice",
    "Concat",
    "Split",
    "Unsqueeze",
    "Squeeze",
    "Reshape",
    "Transpose",
    "Cast",
    "Identity",
    "Constant",
    "Gather",
}


class FoldRecurrentWeights(GraphPass):
    name = "fold-recurrent-weights"
    stage = "export"
    works_on = "proto"
    nothing_matched = "no LSTM, GRU or RNN whose weights are computed from constants"

    def match(self, model) -> list:
        initializers = {i.name for i in model.graph.initializer}
        return [
            (node, i)
            for node in model.graph.node
            if node.op_type in _RECURRENT
            for i in _RECURRENT[node.op_type]
            if i < len(node.input) and node.input[i] and node.input[i] not in initializers
        ]

    def rewrite(self, model, matches: list) -> int:
        return fold_recurrent_weights(model)

    def postcondition(self, model) -> str | None:
        """Every input of every main-graph node is still provided (dropping unused nodes cut nothing in use)."""
        provided = (
            {i.name for i in model.graph.initializer}
            | {o for n in model.graph.node for o in n.output}
            | {i.name for i in model.graph.input}
        )
        dangling = [t for n in model.graph.node for t in n.input if t and t not in provided]
        return f"inputs no node or initializer provides: {', '.join(dangling[:3])}" if dangling else None


def fold_recurrent_weights(model) -> int:
    """Replace each recurrent weight computed from constants by layout ops with an initializer of its
    value; drop the nodes and initializers nothing uses any more. Returns how many weights it folded."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    initializers = {i.name for i in graph.initializer}
    targets = [
        (node, i)
        for node in graph.node
        if node.op_type in _RECURRENT
        for i in _RECURRENT[node.op_type]
        if i < len(node.input) and node.input[i] and node.input[i] not in initializers
    ]

    def constant_subgraph(tensor: str, nodes: dict) -> bool:
        if tensor in initializers:
            return True
        node = producer.get(tensor)
        if node is None or node.op_type not in _LAYOUT_OPS or node.domain not in ("", "ai.onnx"):
            return False
        if id(node) in nodes:
            return True
        if all(constant_subgraph(t, nodes) for t in node.input if t):
            nodes[id(node)] = node
            return True
        return False

    folded: dict[str, object] = {}
    for user, index in targets:
        tensor = user.input[index]
        if tensor in folded:
            user.input[index] = folded[tensor].name
            continue
        nodes: dict = {}
        if not constant_subgraph(tensor, nodes):
            continue
        order = [n for n in graph.node if id(n) in nodes]  # the graph is topologically sorted
        needed = {t for n in order for t in n.input if t in initializers}
        sub = helper.make_graph(
            order,
            "fold",
            [],
            [helper.make_value_info(tensor, helper.TypeProto())],
            [i for i in graph.initializer if i.name in needed],
        )
        value = ReferenceEvaluator(helper.make_model(sub, opset_imports=model.opset_import)).run(None, {})[0]
        # a new name: the nodes that computed it stay until nothing reads them
        folded[tensor] = numpy_helper.from_array(value, f"{tensor}.folded")
        user.input[index] = folded[tensor].name
    if not folded:
        return 0
    graph.initializer.extend(folded.values())
    drop_unused(graph)
    return len(folded)
