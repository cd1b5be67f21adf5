"""What a build's runtime runs beside the cost units' kernels, read from its own graph (docs/estimator.md, "Sweeps
and kernel predictors"): the nodes ONNX Runtime's optimized graph runs (each beyond the kernels a dispatch), the
layout reorders it inserts around its blocked convs, and a static QDQ build's Q, DQ and NHWC Transposes."""

from __future__ import annotations

from pathlib import Path

from tapeout.estimation import cost_units as kern
from tapeout.estimation import kernel_shape, runtime_kernels


def counts_executed(target: str, precision: str, main_file: str) -> bool:
    """Whether the artifact is a graph whose nodes `executed_nodes` counts: an FP32 `onnxruntime` build's ONNX, which
    is the graph as ONNX Runtime's own optimizer left it (fusions made, a Reshape put on each side of a Gemm it fused
    from a MatMul and an Add on a 3-D activation)."""
    return target == "onnxruntime" and precision == "fp32" and main_file.endswith(".onnx")


def executed_nodes(target: str, precision: str, artifact: Path | None, graph=None) -> int | None:
    """How many nodes ONNX Runtime runs for such a build (`counts_executed`), which the kernel predictors read beside
    the cost units; None for any other build. `graph`: the artifact's, where the caller has loaded it already."""
    if artifact is None or not counts_executed(target, precision, artifact.name):
        return None
    return runtime_kernels.node_count(graph if graph is not None else _artifact_graph(artifact))


def _artifact_graph(artifact: Path):
    import onnx

    return onnx.load(str(artifact), load_external_data=False).graph


def reorder_kernels(reorders: list[tuple[str, str, int]]) -> list[kern.Kernel]:
    """Each layout reorder (op type, tensor, bytes of the plain tensor) as a movement kernel reading and writing it."""
    return [kern.Kernel(f"{op} {tensor}", "movement", "fp32", 0, 2.0 * size, 1,
                        shape=kernel_shape.inserted_shape("movement", op)) for op, tensor, size in reorders]


def dynamic_quantized(target: str, plan: dict | None, main_file: str) -> bool:
    """Whether the build is a dynamically quantized model run by ONNX Runtime (a transformer's or an LSTM's
    cpu-int8), whose nodes are counted from the graph ONNX Runtime optimizes it into on this host (the artifact is the
    quantized model, not that graph): a DynamicQuantizeLinear whose output three MatMuls read runs apart, and each
    of them as a MatMulIntegerToFloat (a toy ViT's attention input: four nodes the cost units count one kernel)."""
    return target == "onnxruntime" and bool(plan) and plan.get("method") == "dynamic" and main_file.endswith(".onnx")


def static_quantized(target: str, plan: dict | None, main_file: str) -> bool:
    """Whether the build is a static QDQ model run by ONNX Runtime, whose graph says which activation quantizations
    and layout Transposes run around its quantized kernels (`quantized_kernels`)."""
    return target == "onnxruntime" and bool(plan) and plan.get("method") == "static" and main_file.endswith(".onnx")


def quantized_kernels(artifact: Path, float_model: Path | None, dims: dict[str, int]
                      ) -> tuple[int, list[kern.Kernel], set[str]]:
    """(The nodes ONNX Runtime runs for a static QDQ build, and the kernels among them no cost unit holds): each
    QuantizeLinear and DequantizeLinear left after its QDQ fusions, a `quantize` kernel reading 4 bytes an element
    and writing 1 (or the reverse), as the sweep times one; each Transpose into or out of its NHWC QLinearConvs and
    each layout reorder, a movement kernel reading and writing its tensor (`runtime_kernels.quantized_graph`); and the
    pooling nodes it runs on 8-bit tensors."""
    executed, found, eight_bit = runtime_kernels.quantized_graph(artifact, dims, float_model)
    return executed, [kern.Kernel(f"{op} {tensor}", "quantize", "fp32", count, 5.0 * count, 1,
                                  shape=kernel_shape.inserted_shape("quantize", op))
                      if op in runtime_kernels.QDQ_KERNELS else
                      kern.Kernel(f"{op} {tensor}", "movement", "fp32", 0, 2.0 * count * width, 1,
                                  shape=kernel_shape.inserted_shape("movement", op))
                      for op, tensor, count, width in found], eight_bit


def at_eight_bits(kernels: list[kern.Kernel], pools: set[str]) -> list[kern.Kernel]:
    """`kernels` with the pooling kernels ONNX Runtime runs on 8-bit tensors (`pools`, by node name) at INT8: their
    bytes a quarter, their class `reduce@int8` (for a static plan, the sweep's `reduce@int8~static`: such a MaxPool
    timed as a uint8 model)."""
    plan = {"groups": [{"nodes": sorted(pools), "precision": "int8"}]}
    return [kern.at_precision([k], plan, "fp32")[0] if k.cls == "reduce" and k.lead in pools else k for k in kernels]


def runtime_graph(target: str, precision: str, plan: dict | None, artifact: Path | None, float_model: Path | None,
                  kernels: list[kern.Kernel], dims: dict[str, int]
                  ) -> tuple[list[kern.Kernel], int | None, list[kern.Kernel]]:
    """(The kernels to price, the nodes the runtime runs, the kernels it adds) as the build's runtime graph says: an
    FP32 ONNX Runtime artifact's nodes and the layout reorders around its blocked convs, less the Adds and
    activations those convs run inside themselves (`runtime_kernels.folded_into_convs`); a static QDQ build's Q, DQ
    and Transposes from the graph ONNX Runtime optimizes, in place of the cost units' one activation quantization per
    quantized kernel (its graph, not the units, says which activations are quantized where). Any other build: its
    kernels as they are."""
    if artifact is None:
        return kernels, None, []
    if static_quantized(target, plan, artifact.name):
        executed, inserted, pools = quantized_kernels(artifact, float_model, dims)
        kept = at_eight_bits([k for k in kernels if kern.quantized_kernel(k) is None], pools)
        return [*kept, *inserted], executed, inserted
    if dynamic_quantized(target, plan, artifact.name):
        graph = runtime_kernels.optimized_graph(artifact)
        executed = runtime_kernels.node_count(graph)
        inserted = reorder_kernels(runtime_kernels.reorders_in(graph, dims))
        kernels, executed = with_inserted(kernels, executed, inserted)
        return kernels, executed, inserted
    if not counts_executed(target, precision, artifact.name):
        return kernels, None, []
    model = _artifact_graph(artifact)  # read once: counted here, and asked below which nodes the convs fold in
    executed = executed_nodes(target, precision, artifact, model)
    if executed is None or not any(k.cls == "conv" for k in kernels):
        return kernels, executed, []
    graph = runtime_kernels.optimized_graph(artifact)
    inserted = reorder_kernels(runtime_kernels.reorders_in(graph, dims))
    # the Adds and activations a blocked conv runs inside itself: no kernel, and not among the nodes it runs
    folded = runtime_kernels.folded_into_convs(model, graph)
    kept = [k for k in kernels if not (k.cls == "elementwise" and k.nodes == 1 and k.name in folded)]
    kernels, executed = with_inserted(kept, executed - (len(kernels) - len(kept)), inserted)
    return kernels, executed, inserted


def with_inserted(kernels: list[kern.Kernel], executed: int | None, inserted: list[kern.Kernel]
                  ) -> tuple[list[kern.Kernel], int | None]:
    """The kernels to price and the nodes the runtime runs, with the kernels it inserts among both."""
    return [*kernels, *inserted], (executed + len(inserted) if executed is not None else None)
