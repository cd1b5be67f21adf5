"""Static analysis of an ONNX model: op census, parameters, FLOPs and bytes per node, activation liveness.

Shapes come from ONNX shape inference with the project's dims pinned, so every count is for the
shape the build measures. Architecture detection (families, roles, fusion groups) is `arch.py`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from tapeout import arch
from tapeout.archinfo import Analysis, NodeCost
from tapeout.errors import BadInput
from tapeout.onnx_bodies import bodies, graphs_in
from tapeout.types import InputSpec

# Ops whose output is a view or a relabelling: no arithmetic.
_NO_FLOPS = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Gather", "Slice",
             "Concat", "Split", "Cast", "Constant", "Expand", "ConstantOfShape", "Range", "GatherND", "Dropout"}


@dataclass
class GraphView:
    """An ONNX graph with the lookups every detector needs: who produces and who consumes a tensor."""

    model: object
    nodes: list = field(default_factory=list)
    producer: dict = field(default_factory=dict)
    consumers: dict = field(default_factory=dict)
    initializers: dict = field(default_factory=dict)   # name -> numpy array (weights, small constants)
    shapes: dict = field(default_factory=dict)         # tensor name -> tuple of ints (or None per unknown dim)
    dtypes: dict = field(default_factory=dict)
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    # If/Loop/Scan bodies: their nodes are in `nodes` (before the node that runs them), each with the
    # times it runs per inference (0 for the cheaper branch of an If: one branch runs)
    parent: dict = field(default_factory=dict)         # body node name -> the control-flow node's name
    control_flow: list = field(default_factory=list)   # control-flow nodes, outermost first
    body_outputs: dict = field(default_factory=dict)   # control-flow node name -> its bodies' output tensors

    @classmethod
    def load(cls, model_path: Path, inputs: list[InputSpec] | None = None, dims: dict[str, int] | None = None) -> GraphView:
        import onnx
        from onnx import numpy_helper

        try:
            model = onnx.load(str(model_path))
        except Exception as exc:
            raise BadInput(f"{model_path} is not a readable ONNX model ({type(exc).__name__}: {exc})",
                           fix="re-export it, or point the project at the right file") from None
        _pin_inputs(model, inputs or [], dims or {})
        del model.graph.value_info[:]  # stale symbolic shapes would shadow the pinned ones
        model = _infer_shapes(model)
        view = cls(model=model)
        view.nodes = _flatten(view, model.graph, None)
        for node in view.nodes:
            for out in node.output:
                view.producer[out] = node
            for inp in node.input:
                if inp:
                    view.consumers.setdefault(inp, []).append(node)
        graphs = list(graphs_in(model.graph))
        for init in (i for g in graphs for i in g.initializer):
            view.initializers[init.name] = numpy_helper.to_array(init)
        for node in view.nodes:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                view.initializers[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        for vi in [*model.graph.input, *(v for g in graphs for v in g.value_info), *model.graph.output,
                   *(v for g in graphs[1:] for v in [*g.input, *g.output])]:
            tensor = vi.type.tensor_type
            view.shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
            view.dtypes[vi.name] = tensor.elem_type
        for name, array in view.initializers.items():
            view.shapes[name] = tuple(array.shape)
        view.inputs = [i.name for i in model.graph.input if i.name not in view.initializers]
        view.outputs = [o.name for o in model.graph.output]
        return view

    def is_const(self, tensor: str) -> bool:
        return tensor in self.initializers or (
            tensor in self.producer and self.producer[tensor].op_type in ("Transpose", "Cast", "DequantizeLinear")
            and all(self.is_const(i) for i in self.producer[tensor].input if i))

    def const_array(self, tensor: str) -> np.ndarray | None:
        """The value of a constant tensor, looking through Transpose/Cast of an initializer."""
        if tensor in self.initializers:
            return self.initializers[tensor]
        node = self.producer.get(tensor)
        if node is not None and node.op_type in ("Transpose", "Cast") and node.input[0] in self.initializers:
            return self.initializers[node.input[0]]
        return None

    def weight_of(self, node) -> np.ndarray | None:
        """The weight of a MatMul/Gemm/Conv whose second input is constant, else None."""
        if node.op_type in ("MatMul", "Gemm", "Conv", "ConvTranspose") and len(node.input) > 1:
            return self.const_array(node.input[1])
        return None

    def size(self, tensor: str) -> int | None:
        shape = self.shapes.get(tensor)
        if shape is None or any(d is None for d in shape):
            return None
        return int(np.prod(shape, dtype=np.int64)) if shape else 1

    def elem_bytes(self, tensor: str) -> int:
        from onnx import helper

        elem = self.dtypes.get(tensor)
        if tensor in self.initializers:
            return self.initializers[tensor].dtype.itemsize
        try:
            return np.dtype(helper.tensor_dtype_to_np_dtype(elem)).itemsize if elem else 4
        except Exception:
            return 4

    def attr(self, node, name: str, default=None):
        from onnx import helper

        for a in node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default


def _flatten(view: GraphView, graph, parent) -> list:
    """The graph's nodes with each control-flow body's nodes just before the node that runs them."""
    nodes = []
    for i, node in enumerate(graph.node):
        if not node.name:  # body nodes are often nameless; names key roles and groups
            node.name = f"{parent.name if parent is not None else 'graph'}/{node.op_type}_{i}"
        held = bodies(node)
        if held:
            view.control_flow.append(node)
            view.body_outputs[node.name] = [o.name for _, body in held for o in body.output]
            for _, body in held:
                for inner in _flatten(view, body, node):
                    view.parent.setdefault(inner.name, node.name)
                    nodes.append(inner)
        nodes.append(node)
    return nodes


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


def _infer_shapes(model):
    """ORT's symbolic inference first (it resolves broadcasts of size-1 dims that ONNX's leaves
    unknown), ONNX's as the fallback; best effort: costs of unknown shapes count as 0."""
    from onnx import shape_inference

    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        # When it cannot infer every shape it saves the model as sym_shape_infer_temp.onnx (plus external
        # data) in the current directory before raising: let it write into a directory of its own.
        with tempfile.TemporaryDirectory(prefix="tapeout-shapes-") as scratch, _working_directory(scratch):
            inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
        if inferred is not None:
            return inferred
    except Exception:
        pass
    try:
        return shape_inference.infer_shapes(model, data_prop=True)
    except Exception:
        return model


