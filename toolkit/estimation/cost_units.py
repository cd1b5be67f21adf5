"""The model as the kernels a runtime would run: fusion groups once, folded shape arithmetic never.

The estimator's unit is the kernel, not the ONNX node (research/profiling-modeling.md §1.1): a
fusion group from the analysis (a Conv or Linear with its bias, activation and norm) is one kernel
whose bytes are its weighted nodes' traffic; any other node is its own kernel; nodes a runtime
constant-folds (shape arithmetic, everything computed from weights alone) are none. Each kernel
has a class (what calibration fits an efficiency per), a precision from the quantization plan,
FLOPs, and bytes at that precision.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from tapeout.estimation.roofline import BYTES_PER_ELEMENT, bytes_per_element
from tapeout.estimation.runtime_fusions import runtime_fused
from tapeout.graph.analysis import Analysis
from tapeout.graph.analyze import node_cost
from tapeout.graph.view import GraphView
from tapeout.records.structure import SCHEMA as STRUCTURE_SCHEMA
from tapeout.records.structure import CostUnitRecord, PhaseRecord, StructureRecord

CLASSES = ("conv", "matmul", "recurrent", "reduce", "elementwise", "movement", "quantize")
# the classes whose constant inputs are weights read from the model's working set (a Gather's table is read a row
# at a time, a norm's scale is tiny: their bytes are their own)
WEIGHTED = frozenset({"conv", "matmul", "recurrent"})

# ONNX, ONNX Runtime contrib and OpenVINO executed-layer type names, by kernel class. A name not
# listed is elementwise (arithmetic per element, bandwidth-bound on every device here).
_CLASS_OF = {
    "conv": {
        "Conv",
        "ConvTranspose",
        "QLinearConv",
        "FusedConv",
        "NhwcConv",
        "ConvInteger",
        "NhwcFusedConv",
        "Convolution",
        "GroupConvolution",
        "ConvolutionBackpropData",
        "GroupConvolutionBackpropData",
    },
    "matmul": {
        "MatMul",
        "Gemm",
        "FusedMatMul",
        "FusedGemm",
        "QGemm",
        "QLinearMatMul",
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
        "MatMulNBits",
        "Attention",
        "MultiHeadAttention",
        "GroupQueryAttention",
        "Einsum",
        "FullyConnected",
        "ScaledDotProductAttention",
        "FullyConnectedCompressed",
        "FullyConnectedQuantizedLegacy",
        "FullyConnectedQuantized",
        "gemm",
        "matmul",
    },
    # one op, but its cell runs once per time step: its cost per launch is per step
    "recurrent": {"LSTM", "GRU", "RNN", "DynamicQuantizeLSTM", "LSTMSequence", "GRUSequence", "RNNSequence"},
    "reduce": {
        "Softmax",
        "LogSoftmax",
        "LayerNormalization",
        "SkipLayerNormalization",
        "SimplifiedLayerNormalization",
        "SkipSimplifiedLayerNormalization",
        "BatchNormalization",
        "InstanceNormalization",
        "GroupNorm",
        "RMSNormalization",
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL2",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "ArgMax",
        "TopK",
        "CumSum",
        "MVN",
        "Pooling",
        "Reduce",
        "SoftMax",
        "NormalizeL2",
        "RMS",
        "Topk",
    },
    "movement": {
        "Transpose",
        "Concat",
        "Gather",
        "GatherElements",
        "GatherND",
        "Slice",
        "Split",
        "Reshape",
        "Expand",
        "Tile",
        "Pad",
        "Resize",
        "ScatterND",
        "ScatterElements",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Identity",
        "ReorderInput",
        "ReorderOutput",
        "Reorder",
        "StridedSlice",
        "Broadcast",
        "Convert",
        "Copy",
        "DepthToSpace",
        "SpaceToDepth",
        "ShuffleChannels",
        "Interpolate",
        "Cast",
        "MemcpyToHost",
        "MemcpyFromHost",
        "ShapeOf",
    },
    "quantize": {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "FakeQuantize"},
}
# ExecuTorch's ETDump names: XNNPACK's own kernel names inside its delegate, whose layout and number formats follow
# in parentheses ("Convolution (NHWC, QC8) IGEMM", "Fully Connected (NC, QDU8, F32, QC8W) GEMM": the part before
# " (" is the kernel), and the ATen ops on ExecuTorch's portable kernels ("expand_copy", "native_layer_norm").
_CLASS_OF_EXECUTORCH = {
    "conv": {"Deconvolution", "convolution"},
    "matmul": {"Fully Connected", "Batch Matrix Multiply", "mm", "bmm", "addmm", "linear"},
    "reduce": {
        "Max Pooling",
        "Average Pooling",
        "Global Average Pooling",
        "Softmax",
        "native_layer_norm",
        "_softmax",
        "mean",
        "sum",
        "amax",
        "max_pool2d_with_indices",
        "_native_batch_norm_legit_no_training",
    },
    "movement": {
        "Static Reshape",
        "Static Transpose",
        "Static Slice",
        "Static Constant Pad",
        "Constant Pad",
        "Concatenate",
        "Copy",
        "Even Split",
        "expand_copy",
        "permute_copy",
        "view_copy",
        "slice_copy",
        "select_copy",
        "unsqueeze_copy",
        "squeeze_copy",
        "cat",
        "embedding",
        "index",
        "clone",
        "_to_copy",
    },
    "quantize": {
        "quantize_per_tensor",
        "dequantize_per_tensor",
        "quantize_per_channel",
        "dequantize_per_channel",
        "choose_qparams",
    },
}
_BY_NAME = {name: cls for table in (_CLASS_OF, _CLASS_OF_EXECUTORCH) for cls, names in table.items() for name in names}

# AOTInductor's kernel records: a generated kernel is named after the ATen ops fused into it ("cpp_fused_add_native_
# layer_norm", Triton's "triton_per_fused__softmax"), a call out of the package after its C shim
# ("aoti_torch_cpu__linear_pointwise", "aoti_torch_cpu__qconv_pointwise_tensor"). A generated kernel with a reduction
# among its ops is a reduce (the elementwise ops around it ride along); one of copies and views alone is movement.
_INDUCTOR_REDUCE = re.compile(
    r"layer_norm|softmax|_mean|_sum|amax|amin|max_pool|avg_pool|var_mean|_norm|_var|argmax|"
    r"cumsum|logsumexp|^triton_(red|per)_"
)
_INDUCTOR_MATMUL = re.compile(r"linear|_mm|addmm|bmm|baddbmm|scaled_dot_product|_gemm|^triton_tem_fused_(mm|bmm|addmm)")
_INDUCTOR_MOVEMENT = {
    "cat",
    "clone",
    "permute",
    "view",
    "index",
    "embedding",
    "slice",
    "select",
    "expand",
    "transpose",
    "copy",
    "unsqueeze",
    "squeeze",
    "to",
    "constant",
    "pad",
    "nd",
    "stack",
    "split",
    "unbind",
    "t",
    "narrow",
    "as",
    "strided",
    "reshape",
    "repeat",
    "roll",
    "flip",
    "_unsafe",
    "unsafe",
}
_INDUCTOR_NAME = re.compile(r"^(cpp|triton_(poi|red|per|tem))_fused_?(?P<ops>.*)$")


def _inductor_class(name: str) -> str | None:
    """The kernel class of an AOTInductor kernel record's name, or None for a name that is not one."""
    if name.startswith("aoti_torch_"):
        call = name.split("_", 3)[-1]  # aoti_torch_<device>_<op>
        if "conv" in call:
            return "conv"
        if "quantize" in call:
            return "quantize"
        return "matmul" if _INDUCTOR_MATMUL.search(call) else "elementwise"
    found = _INDUCTOR_NAME.match(name)
    if found is None:
        return None
    ops = found["ops"]
    if "convolution" in ops:
        return "conv"
    if _INDUCTOR_MATMUL.search(ops):
        return "matmul"
    if _INDUCTOR_REDUCE.search(name):
        return "reduce"
    if "quantize" in ops:
        return "quantize"
    words = [w for w in ops.split("_") if w and not w.isdigit()]
    return "movement" if all(w in _INDUCTOR_MOVEMENT for w in words) else "elementwise"


