"""The kernels OpenVINO's CPU plugin runs for a model, read from the graph it compiles on this host
(`CompiledModel.get_runtime_model()`): each executed layer names the model's nodes it was made of
(`originalLayersNames`), so the cost units' kernels are mapped onto it (docs/estimator.md, "OpenVINO's kernels").

What the plugin does that the cost units do not see: it runs a Reshape, Squeeze or Unsqueeze in place and a layer on
constants once at compile time (no kernel); it fuses an activation, a bias or a scale into the FullyConnected or
Convolution before it, a chain of elementwise ops into one JIT "Subgraph", and attention's transposes, scaling, softmax
and both matmuls into one (MHA); and it puts a Reorder into and out of its blocked layouts, which the model has no node
for (unet-m's group norms run in plain layout between blocked convs: seven reorders, 2 of its 5 ms, nearly all in the
two oneDNN runs element by element: `strided` kernels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from tapeout.core.errors import first_line
from tapeout.estimation import cost_units as kern
from tapeout.estimation import kernel_shape, strided

# layer types that run no kernel: the graph's edges, constants, and views the plugin runs in place
NOT_RUN = frozenset({"Input", "Output", "Const", "Reshape", "Squeeze", "Unsqueeze"})
FAKE_REORDER = "_fake"  # a Reorder the plugin names so changes only the layout's descriptor: it runs no kernel
KEPT = ("conv", "matmul", "recurrent", "reduce", "quantize")  # the classes a kernel the graph names nowhere is kept in


@dataclass(frozen=True)
class Layer:
    name: str
    type: str
    originals: tuple[str, ...]  # the model's nodes it was made of (empty for one the plugin made: a Reorder)
    bytes: float                # its output's size: what a Reorder reads and writes
    # the implementation it runs: a Reorder's "reorder_f32" is oneDNN's generic one, element by element; a
    # Convolution's "brgconv_avx512_f32" names the vector ISA its output channels are computed in (`lanes`)
    primitive: str = ""
    # a Reorder's (elements, lines, stride) of its strided side (strided.layout_streams) where the generic one runs
    streams: tuple[int, int, int] = (0, 1, 0)


def runtime_layers(model, config: dict) -> tuple[list[Layer], set[str]]:
    """(The layers the CPU plugin runs for `model`, an `ov.Model` compiled with `config`, in its execution order;
    every original node name its runtime graph holds, run or not)."""
    import openvino as ov

    runtime = ov.Core().compile_model(model, "CPU", config).get_runtime_model()
    constant: set[str] = set()
    layers: list[Layer] = []
    named: set[str] = set()
    for op in runtime.get_ordered_ops():
        info = op.get_rt_info()
        kind, name = info["layerType"].astype(str), op.get_friendly_name()
        originals = tuple(n for n in info["originalLayersNames"].astype(str).split(",") if n)
        named.update(originals)
        sources = [op.input_value(i).get_node().get_friendly_name() for i in range(op.get_input_size())]
        if kind == "Const" or (sources and all(s in constant for s in sources)):
            constant.add(name)  # computed once when the model compiles
            continue
        if kind in NOT_RUN or (kind == "Reorder" and name.endswith(FAKE_REORDER)):
            continue
        primitive = info["primitiveType"].astype(str) if "primitiveType" in info else ""
        layer = Layer(name, kind, originals, _output_bytes(op), primitive)
        if kind == "Reorder":
            layer = replace(layer, streams=_streams(op))
        layers.append(layer)
    return layers, named


def _streams(op) -> tuple[int, int, int]:
    """(Elements, lines, stride in bytes) of a Reorder's strided side: see `strided.layout_streams`."""
    shape = op.get_output_partial_shape(0)
    if not shape.is_static:
        return 0, 1, 0
    dims = [int(d) for d in shape.to_shape()]
    source = op.input_value(0).get_node().get_rt_info()
    layout_in = source["outputLayouts"].astype(str) if "outputLayouts" in source else ""
    layout_out = op.get_rt_info()["outputLayouts"].astype(str)
    lines, stride = strided.layout_streams(dims, layout_in, layout_out, op.get_output_element_type(0).size)
    return math.prod(dims), lines, stride


def _output_bytes(op) -> float:
    shape = op.get_output_partial_shape(0)
    if not shape.is_static:
        return 0.0
    elements = 1
    for d in shape.to_shape():
        elements *= int(d)
    return float(elements * op.get_output_element_type(0).size)


