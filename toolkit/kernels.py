"""The model as the kernels a runtime would run: fusion groups once, folded shape arithmetic never.

The estimator's unit is the kernel, not the ONNX node (research/profiling-modeling.md §1.1): a
fusion group from the analysis (a Conv or Linear with its bias, activation and norm) is one kernel
whose bytes are its weighted nodes' traffic; any other node is its own kernel; nodes a runtime
constant-folds (shape arithmetic, everything computed from weights alone) are none. Each kernel
has a class (what calibration fits an efficiency per), a precision from the quantization plan,
FLOPs, and bytes at that precision.
"""

from __future__ import annotations

from dataclasses import dataclass

from tapeout.analysis import GraphView, node_cost
from tapeout.archinfo import Analysis
from tapeout.roofline import BYTES_PER_ELEMENT

CLASSES = ("conv", "matmul", "recurrent", "reduce", "elementwise", "movement", "quantize")

# ONNX, ONNX Runtime contrib and OpenVINO executed-layer type names, by kernel class. A name not
# listed is elementwise (arithmetic per element, bandwidth-bound on every device here).
_CLASS_OF = {
    "conv": {"Conv", "ConvTranspose", "QLinearConv", "FusedConv", "NhwcConv", "ConvInteger", "NhwcFusedConv",
             "Convolution", "GroupConvolution", "ConvolutionBackpropData", "GroupConvolutionBackpropData"},
    "matmul": {"MatMul", "Gemm", "FusedMatMul", "FusedGemm", "QGemm", "QLinearMatMul", "MatMulInteger",
               "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "MatMulNBits", "Attention", "MultiHeadAttention",
               "GroupQueryAttention", "Einsum", "FullyConnected", "ScaledDotProductAttention",
               "FullyConnectedCompressed", "FullyConnectedQuantizedLegacy", "FullyConnectedQuantized", "gemm", "matmul"},
    # one op, but its cell runs once per time step: its cost per launch is per step
    "recurrent": {"LSTM", "GRU", "RNN", "DynamicQuantizeLSTM", "LSTMSequence", "GRUSequence", "RNNSequence"},
    "reduce": {"Softmax", "LogSoftmax", "LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
               "SkipSimplifiedLayerNormalization", "BatchNormalization", "InstanceNormalization", "GroupNorm",
               "RMSNormalization", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2",
               "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "ArgMax", "TopK", "CumSum",
               "MVN", "Pooling", "Reduce", "SoftMax", "NormalizeL2", "RMS", "Topk"},
    "movement": {"Transpose", "Concat", "Gather", "GatherElements", "GatherND", "Slice", "Split", "Reshape", "Expand",
                 "Tile", "Pad", "Resize", "ScatterND", "ScatterElements", "Squeeze", "Unsqueeze", "Flatten", "Identity",
                 "ReorderInput", "ReorderOutput", "Reorder", "StridedSlice", "Broadcast", "Convert", "Copy",
                 "DepthToSpace", "SpaceToDepth", "ShuffleChannels", "Interpolate", "Cast", "MemcpyToHost",
                 "MemcpyFromHost", "ShapeOf"},
    "quantize": {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "FakeQuantize"},
}
_BY_NAME = {name: cls for cls, names in _CLASS_OF.items() for name in names}

# Nodes that only move shapes about: a runtime folds them (with their constant inputs) at load time.
_SHAPE_OPS = {"Shape", "Size", "Constant", "ConstantOfShape", "Range"}


def op_class(op_type: str) -> str:
    return _BY_NAME.get(op_type, "elementwise")


@dataclass(frozen=True)
class Kernel:
    name: str          # the fusion group's name, or the node's
    cls: str           # one of CLASSES
    precision: str
    flops: int
    bytes: float       # DRAM traffic at the kernel's precision, once per inference
    nodes: int         # ONNX nodes it covers
    launches: int = 1  # times it runs per inference: a recurrent cell once per time step

    def to_json(self) -> dict:
        return {"name": self.name, "class": self.cls, "precision": self.precision, "flops": self.flops,
                "bytes": self.bytes, "nodes": self.nodes, "launches": self.launches}


def folded(view: GraphView) -> set[str]:
    """Nodes computed from constants and shapes alone: constant-folded by every runtime here."""
    known: set[str] = set(view.initializers)
    done: set[str] = set()
    for node in view.nodes:
        inputs = [t for t in node.input if t]
        if node.op_type in _SHAPE_OPS or (inputs and all(t in known for t in inputs)):
            done.add(node.name)
            known.update(t for t in node.output if t)
    return done