# Ops that give their input a new shape without touching it: every runtime here aliases the buffer
# (the bottleneck view counts them the same way), so they cost a dispatch and no traffic.
VIEW_OPS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}

# Nodes that only move shapes about: a runtime folds them (with their constant inputs) at load time.
_SHAPE_OPS = {"Shape", "Size", "Constant", "ConstantOfShape", "Range"}


def op_class(op_type: str) -> str:
    """The kernel class of an op by its type (ONNX, a runtime's executed layer, ExecuTorch's or AOTInductor's name)."""
    return _BY_NAME.get(op_type) or _inductor_class(op_type) or _BY_NAME.get(op_type.split(" (", 1)[0], "elementwise")


@dataclass(frozen=True)
class Kernel:
    name: str  # the fusion group's name, or the node's
    cls: str  # one of CLASSES
    precision: str
    flops: int
    bytes: float  # DRAM traffic at the kernel's precision, once per inference
    nodes: int  # ONNX nodes it covers
    launches: int = 1  # times it runs per inference: a recurrent cell once per time step
    lead: str = ""  # the node the plan's precision is looked up by (a group's first weighted node)
    quantized_input: int = 0  # a fusion group's input elements: quantized too where the group is
    reread: float = 0.0  # bytes read again on every launch after the first: a recurrent cell's weights
    weights: float = 0.0  # of `bytes`, those of constant inputs: read from wherever the model's weights fit

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "class": self.cls,
            "precision": self.precision,
            "flops": self.flops,
            "bytes": self.bytes,
            "nodes": self.nodes,
            "launches": self.launches,
            "reread_bytes": self.reread,
            "weight_bytes": self.weights,
        }


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
    return at_precision(structure(view, analysis), plan, default_precision)


