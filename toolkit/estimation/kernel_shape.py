"""What a kernel's FLOPs and bytes do not tell of it, kept in its shape (cost_units.Kernel.shape) where a predictor
reads it (predictor.SHAPE_FEATURES): a conv's channels, positions, kernel area and groups; a MatMul's rows, depth and
columns; a recurrent cell's input width and hidden size; a pool's channels; a movement kernel's contiguous runs; and
what an elementwise, movement, quantize or recurrent kernel computes (`function`)."""

from __future__ import annotations

import math

from tapeout.graph.view import GraphView

# the shapes a structure record keeps (StructureRecord.shapes): 1, every one below; 2, with a Softmax's `masked` share
# (softmax_masks.py, from the build's golden input); 3, a generate build's every phase with its own Softmax shares (a
# prefill's causal mask, measured at its shapes). A record of an earlier version is read again from its build's
# export (build_structure.py)
VERSION = 3


def of(view: GraphView, node, cls: str, op_types) -> tuple[tuple[str, int], ...]:
    """The shape of a kernel of class `cls` led by `node` (None: a group with no weighted node) and made of nodes of
    `op_types`: its conv's, MatMul's, pool's or cell's sizes, or a movement kernel's run, where it is one; and its
    function where its class has one."""
    found: tuple[tuple[str, int], ...] = ()
    if node is not None and cls == "movement":
        found = movement_run(view, node)
    elif node is not None:
        found = conv_shape(view, node) or matmul_shape(view, node) or pool_shape(view, node) or \
            recurrent_shape(view, node)
    return (*found, *function_shape(cls, op_types))


def _dims(view: GraphView, tensor: str) -> tuple[int, ...] | None:
    shape = view.shapes.get(tensor) if tensor else None
    return tuple(shape) if shape and all(isinstance(d, int) and d > 0 for d in shape) else None


def movement_run(view: GraphView, node) -> tuple[tuple[str, int], ...]:
    """A movement kernel's `run`: the elements each contiguous copy moves. A Transpose's is the trailing axes it
    leaves in place (attention's [b, s, h, d] → [b, h, s, d] copies runs of d; a key's [b, h, d, s] none: 1), a
    Concat's or Split's what follows its axis, a Gather's its rows, anything else the trailing axes its input and
    output share. The swept Transposes of 1-4 MB ran from ~21 to ~98 GB/s (10th-90th percentile); held out, the
    movement points within ±15 % rose from 46 to 75 % knowing it (Transposes 22 to 71). () where a size is unknown."""
    out = _dims(view, node.output[0]) if node.output else None
    source = _dims(view, node.input[0]) if node.input else None
    op = node.op_type
    if op == "Concat" and out is not None:  # an empty input (a cache's first call, its past 0 long) copies nothing
        source = next((d for d in (_dims(view, t) for t in node.input) if d), None)
    if out is None or source is None:
        return ()
    rank = len(source)
    if op == "Transpose":
        perm = list(view.attr(node, "perm", None) or reversed(range(rank)))
        kept = 0
        while kept < rank and perm[rank - 1 - kept] == rank - 1 - kept:
            kept += 1
        return (("run", math.prod(source[rank - kept:])),)
    if op in ("Concat", "Split", "Gather", "GatherElements"):
        axis = int(view.attr(node, "axis", 0)) % rank
        after = 1 if op.startswith("Gather") else 0
        tensors = node.input[:1] if op.startswith("Gather") else node.input if op == "Concat" else node.output
        inputs = [d for d in (_dims(view, t) for t in tensors) if d]
        return (("run", max(1, min(math.prod(d[axis + after:]) for d in inputs))),) if inputs else ()
    shared = 1
    for a, b in zip(reversed(source), reversed(out), strict=False):
        if a != b:
            break
        shared *= a
    return (("run", shared),)


def recurrent_shape(view: GraphView, node) -> tuple[tuple[str, int], ...]:
    """An LSTM's, GRU's or RNN's input width and hidden size (its steps are its launches): at one FLOP count and
    step count a wide input projected once up front is not a wide hidden state multiplied every step (held out, the
    recurrent points within ±15 % rose from 88 to 93 % knowing them, the INT8 LSTMs from 78 to 85); () where unknown."""
    if node.op_type not in ("LSTM", "GRU", "RNN") or not node.input:
        return ()
    x = view.shapes.get(node.input[0]) or ()
    hidden = view.attr(node, "hidden_size", 0)
    if not x or not isinstance(x[-1], int) or x[-1] <= 0 or not hidden:
        return ()
    return (("input", x[-1]), ("hidden", int(hidden)))


