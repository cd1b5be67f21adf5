"""Quantization methods, one module each, found by name: built in (the table below) and from plug-ins (entry-point
group `tapeout.quantization_methods`, each naming a Method subclass). The rule tables name a method per
family × target × precision; a profile may name another where that one stands in for the rule's.

Adding a method = one module with one `Method` subclass, one entry, and its tests.
"""

from __future__ import annotations

import functools
import importlib

from tapeout.core import plugins
from tapeout.core.errors import BadInput

BUILT_IN = {
    "dynamic": "tapeout.quantize.methods.dynamic:Dynamic",
    "static": "tapeout.quantize.methods.static:Static",
    "weight-only": "tapeout.quantize.methods.weight_only:WeightOnly",
    "npu-static": "tapeout.quantize.methods.npu_static:NpuStatic",
    "float16": "tapeout.quantize.methods.float16:Float16",
    "nncf": "tapeout.quantize.methods.nncf_int8:NncfInt8",
    "nncf-weights": "tapeout.quantize.methods.nncf_weights:NncfWeights",
    "modelopt": "tapeout.quantize.methods.modelopt:ModelOpt",
    "pt2e-xnnpack": "tapeout.quantize.methods.pt2e_xnnpack:Pt2eXnnpack",
    "pt2e-xnnpack-dynamic": "tapeout.quantize.methods.pt2e_xnnpack:Pt2eXnnpackDynamic",
    "pt2e-x86-inductor": "tapeout.quantize.methods.pt2e_x86_inductor:Pt2eX86Inductor",
    "pt2e-x86-inductor-dynamic": "tapeout.quantize.methods.pt2e_x86_inductor:Pt2eX86InductorDynamic",
    "program-bf16": "tapeout.quantize.methods.bf16_program:ProgramBf16",
}
GROUP = "tapeout.quantization_methods"


def names() -> list[str]:
    return [*BUILT_IN, *sorted(set(plugins.entries(GROUP)) - set(BUILT_IN))]


@functools.cache
def get(name: str):
    """The method registered as `name` (an instance: methods hold no state)."""
    from tapeout.quantize.methods.base import Method

    if name in BUILT_IN:
        module, _, attr = BUILT_IN[name].partition(":")
        return getattr(importlib.import_module(module), attr)()
    if name in plugins.entries(GROUP):
        found = plugins.load(GROUP, name)
        if not (isinstance(found, type) and issubclass(found, Method)):
            raise BadInput(
                f"the quantization method plug-in '{name}' names {found!r}, not a Method subclass",
                fix="point its entry point at the method class",
            )
        return found()
    raise BadInput(f"unknown quantization method '{name}'", fix=f"use one of: auto, {', '.join(names())}")