def structure(view: GraphView, analysis: Analysis) -> list[Kernel]:
    """The kernels as exported (FP32 bytes), in execution order: made while the graph is loaded, so the
    graph can be let go before the precision step decides what each kernel runs in."""
    skip = folded(view)
    by_name = {n.name: n for n in view.nodes}
    group_of = {n: g for g in analysis.groups for n in g.nodes}
    costs = {c.name: c for c in analysis.costs}
    kernels: list[Kernel] = []
    seen_groups: set[str] = set()
    for node in view.nodes:
        if node.name in skip:
            continue
        group = group_of.get(node.name)
        if group is None:
            cost = costs.get(node.name) or node_cost(view, node)
            cls = op_class(node.op_type)
            moved = 0 if node.op_type in VIEW_OPS else cost.bytes_moved
            kernels.append(
                Kernel(
                    node.name,
                    cls,
                    "fp32",
                    cost.flops,
                    moved,
                    1,
                    _steps(view, node) if cls == "recurrent" else 1,
                    node.name,
                    reread=_recurrent_weights(view, node) if cls == "recurrent" else 0,
                    weights=min(moved, _const_bytes(view, [node])) if cls in WEIGHTED else 0.0,
                )
            )
            continue
        if group.name in seen_groups:
            continue
        seen_groups.add(group.name)
        members = [costs[n] for n in group.nodes if n in costs]
        weighted = [costs[n] for n in group.weighted if n in costs] or members[:1]
        lead = by_name.get(weighted[0].name) if weighted else None
        cls = op_class(lead.op_type) if lead is not None else "elementwise"
        moved = sum(c.bytes_moved for c in weighted)
        kernels.append(
            Kernel(
                group.name,
                cls,
                "fp32",
                sum(c.flops for c in members),
                moved,
                len(members),
                _steps(view, lead) if cls == "recurrent" and lead is not None else 1,
                group.weighted[0] if group.weighted else "",
                (view.size(lead.input[0]) or 0) if lead is not None and group.weighted else 0,
                _recurrent_weights(view, lead) if cls == "recurrent" and lead is not None else 0,
                min(moved, _const_bytes(view, [by_name[c.name] for c in weighted if c.name in by_name]))
                if cls in WEIGHTED
                else 0.0,
            )
        )
    return runtime_fused(view, kernels)


QUANTIZE_SUFFIX = "/quantize"  # the activation-quantization kernel `at_precision` adds after a quantized kernel


def quantized_kernel(kernel: Kernel) -> str | None:
    """The name of the kernel whose input this activation-quantization kernel quantizes (`at_precision`); None for
    any other kernel."""
    if kernel.cls == "quantize" and kernel.name.endswith(QUANTIZE_SUFFIX):
        return kernel.name[: -len(QUANTIZE_SUFFIX)]
    return None


def at_precision(kernels: list[Kernel], plan: dict | None, default_precision: str) -> list[Kernel]:
    """Each kernel at the precision the plan gives its lead node, bytes scaled to it; a quantized fusion
    group adds the activation quantization its input needs (read float, write 8 bits)."""
    precisions = precision_of(plan, default_precision)
    out = []
    for k in kernels:
        precision = precisions.get(k.lead, default_precision) if k.lead else default_precision
        scale = bytes_per_element(precision) / 4.0
        out.append(
            replace(k, precision=precision, bytes=k.bytes * scale, reread=k.reread * scale, weights=k.weights * scale)
        )
        if precision in ("int8", "int4", "fp8") and k.quantized_input:
            elements = k.quantized_input
            out.append(
                Kernel(
                    f"{k.name}{QUANTIZE_SUFFIX}",
                    "quantize",
                    precision,
                    2 * elements,
                    elements * (4 + bytes_per_element(precision, 1.0)),
                    0,
                )
            )
    return out


def model_weights(kernels: list[Kernel]) -> float:
    """The bytes of every kernel's weights: the working set they are read from, run after run."""
    return math.fsum(k.weights for k in kernels)