def node_kernels(view, analysis, kernels: list[kern.Kernel]) -> dict[str, str]:
    """Node name -> the name of the kernel among `kernels` that holds it (a fusion group's every node, a lone node
    itself); nodes a fusion of the cost units merged into another kernel are left out."""
    names = {k.name for k in kernels}
    out = {n.name: n.name for n in view.nodes if n.name in names}
    for group in analysis.groups:
        if group.name in names:
            out.update({n: group.name for n in group.nodes})
    # the plugin names a node that makes a model output by the output (unet's head conv is "noise" there)
    produced = {t: n.name for n in view.nodes for t in n.output if t in view.outputs}
    out.update({t: out[node] for t, node in produced.items() if node in out and t not in out})
    return out


def executed_kernels(kernels: list[kern.Kernel], node_kernel: dict[str, str], layers: list[Layer],
                     named: set[str], attention: frozenset[str] = frozenset()) -> list[kern.Kernel]:
    """The kernels the plugin runs, in its order, then those kept as they are: the cost units' kernels that one layer holds merged into one (the
    costliest's class, shape and precision; every FLOP and node; the bytes of those of its class: a fused activation's
    or softmax's pass over the tensor is not made; `attention` where an MHA subgraph holds a MatMul between two
    activations, one of `attention`), a Reorder a kernel of its own (`reorder_kernel`). Each names its layer. A
    kernel whose nodes the graph names only on layers it does not run (a view, a Transpose of a weight) is dropped.
    One it names nowhere was rebuilt under a new name: kept as it is where it computes (`KEPT`: a LayerNormalization
    the plugin runs as MVN, attention's first matmul inside its MHA subgraph, an INT8 kernel's activation
    quantization), dropped where it only moved or combined elements (a Transpose the plugin folds into a MatMul's
    layout, an Add it fuses as a post-op: on the toy ViT, 5 such kernels priced 2.3 µs that ran nowhere); a kept MatMul
    between two activations is attention's first, which an MHA subgraph absorbed unnamed."""
    by_name = {k.name: k for k in kernels}
    placed: set[str] = set()
    out: list[kern.Kernel] = []
    for layer in layers:
        if layer.type == "Reorder":
            out.append(reorder_kernel(layer))
            continue
        held = [node_kernel[n] for n in layer.originals if node_kernel.get(n) in by_name]
        held = [name for i, name in enumerate(held) if name not in placed and name not in held[:i]]
        if not held:
            continue
        placed.update(held)
        kernel = replace(merged([by_name[name] for name in held]), runs_as=layer.name)
        if layer.type == "Convolution":
            kernel = padded_conv(kernel, layer.primitive)
        mha = layer.type == "Subgraph" and attention & set(held) and kernel.cls == "matmul"
        out.append(replace(kernel, cls="attention") if mha else kernel)
    known = {node_kernel.get(n) for n in named}
    kept = [k for k in kernels if k.name not in placed and k.name not in known and k.cls in KEPT]
    return _scores_merged(out, [replace(k, cls="attention") if k.name in attention else k for k in kept])


def _scores_merged(out: list[kern.Kernel], kept: list[kern.Kernel]) -> list[kern.Kernel]:
    """`out` then `kept`, each kept attention MatMul (the scores, Q·Kᵀ, which an MHA subgraph absorbed unnamed)
    merged into the MHA kernel it belongs to: the one whose weighted sum (P·V: rows m, depth k = the keys, columns
    n = the head's width) matches its shape (rows m, depth n, columns k). One MHA subgraph is one kernel, as the
    sweep times it; one with no such partner stays as it is."""
    out, rest, taken = list(out), [], set()
    for k in kept:
        shape = dict(k.shape)
        match = next((i for i, o in enumerate(out) if k.cls == o.cls == "attention" and o.runs_as and "m" in shape
                      and i not in taken and dict(o.shape).get("m") == shape.get("m")
                      and dict(o.shape).get("k") == shape.get("n") and dict(o.shape).get("n") == shape.get("k")),
                     None)
        if match is None:
            rest.append(k)
            continue
        o = out[match]
        taken.add(match)
        out[match] = replace(o, flops=o.flops + k.flops, bytes=o.bytes + k.bytes, nodes=o.nodes + k.nodes)
    return out + rest


# output channels a vector register holds in the ISA a oneDNN primitive names: a brgemm or JIT conv computes its
# output channels a register at a time, the last one masked but as slow
_LANES = (("avx512", 16), ("amx", 16), ("avx2", 8), ("avx", 8), ("sse41", 4))


def lanes(primitive: str) -> int:
    """Output channels a register of `primitive`'s ISA holds ("brgconv_avx512_I8": 16); 1 where it names none."""
    return next((n for isa, n in _LANES if isa in primitive), 1)