def matmul_shape(view: GraphView, node) -> tuple[tuple[str, int], ...]:
    """A MatMul's or Gemm's rows (`m`: every row of a batched one, its batches' stacked: attention's 12 heads of 128
    × 64 are 1,536), depth (`k`) and columns (`n`): the GEMM's shape, which at one FLOP count runs from ~200 to
    ~850 GFLOP/s INT8 here (2,582 × 314 × 19 against 460 × 1,031 × 749); () where a size is unknown."""
    if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
        return ()
    a, b = view.shapes.get(node.input[0]) or (), view.shapes.get(node.input[1]) or ()
    out = view.size(node.output[0]) if node.output else None
    if len(a) < 2 or len(b) < 2 or not out:
        return ()
    gemm = node.op_type == "Gemm"
    k = a[0] if gemm and view.attr(node, "transA", 0) else a[-1]
    n = b[0] if gemm and view.attr(node, "transB", 0) else b[-1]
    if not all(isinstance(d, int) and d > 0 for d in (k, n)) or out % n:
        return ()
    return (("m", out // n), ("k", k), ("n", n))


# A Relu and a Tanh read and write the same bytes at a FLOP an element, and at 1 MB the 1-thread sweep here ran Add and
# Relu at ~105 GB/s, Tanh and Sigmoid at 35-39, Erf at 26 (held out, the elementwise predictor came within ±15 % on
# 81 % of its points knowing this, 41 % not). A kernel takes its costliest node's. Elementwise: 1 arithmetic, 2 the
# exponential's kin, 3 erf's and the trigonometric.
# Movement: 1 a copy of contiguous runs, 2 a gather of rows, 3 a transpose (a layout reorder is one). Quantize: 1
# into 8 bits, 2 out of them (DequantizeLinear ran at ~59 GB/s of its bytes where QuantizeLinear ran at ~91).
# Recurrent: the cell, 1 an LSTM's, 2 a GRU's, 3 a plain RNN's (held out, 87 % of the recurrent points within ±15 %
# knowing it, 81 % not).
FUNCTION_CLASSES = ("elementwise", "movement", "quantize", "recurrent")
_FUNCTION = {
    "elementwise": {**dict.fromkeys(("Exp", "Sigmoid", "Tanh", "Softplus", "Elu", "Selu", "Celu", "Mish", "QuickGelu",
                                     "FastGelu", "Swish"), 2),
                    **dict.fromkeys(("Erf", "Gelu", "BiasGelu", "Log", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan",
                                     "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"), 3)},
    "movement": {**dict.fromkeys(("Gather", "GatherElements", "GatherND"), 2),
                 **dict.fromkeys(("Transpose", "DepthToSpace", "SpaceToDepth", "ShuffleChannels", "ReorderInput",
                                  "ReorderOutput", "Reorder"), 3)},
    "quantize": {"DequantizeLinear": 2},
    "recurrent": {**dict.fromkeys(("GRU", "GRUSequence"), 2), **dict.fromkeys(("RNN", "RNNSequence"), 3)},
}


def inserted_shape(cls: str, op: str) -> tuple[tuple[str, int], ...]:
    """The shape of a kernel a runtime adds that the model has no node for (a layout reorder, the Transpose and the Q
    and DQ around a QLinearConv): its function, and a movement kernel's run of one element (a layout change moves
    the innermost axis: NCHW to NCHWc or NHWC reads or writes the channels a plane apart)."""
    return (*(("run", 1),) * (cls == "movement"), *function_shape(cls, [op]))


def function_shape(cls: str, op_types) -> tuple[tuple[str, int], ...]:
    """The `function` a kernel of `cls` made of nodes of `op_types` has in its shape (() outside FUNCTION_CLASSES)."""
    if cls not in FUNCTION_CLASSES:
        return ()
    return (("function", max((_FUNCTION[cls].get(op, 1) for op in op_types), default=1)),)


def conv_shape(view: GraphView, node) -> tuple[tuple[str, int], ...]:
    """A 1-D or 2-D Conv's (channels per group, output channels, output positions, kernel area, groups, output
    width: its rows' length, which ONNX Runtime computes one at a time), from its weight and output shapes, and for a
    1-D one its rank (the runtime runs it another way: `runtime_kernels`); ()
    for anything else or where a size is unknown."""
    if node.op_type != "Conv" or len(node.input) < 2:
        return ()
    weights = view.const_array(node.input[1])
    weight = tuple(weights.shape) if weights is not None else view.shapes.get(node.input[1]) or ()
    out = view.shapes.get(node.output[0]) or ()
    if len(weight) not in (3, 4) or len(out) != len(weight) or \
            not all(isinstance(d, int) and d > 0 for d in (*weight, *out[1:])):
        return ()
    shape = (("per_group", weight[1]), ("out_channels", weight[0]), ("positions", math.prod(out[2:])),
             ("area", math.prod(weight[2:])), ("groups", int(view.attr(node, "group", 1))), ("width", out[-1]))
    return (*shape, ("rank", 1)) if len(weight) == 3 else shape


def pool_shape(view: GraphView, node) -> tuple[tuple[str, int], ...]:
    """A MaxPool's or AveragePool's channels (ONNX Runtime blocks a pool by them: `runtime_kernels.pool_layout`);
    () where unknown."""
    shape = view.shapes.get(node.input[0]) if node.input else None
    if node.op_type not in ("MaxPool", "AveragePool") or not shape or len(shape) < 3 or \
            not isinstance(shape[1], int) or shape[1] <= 0:
        return ()
    return (("channels", shape[1]),)