def roof_times(kernel: Kernel, roof, weights: float = 0.0) -> tuple[float, float]:
    """Seconds at the compute roof and at the bandwidth roof (0 where the roof is unknown). Bytes move at the
    roof's bandwidth for the working set they sit in (`Roof.bandwidth_at`): the kernel's own traffic, and for its
    weights the model's (`weights`, `model_weights`) where that is larger, since a weight is read again only on the
    next run, after all the others."""
    peak, _ = roof.peak(kernel.precision)
    compute = kernel.flops / peak if peak else 0.0
    own = roof.bandwidth_at(kernel.bytes)
    memory = 0.0
    if own:
        weight_rate = roof.bandwidth_at(max(weights, kernel.bytes)) or own
        memory = (kernel.bytes - kernel.weights) / own + kernel.weights / weight_rate
    if kernel.reread and kernel.launches > 1:
        # re-read from the cache level it fits in; a roof with no measured cache cannot price it, and a
        # lower bound must not guess: those reads are then left out
        rate = roof.bandwidth_at(kernel.reread) if roof.cache else None
        if rate:
            memory += (kernel.launches - 1) * kernel.reread / rate
    return compute, memory


def model_times(kernels: list[Kernel], roof) -> list[tuple[float, float]]:
    """`roof_times` of every kernel of one model (one call)."""
    weights = model_weights(kernels)
    return [roof_times(k, roof, weights) for k in kernels]


def class_roofs(kernels: list[Kernel], roof) -> dict[str, float]:
    """Roofline seconds per `class@precision`: the sum of each kernel's max(compute, memory) time."""
    out: dict[str, float] = {}
    for k, times in zip(kernels, model_times(kernels, roof), strict=True):
        key = f"{k.cls}@{k.precision}"
        out[key] = out.get(key, 0.0) + max(times)
    return out


def class_counts(kernels: list[Kernel]) -> dict[str, int]:
    """Launches per class: what a class's per-kernel cost is paid for."""
    out: dict[str, int] = {}
    for k in kernels:
        out[k.cls] = out.get(k.cls, 0) + k.launches
    return out


def _const_bytes(view: GraphView, nodes: list) -> float:
    """Bytes of the constant inputs of `nodes` (each tensor once): the weights they read."""
    tensors = {t for n in nodes for t in n.input if t and view.is_const(t)}
    return float(sum((view.size(t) or 0) * view.elem_bytes(t) for t in tensors))


def _recurrent_weights(view: GraphView, node) -> float:
    """FP32 bytes of an LSTM/GRU/RNN's recurrent weights (R): every time step multiplies the hidden state
    by them, a matrix-vector product that reads them anew (runtimes project all steps' inputs by W in
    one multiply up front, so W is read once)."""
    if len(node.input) < 3 or not node.input[2]:
        return 0.0
    weights = view.const_array(node.input[2])
    return float(weights.size * 4) if weights is not None else 0.0


def _steps(view: GraphView, node) -> int:
    """Time steps of an LSTM/GRU/RNN (its input's sequence axis: 0, or 1 with layout=1)."""
    shape = view.shapes.get(node.input[0]) or ()
    axis = 1 if view.attr(node, "layout", 0) else 0
    return int(shape[axis]) if len(shape) == 3 and shape[axis] else 1


def to_record(kernels: list[Kernel], phases: list[PhaseRecord] | None = None) -> StructureRecord:
    """The kernel structure as structure.json holds it (with a generate workload's phases, where it has them)."""
    return StructureRecord(schema=STRUCTURE_SCHEMA, kernels=unit_records(kernels), phases=phases or [])


def unit_records(kernels: list[Kernel]) -> list[CostUnitRecord]:
    return [
        CostUnitRecord(
            name=k.name,
            cls=k.cls,
            precision=k.precision,
            flops=k.flops,
            bytes=k.bytes,
            nodes=k.nodes,
            launches=k.launches,
            lead=k.lead,
            quantized_input=k.quantized_input,
            reread=k.reread,
            weights=k.weights,
        )
        for k in kernels
    ]


def from_units(units: list[CostUnitRecord]) -> list[Kernel]:
    return [
        Kernel(
            name=k.name,
            cls=k.cls,
            precision=k.precision,
            flops=k.flops,
            bytes=k.bytes,
            nodes=k.nodes,
            launches=k.launches,
            lead=k.lead,
            quantized_input=k.quantized_input,
            reread=k.reread,
            weights=k.weights,
        )
        for k in units
    ]


def from_record(record: StructureRecord) -> list[Kernel]:
    return from_units(record.kernels)