def padded_conv(kernel: kern.Kernel, primitive: str) -> kern.Kernel:
    """A dense conv with the FLOPs the plugin runs: its output channels rounded up to the registers of its ISA
    (unet-m's 128 → 4 head: 651 µs, its own FLOPs' roof 167 µs, 16 channels' 670)."""
    shape = dict(kernel.shape)
    out, block = shape.get("out_channels", 0), lanes(primitive)
    if shape.get("groups", 1) != 1 or out <= 0 or out % block == 0:
        return kernel
    return replace(kernel, flops=kernel.flops * (-(-out // block) * block) // out)


def reorder_kernel(layer: Layer) -> kern.Kernel:
    """A Reorder as a kernel: one oneDNN runs element by element (`reorder_f32`, `reorder_I8`; not its JIT or brgemm
    ones) is `strided`, priced by the conflicts of its strided side (strided.py); any other moves its bytes."""
    if kern.op_class("Reorder", layer.primitive) == "strided":
        elements, lines, stride = layer.streams
        return kern.Kernel(f"Reorder {layer.name}", "strided", "fp32", 0, 2.0 * layer.bytes, 1,
                           shape=(("elements", elements), ("lines", lines), ("stride", stride)), runs_as=layer.name)
    return kern.Kernel(f"Reorder {layer.name}", "movement", "fp32", 0, 2.0 * layer.bytes, 1,
                       shape=kernel_shape.inserted_shape("movement", "Reorder"), runs_as=layer.name)


def attention_kernels(view, node_kernel: dict[str, str]) -> frozenset[str]:
    """The kernels holding a MatMul between two activations (attention's scores and their weighted sum): the plugin
    runs them in an MHA subgraph with the softmax between, or as MatMuls of their own, well under the rate of a
    FullyConnected of its weights (minilm: 180-220 µs a layer for 26 MFLOP, its FullyConnecteds near the roof)."""
    return frozenset(node_kernel[n.name] for n in view.nodes if n.op_type == "MatMul" and n.name in node_kernel
                     and not any(view.is_const(t) for t in n.input if t))


def merged(parts: list[kern.Kernel]) -> kern.Kernel:
    """One kernel of `parts`, which one layer runs: see `executed_kernels`."""
    if len(parts) == 1:
        return parts[0]
    main = max(parts, key=lambda k: (k.flops, k.bytes))
    return replace(main, flops=sum(k.flops for k in parts), nodes=sum(k.nodes for k in parts),
                   bytes=sum(k.bytes for k in parts if k.cls == main.cls))


def kernels_for(artifact: Path, exported: Path, project, options, kernels: list[kern.Kernel]
                ) -> tuple[list[kern.Kernel] | None, str | None]:
    """(The kernels OpenVINO runs for a build on this host, the estimate's note on them): its IR (`artifact`) compiled
    with the build's options (the target's, or a build dir's manifest's as a dict), mapped onto the cost units of its
    exported model (`kernels`, at the plan's precisions). No kernels for a build on another device than the CPU, where
    OpenVINO is not installed (`available`), or where it cannot compile the IR here (the note says why): the cost
    units stand."""
    from tapeout.graph.view import GraphView
    from tapeout.targets import ov as ov_target

    settings = options if isinstance(options, ov_target.Options) else ov_target.Options(**(options or {}))
    if settings.device != "CPU" or not available():
        return None, None
    import openvino as ov

    view = GraphView.load(exported, project.inputs, project.dims)
    try:  # a profile pinning shapes saved its IR pinned: read as it is, it compiles as the build's did
        found = mapped(view, kernels, ov.Core().read_model(str(artifact)), ov_target.compile_config(settings))
    except RuntimeError as exc:
        return None, (f"OpenVINO could not compile the build's IR here ({first_line(exc, 200)}): its kernels are the "
                      "cost units as they are, not the plugin's")
    reorders = sum(1 for k in found if k.name.startswith("Reorder "))
    return found, (f"OpenVINO's compiled graph on this host runs {len(found)} kernels for the model's {len(kernels)} "
                   f"cost units ({reorders} layout reorders among them; views, constant folds and fused ops run none): "
                   "each priced as one")


def mapped(view, kernels: list[kern.Kernel], model, config: dict) -> list[kern.Kernel]:
    """The kernels the plugin runs for `model` (an `ov.Model`, or a path it reads) compiled with `config`, mapped
    onto `kernels`, the cost units of `view` (its ONNX graph): `executed_kernels`. Raises RuntimeError where
    OpenVINO cannot compile it."""
    from tapeout.graph.analyze import analyze_view

    node_kernel = node_kernels(view, analyze_view(view), kernels)  # their names are the cost units' (and their
    # plan's activation quantizations', which no node holds)
    layers, named = runtime_layers(model, config)
    return executed_kernels(kernels, node_kernel, layers, named, attention_kernels(view, node_kernel))


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("openvino") is not None
