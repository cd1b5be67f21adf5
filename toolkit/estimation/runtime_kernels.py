"""Which kernel a runtime runs for a cost unit, where the cost unit's own features do not say: ONNX Runtime's CPU EP
runs a 2-D Conv in its blocked NCHWc layout or in plain NCHW (im2col and a GEMM) by the conv's channel counts and
groups, and the two differ in speed by up to 2× at the same FLOPs (docs/estimator.md, "Sweeps").

The answer is the runtime's own: a one-Conv model of the kernel's shape is optimized by the installed ONNX Runtime
at the level a build runs it (all optimizations, this host's instruction set deciding the block size), and its
graph is read back. No rule about channel multiples is kept here: ONNX Runtime 1.32 blocks a conv whose input
channels are a multiple of 4 or fewer than the block (921 of 921 swept convs on this AVX-512 host), earlier versions
only multiples of the block, and which CPUs block at all, at which block size, is the runtime's to say.
"""

from __future__ import annotations

import functools
import math
import tempfile
from pathlib import Path

BLOCKED, PLAIN = 2, 1   # a conv's `layout` shape feature (positive: the predictors read the log of each)
NCHWC_DOMAIN = "com.microsoft.nchwc"


def conv_layout(shape: dict) -> int | None:
    """BLOCKED where ONNX Runtime's CPU EP on this host runs a conv of this shape (`cost_units` conv shape: channels
    per group, output channels, groups, kernel area) in NCHWc, else PLAIN; None where the shape is incomplete."""
    found = _asked(shape)
    return found[0] if found else None


def conv_fill(shape: dict) -> int | None:
    """The percentage of the output channels the runtime computes that are the conv's own: a blocked conv pads its
    output channels up to the block (16 with AVX-512, 8 with AVX2), so 18 channels cost 32's; 100 for a plain one."""
    found = _asked(shape)
    return max(1, round(100 * int(shape["out_channels"]) / found[1])) if found else None


def _asked(shape: dict) -> tuple[int, int] | None:
    try:
        key = (int(shape["per_group"]), int(shape["out_channels"]), int(shape["groups"]), int(shape["area"]),
               int(shape.get("rank", 2)))
    except (KeyError, TypeError, ValueError):
        return None
    return _layout(*key) if all(v > 0 for v in key) and key[-1] in (1, 2) else None


@functools.lru_cache(maxsize=4096)
def _layout(per_group: int, out_channels: int, groups: int, area: int, rank: int = 2) -> tuple[int, int]:
    """(layout, output channels computed) of ONNX Runtime's optimized one-Conv model of this shape: a 2-D conv
    (`rank` 2, a square kernel where the area is one) or a 1-D one (`rank` 1, a Conv1d's `area` taps)."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    side = math.isqrt(area)
    kernel = (area,) if rank == 1 else (side, side) if side * side == area else (1, area)
    channels = per_group * groups
    weight = numpy_helper.from_array(np.zeros((out_channels, per_group, *kernel), np.float32), "w")
    bias = numpy_helper.from_array(np.zeros(out_channels, np.float32), "b")
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=groups, kernel_shape=list(kernel))
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             [1, channels, *(k + 7 for k in kernel)])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[weight, bias])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3  # its warning that an NCHWc graph is for this machine only: that is the point
    with tempfile.TemporaryDirectory(prefix="tapeout-layout-") as folder:
        options.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
        ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath, load_external_data=False)
    blocked = next((n for n in optimized.graph.node if n.domain == NCHWC_DOMAIN and n.op_type == "Conv"), None)
    if blocked is None:
        return PLAIN, out_channels
    weights = {t.name: list(t.dims) for t in optimized.graph.initializer}
    return BLOCKED, max(out_channels, (weights.get(blocked.input[1]) or [out_channels])[0])


def pool_layout(shape: dict) -> int:
    """BLOCKED where ONNX Runtime's CPU EP on this host runs a MaxPool or AveragePool of this many `channels`
    (`cost_units` pool shape) in NCHWc, as it does after a blocked conv (cnn-lstm-m's FP32 pools: ~3.5 µs each, where
    a plain one of its size ran ~15); PLAIN for a plain one and for every other reduce kernel (no `channels`)."""
    channels = shape.get("channels")
    return _pool_layout(int(channels)) if isinstance(channels, int | float) and channels > 0 else PLAIN


@functools.lru_cache(maxsize=1024)
def _pool_layout(channels: int) -> int:
    """The layout of ONNX Runtime's optimized one-MaxPool model (2×2, stride 2) of `channels` channels."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    with tempfile.TemporaryDirectory(prefix="tapeout-layout-") as folder:
        path = Path(folder) / "pool.onnx"
        onnx.save(proto, str(path))
        graph = optimized_graph(path)
    return BLOCKED if any(n.domain == NCHWC_DOMAIN and n.op_type == "MaxPool" for n in graph.node) else PLAIN