@contextlib.contextmanager
def _working_directory(path: str):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _pin_inputs(model, inputs: list[InputSpec], dims: dict[str, int]) -> None:
    """Give every input dim a value: the project's shape, else the named dim's value, else 1."""
    specs = {s.name: s for s in inputs}
    for graph_input in model.graph.input:
        tensor_dims = graph_input.type.tensor_type.shape.dim
        spec = specs.get(graph_input.name)
        shape = spec.concrete_shape(dims) if spec is not None else None
        if shape is None or len(tensor_dims) != len(shape):  # a rank mismatch is the lint's to report
            shape = [d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, 1) for d in tensor_dims]
        for dim, value in zip(tensor_dims, shape, strict=True):
            dim.ClearField("dim_param")
            dim.dim_value = value


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
        per_output = int(np.prod(weight.shape[1:])) if op == "Conv" else int(np.prod(weight.shape[2:])) * weight.shape[0]
        flops = 2 * out * per_output
    elif op not in _NO_FLOPS and out:
        flops = out
    touched = [*node.input, *node.output]
    if op in ("Gather", "GatherElements", "GatherND") and node.output and view.size(node.output[0]) is not None:
        touched = [t for t in touched if t != node.input[0]] + [node.output[0]]  # reads the rows it gathers, not the table
    bytes_moved = sum(view.size(t) * view.elem_bytes(t) for t in touched if t and view.size(t) is not None)
    return NodeCost(node.name, op, int(flops), int(bytes_moved), params, view.parent.get(node.name, ""))


_RECURRENT_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _recurrent_cost(view: GraphView, node) -> tuple[int, int]:
    """FLOPs and parameters of an LSTM/GRU/RNN: per time step, batch row and direction, the input and
    recurrent projections (2 · gates · H · (I + H)) plus the gate arithmetic (about 4 · gates · H)."""
    weights = [view.const_array(t) for t in node.input[1:4] if t]
    params = sum(int(w.size) for w in weights if w is not None)
    x = view.shapes.get(node.input[0]) or ()
    hidden = view.attr(node, "hidden_size")
    if len(x) != 3 or any(d is None for d in x) or not hidden:
        return 0, params
    steps, batch = (x[1], x[0]) if view.attr(node, "layout", 0) else (x[0], x[1])
    direction = view.attr(node, "direction", b"forward")
    directions = 2 if (direction.decode() if isinstance(direction, bytes) else direction) == "bidirectional" else 1
    gates = _RECURRENT_GATES[node.op_type]
    per_step = 2 * gates * hidden * (x[2] + hidden) + 4 * gates * hidden
    return int(steps * batch * directions * per_step), params


def _control_flow_summary(view: GraphView, node) -> str:
    inside = sum(1 for parent in view.parent.values() if parent == node.name)
    counted = {"If": "the costlier branch counted", "Loop": "the body × its trip count",
               "Scan": "the body × the scanned length"}.get(node.op_type, "")
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
        freed = {t for t in [*node.input, *node.output] if t and t not in view.initializers and last_use.get(t, -1) <= i}
        live -= sum(nbytes(t) for t in freed)
    return int(peak), peak_at


def analyze(model_path: Path, inputs: list[InputSpec] | None = None, dims: dict[str, int] | None = None,
            hints: dict | None = None) -> Analysis:
    """Everything static about the model at the build's shapes, with its architecture."""
    return analyze_view(GraphView.load(model_path, inputs, dims), hints)


def analyze_view(view: GraphView, hints: dict | None = None) -> Analysis:
    costs = [node_cost(view, n) for n in view.nodes if n.op_type != "Constant"]
    if view.control_flow:
        runs = runs_per_inference(view, {c.name: c for c in costs})
        costs = [replace(c, flops=c.flops * runs.get(c.name, 1), bytes_moved=c.bytes_moved * runs.get(c.name, 1))
                 for c in costs]
    weight_bytes = sum(a.nbytes for a in view.initializers.values() if a.size > 1)
    params = sum(int(a.size) for a in view.initializers.values() if a.size > 1 and a.dtype.kind == "f")
    peak, peak_at = activation_peak(view)
    found = arch.detect(view, hints or {}, {c.name: c for c in costs})
    if view.control_flow:
        found.facts["control_flow"] = "; ".join(_control_flow_summary(view, n) for n in view.control_flow)
        found.facts["body_nodes"] = len(view.parent)
    return Analysis(
        families=found.families, roles=found.roles, groups=found.groups,
        op_census=dict(Counter(n.op_type for n in view.nodes).most_common()),
        params=params, weight_bytes=int(weight_bytes), flops=sum(c.flops for c in costs),
        bytes_moved=sum(c.bytes_moved for c in costs), peak_activation_bytes=peak, peak_activation_at=peak_at,
        costs=costs, facts=found.facts, unmatched=found.unmatched,
    )
