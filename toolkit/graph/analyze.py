"""Static analysis of an ONNX model: op census, parameters, FLOPs and bytes per node, activation liveness.

Shapes come from ONNX shape inference with the project's dims pinned, so every count is for the
shape the build measures. Architecture detection (families, roles, fusion groups) is `detect.py`.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from tapeout.core.onnx_graphs import bodies, graphs_in
from tapeout.core.schemas import InputSpec
from tapeout.graph import detect
from tapeout.graph.analysis import Analysis, NodeCost
from tapeout.graph.view import GraphView

# Ops whose output is a view or a relabelling: no arithmetic.
_WINDOWED = {"MaxPool", "AveragePool", "LpPool"}  # pools over a kernel_shape window
_NO_FLOPS = {
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Identity",
    "Shape",
    "Gather",
    "Slice",
    "Concat",
    "Split",
    "Cast",
    "Constant",
    "Expand",
    "ConstantOfShape",
    "Range",
    "GatherND",
    "Dropout",
}


def runs_per_inference(view: GraphView, costs: dict[str, NodeCost]) -> dict[str, int]:
    """How often each body node runs per inference: a Loop's body its trip count (1 when not a constant),
    a Scan's the scanned axis' length; of an If's branches only the costlier counts (one runs)."""
    runs: dict[str, int] = {}

    def body_flops(body) -> int:
        return sum(costs[n.name].flops for n in body.node if n.name in costs)

    for node in view.control_flow:  # outermost first: a nested body multiplies its parent's count
        outer = runs.get(node.name, 1)
        times = 1
        if node.op_type == "Loop" and node.input and node.input[0]:
            trips = view.const_array(node.input[0])
            times = int(trips.reshape(-1)[0]) if trips is not None and trips.size == 1 else 1
        elif node.op_type == "Scan":
            scanned = node.input[-1] if node.input else ""
            shape = view.shapes.get(scanned) or ()
            times = shape[0] if shape and shape[0] else 1
        held = bodies(node)
        branch = node.op_type == "If" and len(held) == 2
        taken = max(held, key=lambda b: body_flops(b[1]))[0] if branch else None
        for name, body in held:
            count = outer * (0 if branch and name != taken else times)
            for inner in (n.name for g in graphs_in(body) for n in g.node):
                runs[inner] = count
    return runs


def node_cost(view: GraphView, node) -> NodeCost:
    out = view.size(node.output[0]) if node.output else None
    weight = view.weight_of(node)
    params = int(weight.size) if weight is not None else 0
    flops = 0
    op = node.op_type
    if op in ("MatMul", "Gemm", "MatMulInteger", "MatMulNBits", "FusedMatMul") and out:
        a_shape = view.shapes.get(node.input[0]) or ()
        k = a_shape[-1] if a_shape and a_shape[-1] else None
        if op == "Gemm" and view.attr(node, "transA", 0) and len(a_shape) == 2:
            k = a_shape[0]
        if op == "MatMulNBits":
            k = view.attr(node, "K")
        flops = 2 * out * k if k else 0
    elif op in _RECURRENT_GATES:
        flops, params = _recurrent_cost(view, node)
    elif op in ("Conv", "ConvTranspose") and out and weight is not None:
        per_output = (
            int(np.prod(weight.shape[1:])) if op == "Conv" else int(np.prod(weight.shape[2:])) * weight.shape[0]
        )
        flops = 2 * out * per_output
    elif op in _WINDOWED and out:
        # a comparison (or an add) per output per window element: a 3×3 pool does 9 per output, a 2×2 one 4, at the
        # same output size, and ONNX Runtime's generic 8-bit MaxPool costs in proportion (estimator.md)
        flops = out * int(np.prod(view.attr(node, "kernel_shape", [1])))
    elif op not in _NO_FLOPS and out:
        flops = out
    touched = [*node.input, *node.output]
    if op in ("Gather", "GatherElements", "GatherND") and node.output and view.size(node.output[0]) is not None:
        touched = [t for t in touched if t != node.input[0]] + [
            node.output[0]
        ]  # reads the rows it gathers, not the table
    bytes_moved = sum(view.size(t) * view.elem_bytes(t) for t in touched if t and view.size(t) is not None)
    return NodeCost(node.name, op, int(flops), int(bytes_moved), params, view.parent.get(node.name, ""))


_RECURRENT_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _recurrent_cost(view: GraphView, node) -> tuple[int, int]:
    """FLOPs and parameters of an LSTM/GRU/RNN: per time step, batch row and direction, the input and
    recurrent projections (2 · gates · H · (I + H)) plus the gate arithmetic (about 4 · gates · H), over every
    time step of the call."""
    weights = [view.const_array(t) for t in node.input[1:4] if t]
    params = sum(int(w.size) for w in weights if w is not None)
    hidden = view.attr(node, "hidden_size")
    w = weights[0] if weights else None
    x = list(view.shapes.get(node.input[0]) or ())
    if len(x) != 3 and w is not None and w.ndim == 3:
        x = [None, None, int(w.shape[2])]  # W is [directions, gates · hidden, input]: the input size is its own
    elif len(x) == 3 and x[2] is None and w is not None and w.ndim == 3:
        x[2] = int(w.shape[2])
    if len(x) != 3 or x[2] is None or not hidden:
        return 0, params
    # A length or batch shape inference cannot resolve (a sequence reshaped at run time from data) counts as one:
    # a lower bound, never the zero that would hand a recurrent model's family to its convolutions.
    steps, batch = (x[1], x[0]) if view.attr(node, "layout", 0) else (x[0], x[1])
    direction = view.attr(node, "direction", b"forward")
    directions = 2 if (direction.decode() if isinstance(direction, bytes) else direction) == "bidirectional" else 1
    gates = _RECURRENT_GATES[node.op_type]
    per_step = 2 * gates * hidden * (x[2] + hidden) + 4 * gates * hidden
    return int((steps or 1) * (batch or 1) * directions * per_step), params