REORDERS = ("ReorderInput", "ReorderOutput")


def optimized_graph(model: Path, threads: int = 1):
    """The graph ONNX Runtime's CPU EP runs for `model` on this host: optimized at every level, as a build runs it
    (this host's instruction set deciding its layouts), saved and read back."""
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="tapeout-executed-") as folder:
        options.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
        ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        graph = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
    return graph


def inserted_reorders(model: Path, dims: dict[str, int], threads: int = 1) -> list[tuple[str, str, int]]:
    """The layout reorders ONNX Runtime's CPU EP inserts into this model's graph on this host (its NCHWc transformer:
    a ReorderInput before a blocked conv whose input is plain, a ReorderOutput where a plain op reads a blocked
    output), as (op type, tensor, bytes of the plain tensor), from the graph it optimizes at the level a build runs.
    A real CNN pays them between its blocked convs and the ops that have no blocked kernel (unet here: seven, 2 µs
    each in a 46 µs run), which no one-kernel point of a sweep holds. [] where it inserts none."""
    return reorders_in(optimized_graph(model, threads), dims)


# the activations a blocked conv runs after its Sum (MLAS's: ONNX Runtime's NCHWc transformer folds these)
_CONV_ACTIVATIONS = ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid")


def folded_into_convs(model_graph, graph) -> set[str]:
    """The nodes of `model_graph` (the artifact) that ONNX Runtime's NCHWc transformer folds into a blocked conv in
    `graph` (the one it runs, `optimized_graph`): an Add of a conv's output and another tensor, which the conv takes as
    its Sum input, and the activation after that Add, which it takes as its own. Each leaves no tensor behind: what it
    wrote no node of `graph` reads or writes. A toy ResNet's two residual Adds and their Relus run inside its convs
    (the profile lists none of them), where a kernel each would add ~1 µs to its ~20."""
    left = {t for node in graph.node for t in (*node.input, *node.output) if t}

    def vanished(node) -> bool:
        return all(t not in left for t in node.output)

    convs = {t for node in model_graph.node if node.op_type in ("Conv", "FusedConv") for t in node.output}
    adds = [n for n in model_graph.node if n.op_type == "Add" and vanished(n) and any(t in convs for t in n.input)]
    sums = {t for node in adds for t in node.output}
    acts = [n for n in model_graph.node if n.op_type in _CONV_ACTIVATIONS and n.input and n.input[0] in sums and
            vanished(n)]
    return {node.name for node in (*adds, *acts)}


def node_count(graph) -> int:
    """The nodes a graph ONNX Runtime optimized runs (its shape queries and constants run none)."""
    return sum(1 for node in graph.node if node.op_type not in ("Shape", "Size", "Constant"))


def reorders_in(graph, dims: dict[str, int]) -> list[tuple[str, str, int]]:
    """`inserted_reorders` of a graph ONNX Runtime optimized (`optimized_graph`)."""
    shapes = {v.name: v.type.tensor_type for v in (*graph.value_info, *graph.input, *graph.output)}
    found = []
    for node in graph.node:
        if node.op_type not in REORDERS:
            continue
        tensor = node.input[0] if node.op_type == "ReorderInput" else node.output[0]
        kind = shapes.get(tensor)
        if kind is None:
            continue
        sizes = [d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, 0) for d in kind.shape.dim]
        if sizes and all(s > 0 for s in sizes):
            found.append((node.op_type, tensor, math.prod(sizes) * 4))  # FP32: only FP32 convs are blocked
    return found


# what ONNX Runtime runs of a static QDQ model beside its quantized kernels: the activations' QuantizeLinear and
# DequantizeLinear where the graph leaves INT8, and the Transposes into and out of its NHWC QLinearConvs
QDQ_KERNELS = ("QuantizeLinear", "DequantizeLinear")
_ELEMENT_BYTES = {1: 4, 2: 1, 3: 1, 6: 4, 7: 8, 10: 2, 16: 2}  # ONNX TensorProto types: float, uint8, int8, …


EIGHT_BIT_POOLS = ("MaxPool",)  # pooling ONNX Runtime runs on the 8-bit tensor a QDQ graph hands it