def precision_of(plan: dict | None, default: str) -> dict[str, str]:
    """Node name -> precision from a quantization plan's groups (nodes not in it run at `default`)."""
    out: dict[str, str] = {}
    for group in (plan or {}).get("groups", []):
        for node in group.get("nodes", []):
            out[node] = group.get("precision", default)
    return out


def float_precision(profile_precision: str, plan: dict | None) -> str:
    """What the nodes a plan leaves unquantized run in: the ladder's last rung (CPU: fp32; GPUs: fp16)."""
    ladder = (plan or {}).get("ladder") or []
    if ladder:
        return ladder[-1]
    return profile_precision if profile_precision in BYTES_PER_ELEMENT else "fp32"


def of(view: GraphView, analysis: Analysis, plan: dict | None, default_precision: str) -> list[Kernel]:
    """The kernels of the analysed model at the plan's precisions, in execution order."""
    skip = folded(view)
    precisions = precision_of(plan, default_precision)
    group_of = {n: g for g in analysis.groups for n in g.nodes}
    costs = {c.name: c for c in analysis.costs}
    kernels: list[Kernel] = []
    seen_groups: set[str] = set()
    for node in view.nodes:
        if node.name in skip or node.op_type in _SHAPE_OPS:
            continue
        cost = costs.get(node.name) or node_cost(view, node)
        group = group_of.get(node.name)
        if group is not None:
            if group.name in seen_groups:
                continue
            seen_groups.add(group.name)
            members = [costs[n] for n in group.nodes if n in costs]
            weighted = [costs[n] for n in group.weighted if n in costs] or members[:1]
            precision = precisions.get(group.weighted[0], default_precision) if group.weighted else default_precision
            scale = BYTES_PER_ELEMENT.get(precision, 4.0) / 4.0
            cls = op_class(weighted[0].op_type) if weighted else "elementwise"
            lead = next((n for n in view.nodes if n.name == weighted[0].name), None) if weighted else None
            kernel = Kernel(group.name, cls, precision, sum(c.flops for c in members),
                            sum(c.bytes_moved for c in weighted) * scale, len(members),
                            _steps(view, lead) if cls == "recurrent" and lead is not None else 1)
            kernels.append(kernel)
            if precision in ("int8", "int4", "fp8") and weighted:
                kernels.append(_quantize_kernel(view, group.name, group.weighted[0], precision))
            continue
        precision = precisions.get(node.name, default_precision)
        scale = BYTES_PER_ELEMENT.get(precision, 4.0) / 4.0
        kernels.append(Kernel(node.name, op_class(node.op_type), precision, cost.flops, cost.bytes_moved * scale, 1,
                              _steps(view, node) if op_class(node.op_type) == "recurrent" else 1))
    return kernels


def _quantize_kernel(view: GraphView, group: str, weighted: str, precision: str) -> Kernel:
    """The activation quantization a quantized group's input needs: read float, write 8 bits."""
    node = next(n for n in view.nodes if n.name == weighted)
    elements = view.size(node.input[0]) or 0
    return Kernel(f"{group}/quantize", "quantize", precision, 2 * elements,
                  elements * (4 + BYTES_PER_ELEMENT.get(precision, 1.0)), 0)


def roof_times(kernel: Kernel, roof) -> tuple[float, float]:
    """Seconds at the compute roof and at the bandwidth roof (0 where the roof is unknown)."""
    peak, _ = roof.peak(kernel.precision)
    compute = kernel.flops / peak if peak else 0.0
    memory = kernel.bytes / roof.bandwidth if roof.bandwidth else 0.0
    return compute, memory


def class_roofs(kernels: list[Kernel], roof) -> dict[str, float]:
    """Roofline seconds per `class@precision`: the sum of each kernel's max(compute, memory) time."""
    out: dict[str, float] = {}
    for k in kernels:
        key = f"{k.cls}@{k.precision}"
        out[key] = out.get(key, 0.0) + max(roof_times(k, roof))
    return out


def class_counts(kernels: list[Kernel]) -> dict[str, int]:
    """Launches per class: what a class's per-kernel cost is paid for."""
    out: dict[str, int] = {}
    for k in kernels:
        out[k.cls] = out.get(k.cls, 0) + k.launches
    return out


def _steps(view: GraphView, node) -> int:
    """Time steps of an LSTM/GRU/RNN (its input's sequence axis: 0, or 1 with layout=1)."""
    shape = view.shapes.get(node.input[0]) or ()
    axis = 1 if view.attr(node, "layout", 0) else 0
    return int(shape[axis]) if len(shape) == 3 and shape[axis] else 1
