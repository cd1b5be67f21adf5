"""Graph passes, one module each, found by name: built in (the table below) and from plug-ins (entry-point
group `tapeout.graph_passes`, each naming a GraphPass subclass). A pass at the "export" stage runs on every
torch export; a pass at the "source" stage on every ONNX source's copy; a pass at the "method" stage runs where a
quantization method names it; a pass at the "target" stage where a target's compile names it.

Adding a pass = one module with one `GraphPass` subclass, one entry, and its tests.
"""

from __future__ import annotations

import importlib

from tapeout.core import plugins
from tapeout.core.errors import BadInput

# name -> (class, stage): the stage is data, so finding the export stage's passes imports none of the others
BUILT_IN = {
    "fold-recurrent-weights": ("tapeout.quantize.passes.fold_recurrent:FoldRecurrentWeights", "export"),
    "grouped-attention": ("tapeout.quantize.passes.grouped_attention:GroupedAttention", "export"),
    "rms-norm-division": ("tapeout.quantize.passes.rms_norm_division:RmsNormDivision", "export"),
    "fold-known-if": ("tapeout.quantize.passes.fold_known_if:FoldKnownIf", "source"),
    "group-query-attention": ("tapeout.quantize.passes.group_query_attention:GroupQueryAttention", "target"),
    "share-kv-buffer": ("tapeout.quantize.passes.share_kv_buffer:ShareKvBuffer", "target"),
    "pack-projections": ("tapeout.quantize.passes.pack_projections:PackProjections", "target"),
    "gemm-as-matmul": ("tapeout.quantize.passes.gemm_as_matmul:GemmAsMatMul", "method"),
    "localize-body-weights": ("tapeout.quantize.passes.localize_body_weights:LocalizeBodyWeights", "method"),
    "merge-repeated-casts": ("tapeout.quantize.passes.merge_casts:MergeRepeatedCasts", "method"),
    "untie-transposed-weight": ("tapeout.quantize.passes.untie_transposed_weight:UntieTransposedWeight", "method"),
}
GROUP = "tapeout.graph_passes"


def names() -> list[str]:
    return [*BUILT_IN, *sorted(set(plugins.entries(GROUP)) - set(BUILT_IN))]


def get(name: str) -> type:
    """The pass class registered as `name`."""
    if name in BUILT_IN:
        module, _, attr = BUILT_IN[name][0].partition(":")
        return getattr(importlib.import_module(module), attr)
    if name in plugins.entries(GROUP):
        found = plugins.load(GROUP, name)
        from tapeout.quantize.passes.base import GraphPass

        if not (isinstance(found, type) and issubclass(found, GraphPass)):
            raise BadInput(
                f"the graph pass plug-in '{name}' names {found!r}, not a GraphPass subclass",
                fix="point its entry point at the pass class",
            )
        return found
    raise BadInput(f"unknown graph pass '{name}'", fix=f"use one of: {', '.join(names())}")


def source_passes(inputs: list, dims: dict[str, int]) -> list:
    """A fresh instance of every source-stage pass (built in, then plug-ins), made from the project's inputs and dims."""
    built_in = [get(name) for name, (_, at) in BUILT_IN.items() if at == "source"]
    plugged = [cls for cls in (get(name) for name in names() if name not in BUILT_IN) if cls.stage == "source"]
    return [cls(inputs, dims) for cls in (*built_in, *plugged)]


def export_passes() -> list:
    """A fresh instance of every export-stage pass: the built-in ones first, then the plug-ins by name. (A
    method-stage pass is made by the method that names it, with what it needs from the plan.)"""
    built_in = [get(name) for name, (_, at) in BUILT_IN.items() if at == "export"]
    plugged = [cls for cls in (get(name) for name in names() if name not in BUILT_IN) if cls.stage == "export"]
    return [cls() for cls in (*built_in, *plugged)]