def quantized_graph(model: Path, dims: dict[str, int], float_model: Path | None = None,
                    threads: int = 1) -> tuple[int, list[tuple[str, str, int, int]], set[str]]:
    """How ONNX Runtime's CPU EP runs a static QDQ model on this host: (the nodes its optimized graph runs, and of
    them the ones no cost unit of the float model holds, as (op type, tensor, elements, bytes per element)): every
    QuantizeLinear and DequantizeLinear left after its QDQ fusions (a QLinearConv takes the others in), and each
    Transpose or layout reorder it inserted (a node the model does not name). A toy ResNet here ran 5 QLinearConvs
    with 3 Q, 4 DQ and 5 Transposes around them: 24 of its 31 µs outside the convs. A node whose size cannot be
    told is counted among the nodes, not listed. `float_model`: the model before quantization, whose nodes' names the
    quantized kernels keep and whose shapes ONNX shape inference tells where the QLinear… graph's are not. Third:
    the pooling nodes it runs on 8-bit tensors (a MaxPool between a Q and a DQ, which its QDQ fusions drop): not
    MLAS's FP32 kernel but a generic one, which ran resnet-m's 3×3 stride-2 MaxPool here in 998 µs, against 33 µs
    for the FP32 build's."""
    import onnx

    source = onnx.load(str(model), load_external_data=False)
    graph = optimized_graph(model, threads)
    sources = [source, *([onnx.load(str(float_model), load_external_data=False)] if float_model else [])]
    elements = _elements(sources, graph, dims)
    named = {n.name for n in source.graph.node}
    producers = {o: n for n in graph.node for o in n.output}  # a Transpose's input's writer: its element width
    executed, found, eight_bit = 0, [], set()
    for node in graph.node:
        if node.op_type in ("Shape", "Size", "Constant"):
            continue
        executed += 1
        if node.op_type in EIGHT_BIT_POOLS and node.input and _width(node.input[0], producers) == 1:
            eight_bit.add(node.name)
        if node.op_type in QDQ_KERNELS or (node.op_type in ("Transpose", *REORDERS) and node.name not in named):
            tensor = node.input[0]
            count = elements.get(tensor)
            if count:
                width = 4 if node.op_type in (*QDQ_KERNELS, *REORDERS) else _width(tensor, producers)
                found.append((node.op_type, tensor, count, width))
    return executed, found, eight_bit


def _elements(sources: list, graph, dims: dict[str, int]) -> dict[str, int]:
    """Elements per tensor of the optimized graph: from the QDQ model's inferred shapes (ONNX Runtime's saved graph
    keeps few), a fused kernel's output as the source node it replaced (ONNX Runtime names that output after it:
    a QLinearConv's `node_Conv_99` is the Conv `node_Conv_99`'s output, in NHWC), and across the nodes that keep
    their input's count (Q, DQ, Transpose, reorders, Relu) both ways, until nothing changes."""
    import onnx

    counts: dict[str, int] = {}
    by_node: dict[str, int] = {}
    for source in sources:
        known: dict[str, int] = {}
        for g in (onnx.shape_inference.infer_shapes(source).graph, graph):
            for v in (*g.value_info, *g.input, *g.output):
                dims_ = v.type.tensor_type.shape.dim
                sizes = [d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, 0) for d in dims_]
                if dims_ and all(x > 0 for x in sizes):
                    known[v.name] = math.prod(sizes)
        counts = {**known, **counts}
        for node in source.graph.node:
            if node.name and node.output and node.output[0] in known:
                by_node.setdefault(node.name, known[node.output[0]])
    counts = {**by_node, **counts}
    keeping = [n for n in graph.node if n.op_type in (*QDQ_KERNELS, "Transpose", *REORDERS, "Relu", "QLinearAdd")]
    changed = True
    while changed:
        changed = False
        for node in keeping:
            a, b = node.input[0], node.output[0]
            if (a in counts) != (b in counts):
                counts[b if a in counts else a] = counts[a if a in counts else b]
                changed = True
    return counts


def _width(tensor: str, producers: dict) -> int:
    """Bytes per element of a Transpose's input: 1 where a QuantizeLinear or a quantized kernel (QLinear…, QGemm)
    wrote it, through ops that keep their input's type (a MaxPool on 8 bits, another Transpose), else 4."""
    for _ in range(len(producers)):
        producer = producers.get(tensor)
        if producer is None:
            return 4
        if producer.op_type in ("QuantizeLinear", "QGemm") or producer.op_type.startswith("QLinear"):
            return 1
        if producer.op_type not in ("Transpose", "MaxPool", "Reshape") or not producer.input:
            return 4
        tensor = producer.input[0]
    return 4
