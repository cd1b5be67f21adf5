"""Chains of ONNX nodes that every runtime here runs as one kernel (an RMSNorm written out, SiLU, GELU's tanh form,
a MatMul's scale, add + norm), recognized in the graph so the estimator prices the kernels a runtime runs, not the
nodes it was exported as. `cost_units.structure` applies them to its kernels.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tapeout.graph.view import GraphView

if TYPE_CHECKING:
    from tapeout.estimation.cost_units import Kernel

NORM_OPS = {"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization"}


def runtime_fused(view: GraphView, kernels: list[Kernel]) -> list[Kernel]:
    """`kernels` with each chain a runtime fuses made one kernel."""
    kernels = _gelu_tanh_fused(view, _silu_fused(view, _rms_norm_fused(view, kernels)))
    return _add_norm_fused(view, _matmul_scale_fused(view, kernels))


def _only_reader(view: GraphView, tensor: str, *op_types: str):
    readers = view.consumers.get(tensor, [])
    return readers[0] if len(readers) == 1 and readers[0].op_type in op_types and tensor not in view.outputs else None


def _rms_norm_chain(view: GraphView, divide) -> list | None:
    """The nodes of an RMSNorm ending in `divide`, Div(x, Sqrt(Add(ReduceMean(Pow(x, 2) or Mul(x, x)), eps))),
    with the Mul by its weight after it where there is one; None if `divide` is not such a norm."""
    if divide.op_type != "Div" or len(divide.input) != 2:
        return None
    x = divide.input[0]
    sqrt = view.producer.get(divide.input[1])
    add = view.producer.get(sqrt.input[0]) if sqrt is not None and sqrt.op_type == "Sqrt" else None
    mean = (
        next((p for p in map(view.producer.get, add.input) if p is not None and p.op_type == "ReduceMean"), None)
        if add is not None and add.op_type == "Add"
        else None
    )  # eps may be a Constant node's output
    square = view.producer.get(mean.input[0]) if mean is not None else None
    if square is None or not (
        (square.op_type == "Pow" and square.input[0] == x) or (square.op_type == "Mul" and list(square.input) == [x, x])
    ):
        return None
    chain = [square, mean, add, sqrt, divide]
    if any(_only_reader(view, n.output[0], "ReduceMean", "Add", "Sqrt", "Div") is None for n in chain[:-1]):
        return None
    scale = _only_reader(view, divide.output[0], "Mul")
    if scale is not None and any(view.is_const(i) for i in scale.input):
        chain.append(scale)
    return chain


def _rms_norm_fused(view: GraphView, kernels: list[Kernel]) -> list[Kernel]:
    """An RMSNorm written out (Pow → ReduceMean → Add → Sqrt → Div → Mul by its weight, as tiny-lm, Llama and Qwen
    export after the `rms-norm-division` pass) runs as one kernel on every runtime here: ONNX Runtime's
    SimplifiedLayerNormalization, OpenVINO's RMS, TensorRT's normalization. Priced as six kernels, each paying its
    dispatch, a decode step of tiny-lm was predicted 26 % slow (bench/estimator.py --workloads). One reduce kernel:
    x read and the result written once, the weight read."""
    index = {k.name: i for i, k in enumerate(kernels)}
    fused: dict[int, Kernel] = {}
    dropped: set[int] = set()
    for node in view.nodes:
        chain = _rms_norm_chain(view, node) if node.op_type == "Div" else None
        if chain is None or not all(n.name in index for n in chain):
            continue
        x, out = chain[0].input[0], chain[-1].output[0]
        elements = view.size(x) or 0
        weight = next((view.size(i) or 0 for i in chain[-1].input if view.is_const(i)), 0) if len(chain) == 6 else 0
        parts = [kernels[index[n.name]] for n in chain]
        fused[index[chain[-1].name]] = replace(
            parts[-1],
            name=chain[-1].name,
            cls="reduce",
            precision="fp32",
            flops=sum(k.flops for k in parts),
            bytes=float(elements * view.elem_bytes(x) + weight * 4 + (view.size(out) or 0) * view.elem_bytes(out)),
            nodes=sum(k.nodes for k in parts),
            launches=1,
            lead=chain[-1].name,
            quantized_input=0,
            reread=0.0,
            weights=0.0,
        )
        dropped.update(index[n.name] for n in chain[:-1])
    return _replaced(kernels, fused, dropped)


def _silu_fused(view: GraphView, kernels: list[Kernel]) -> list[Kernel]:
    """x · Sigmoid(x) (SiLU, as torch exports it) runs as one kernel on every runtime here (ONNX Runtime's
    QuickGelu, OpenVINO's Swish): x read and the result written once."""
    index = {k.name: i for i, k in enumerate(kernels)}
    fused: dict[int, Kernel] = {}
    dropped: set[int] = set()
    for node in view.nodes:
        if node.op_type != "Sigmoid" or node.name not in index:
            continue
        mul = _only_reader(view, node.output[0], "Mul")
        if mul is None or mul.name not in index or sorted(mul.input) != sorted([node.input[0], node.output[0]]):
            continue
        x, out = node.input[0], mul.output[0]
        parts = [kernels[index[node.name]], kernels[index[mul.name]]]
        fused[index[mul.name]] = replace(
            parts[1],
            flops=sum(k.flops for k in parts),
            nodes=sum(k.nodes for k in parts),
            weights=0.0,
            bytes=float((view.size(x) or 0) * view.elem_bytes(x) + (view.size(out) or 0) * view.elem_bytes(out)),
        )
        dropped.add(index[node.name])
    return _replaced(kernels, fused, dropped)


def _replaced(kernels: list[Kernel], fused: dict[int, Kernel], dropped: set[int]) -> list[Kernel]:
    """`kernels` with the fused kernels in place of the ones at their index and the dropped ones gone."""
    return [fused.get(i, k) for i, k in enumerate(kernels) if i not in dropped]


def _const_mul_input(view: GraphView, node) -> str | None:
    """The other input of a Mul by a constant; None for anything else."""
    if node is None or node.op_type != "Mul" or len(node.input) != 2:
        return None
    a, b = node.input
    return a if view.is_const(b) else b if view.is_const(a) else None


def _gelu_tanh_chain(view: GraphView, tanh) -> list | None:
    """The nodes of a tanh GELU around `tanh`, 0.5 · x · (1 + Tanh(c · (x + 0.044715 · Pow(x, 3)))), as GPT-2's
    NewGELU exports (with the 0.5 on x or on the product); None if it is not one."""
    inner = view.producer.get(_const_mul_input(view, view.producer.get(tanh.input[0])) or "")
    if inner is None or inner.op_type != "Add" or len(inner.input) != 2:
        return None
    scale = view.producer[tanh.input[0]]
    for x, cubic in (inner.input, tuple(reversed(inner.input))):
        cube_scale = view.producer.get(cubic)
        power = view.producer.get(_const_mul_input(view, cube_scale) or "")
        if power is not None and power.op_type == "Pow" and power.input[0] == x:
            break
    else:
        return None
    one = _only_reader(view, tanh.output[0], "Add")
    product = _only_reader(view, one.output[0], "Mul") if one is not None else None
    if product is None or not any(view.is_const(i) for i in one.input):
        return None
    other = next(i for i in product.input if i != one.output[0])
    half = view.producer.get(other)
    if other == x:  # x · (1 + tanh), then · 0.5
        last = _only_reader(view, product.output[0], "Mul")
        if _const_mul_input(view, last) != product.output[0]:
            return None
        chain = [power, cube_scale, inner, scale, tanh, one, product, last]
    elif _const_mul_input(view, half) == x:  # (0.5 · x) · (1 + tanh)
        chain = [power, cube_scale, inner, scale, tanh, one, half, product]
    else:
        return None
    inside = {n.name for n in chain}
    if any(c.name not in inside for n in chain[:-1] for c in view.consumers.get(n.output[0], [])):
        return None  # a part read from outside the GELU: it is not one kernel
    return chain


def _gelu_tanh_fused(view: GraphView, kernels: list[Kernel]) -> list[Kernel]:
    """A tanh GELU written out (eight nodes: GPT-2's MLP) runs as one kernel on ONNX Runtime (FastGelu) and
    OpenVINO (Gelu, or one eltwise subgraph): x read and the result written once. Priced as eight kernels, GPT-2's
    elementwise time was predicted at 3× what the profiler recorded."""
    index = {k.name: i for i, k in enumerate(kernels)}
    fused: dict[int, Kernel] = {}
    dropped: set[int] = set()
    for node in view.nodes:
        chain = _gelu_tanh_chain(view, node) if node.op_type == "Tanh" else None
        if chain is None or not all(n.name in index for n in chain):
            continue
        x, out = chain[0].input[0], chain[-1].output[0]
        parts = [kernels[index[n.name]] for n in chain]
        fused[index[chain[-1].name]] = replace(
            parts[-1],
            flops=sum(k.flops for k in parts),
            nodes=sum(k.nodes for k in parts),
            weights=0.0,
            bytes=float((view.size(x) or 0) * view.elem_bytes(x) + (view.size(out) or 0) * view.elem_bytes(out)),
        )
        dropped.update(index[n.name] for n in chain[:-1])
    return _replaced(kernels, fused, dropped)


def _scaled_input(view: GraphView, node) -> str | None:
    """The tensor `node` multiplies by a scalar constant (or divides by one); None for anything else."""
    if node is None or node.op_type not in ("Mul", "Div") or len(node.input) != 2:
        return None
    a, b = node.input
    if view.is_const(b) and (view.size(b) or 0) == 1:
        return a
    if node.op_type == "Mul" and view.is_const(a) and (view.size(a) or 0) == 1:
        return b
    return None


def _matmul_scale_fused(view: GraphView, kernels: list[Kernel]) -> list[Kernel]:
    """A Mul or Div by a scalar constant on a MatMul's output, or on an input only that MatMul reads (attention's
    1/√d on the scores or on q), runs inside the MatMul on ONNX Runtime (MatMulScaleFusion: FusedMatMul with its
    alpha): no pass of its own over the tensor. MiniLM's six score scalings were priced at 46 µs each apart."""
    index = {k.name: i for i, k in enumerate(kernels)}
    fused: dict[int, Kernel] = {}
    dropped: set[int] = set()
    for node in view.nodes:
        if node.op_type != "MatMul" or node.name not in index or index[node.name] in fused:
            continue
        scales = []
        after = _only_reader(view, node.output[0], "Mul", "Div")
        if after is not None and after.name in index and _scaled_input(view, after) == node.output[0]:
            scales.append(after)
        for tensor in node.input:
            before = view.producer.get(tensor)
            reader = _only_reader(view, tensor, "MatMul")
            if (
                before is not None
                and before.name in index
                and reader is not None
                and reader.name == node.name
                and _scaled_input(view, before) is not None
            ):
                scales.append(before)
        if not scales or any(index[s.name] in fused or index[s.name] in dropped for s in scales):
            continue
        matmul = kernels[index[node.name]]
        parts = [kernels[index[s.name]] for s in scales]
        fused[index[node.name]] = replace(
            matmul, flops=matmul.flops + sum(k.flops for k in parts), nodes=matmul.nodes + sum(k.nodes for k in parts)
        )
        dropped.update(index[s.name] for s in scales)
    return _replaced(kernels, fused, dropped)


def _add_norm_fused(view: GraphView, kernels: list[Kernel]) -> list[Kernel]:
    """A residual Add feeding a LayerNormalization and nothing else (a post-norm block: BERT, MiniLM) runs as one
    kernel on ONNX Runtime (SkipLayerNormalization): the sum is never written. Where the sum is read again (a pre-norm
    block's next residual: GPT-2, ViT, Whisper) or is an output, ONNX Runtime 1.32 runs the Add and the norm apart,
    and so does OpenVINO 2026.4 in both cases (an eltwise subgraph, then MVN): they stay two kernels."""
    index = {k.name: i for i, k in enumerate(kernels)}
    fused: dict[int, Kernel] = {}
    dropped: set[int] = set()
    for node in view.nodes:
        if node.op_type not in NORM_OPS or node.name not in index or not node.input:
            continue
        add = view.producer.get(node.input[0])
        if add is None or add.op_type != "Add" or add.name not in index:
            continue
        norm_k, add_k = kernels[index[node.name]], kernels[index[add.name]]
        total = node.input[0]
        if total in view.outputs or any(c.name != node.name for c in view.consumers.get(total, [])):
            continue
        between = (view.size(total) or 0) * view.elem_bytes(total)  # written by the Add, read by the norm
        moved = add_k.bytes + norm_k.bytes - 2 * between
        fused[index[node.name]] = replace(
            norm_k, flops=norm_k.flops + add_k.flops, bytes=max(moved, 0), nodes=norm_k.nodes + add_k.nodes
        )
        dropped.add(index[add.name])
    return _replaced(kernels, fused, dropped)