def _control_flow_summary(view: GraphView, node) -> str:
    inside = sum(1 for parent in view.parent.values() if parent == node.name)
    counted = {
        "If": "the costlier branch counted",
        "Loop": "the body × its trip count",
        "Scan": "the body × the scanned length",
    }.get(node.op_type, "")
    return f"{node.op_type} {node.name} ({inside} nodes inside{'; ' + counted if counted else ''})"


def activation_peak(view: GraphView) -> tuple[int, str]:
    """Peak bytes of live activations over the graph's (topological) node order.

    A tensor is live from the node that produces it (graph inputs: from the start) to its last
    consumer; weights are not activations. This is the lower bound a memory planner reaches
    without recomputation; runtimes add arenas and workspace on top.
    """
    order = {node.name: i for i, node in enumerate(view.nodes)}
    last_use: dict[str, int] = {}
    for node in view.nodes:
        for t in node.input:
            if t and t not in view.initializers:
                last_use[t] = max(last_use.get(t, -1), order[node.name])
    for t in view.outputs:
        last_use[t] = len(view.nodes)

    def nbytes(t: str) -> int:
        n = view.size(t)
        return n * view.elem_bytes(t) if n else 0

    live = sum(nbytes(t) for t in view.inputs)
    peak, peak_at = live, "(inputs)"
    for i, node in enumerate(view.nodes):
        if node.op_type == "Constant":
            continue
        live += sum(nbytes(t) for t in node.output if t)
        if live > peak:
            peak, peak_at = live, node.name
        freed = {
            t for t in [*node.input, *node.output] if t and t not in view.initializers and last_use.get(t, -1) <= i
        }
        live -= sum(nbytes(t) for t in freed)
    return int(peak), peak_at


def analyze(
    model_path: Path,
    inputs: list[InputSpec] | None = None,
    dims: dict[str, int] | None = None,
    hints: dict | None = None,
) -> Analysis:
    """Everything static about the model at the build's shapes, with its architecture."""
    return analyze_view(GraphView.load(model_path, inputs, dims), hints)


def analyze_view(view: GraphView, hints: dict | None = None) -> Analysis:
    costs = [node_cost(view, n) for n in view.nodes if n.op_type != "Constant"]
    if view.control_flow:
        runs = runs_per_inference(view, {c.name: c for c in costs})
        costs = [
            replace(c, flops=c.flops * runs.get(c.name, 1), bytes_moved=c.bytes_moved * runs.get(c.name, 1))
            for c in costs
        ]
    weight_bytes = sum(a.nbytes for a in view.initializers.values() if a.size > 1)
    params = sum(int(a.size) for a in view.initializers.values() if a.size > 1 and a.dtype.kind == "f")
    peak, peak_at = activation_peak(view)
    found = detect.detect(view, hints or {}, {c.name: c for c in costs})
    if view.control_flow:
        found.facts["control_flow"] = "; ".join(_control_flow_summary(view, n) for n in view.control_flow)
        found.facts["body_nodes"] = len(view.parent)
    return Analysis(
        families=found.families,
        roles=found.roles,
        groups=found.groups,
        op_census=dict(Counter(n.op_type for n in view.nodes).most_common()),
        params=params,
        weight_bytes=int(weight_bytes),
        flops=sum(c.flops for c in costs),
        bytes_moved=sum(c.bytes_moved for c in costs),
        peak_activation_bytes=peak,
        peak_activation_at=peak_at,
        costs=costs,
        facts=found.facts,
        unmatched=found.unmatched,
        scopes=module_scopes(view.nodes),
    )


_SCOPES_KEY = "pkg.torch.onnx.name_scopes"


def module_scopes(nodes) -> dict[str, str]:
    """Node name -> the torch module it was exported from, where the exporter recorded one: torch.onnx's dynamo
    exporter writes each node's module path and op (`['', 'features', 'features.2', 'conv2d_1']`) into its
    metadata. What maps a plan's groups back to the torch program (PT2E quantization). Read as data: a literal list
    of strings, bounded in length, or nothing."""
    scopes = {}
    for node in nodes:
        raw = next((p.value for p in node.metadata_props if p.key == _SCOPES_KEY), None)
        if raw is None or len(raw) > 4096:
            continue
        try:
            path = ast.literal_eval(raw)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(path, list) and len(path) >= 2 and all(isinstance(p, str) for p in path):
            scopes[node.name] = path[-2]
    return scopes
