"""Methods `pt2e-x86-inductor` and `pt2e-x86-inductor-dynamic`: INT8 of the torch.export program for AOTInductor
on x86 CPUs, by PT2E (`pt2e.py`) with torchao's X86InductorQuantizer, whose patterns Inductor lowers to oneDNN's
integer kernels (qconv, qlinear) when it compiles with freezing (targets/aoti.py checks that it did). Weights int8,
symmetric, per output channel (the recipe has no per-tensor weights); activations uint8, either calibrated per
tensor with a histogram observer (static: convs and Linear layers integer) or quantized at run time (dynamic: the
Linear layers). The quantizer is confined to the plan's modules by its module-name configs.
"""

from __future__ import annotations

from dataclasses import replace

from tapeout.core.errors import BadInput
from tapeout.quantize.methods.pt2e import Pt2eMethod


class Pt2eX86Inductor(Pt2eMethod):
    name = "pt2e-x86-inductor"
    tool = "PT2E (torchao's X86InductorQuantizer)"
    quantizer_name = "Inductor's x86 quantizer"
    kernels = "oneDNN's u8 × s8 kernels"
    activations = "uint8"
    fixed_why = "AOTInductor programs are quantized in PT2E by Inductor's x86 quantizer"

    def plan(self, draft, rule, analysis, settings, isa):
        if settings.per_channel is False:
            raise BadInput(
                "Inductor's x86 INT8 recipe quantizes weights per output channel only, and the profile asks "
                "for per-tensor weights",
                fix="drop [quantization] per_channel = false for this target",
            )
        if isa.arch != "x86_64":
            raise BadInput(
                f"Inductor's x86 INT8 recipe lowers to oneDNN's x86 kernels, and this build's CPU is "
                f"{isa.arch} ({isa.origin})",
                fix='use precision = "fp32" for aoti on this CPU, or the '
                "executorch target's INT8 (XNNPACK runs on Arm)",
            )
        plan = super().plan(draft, rule, analysis, settings, isa)
        # u8 × s8 pair sums saturate in the pre-VNNI instruction (vpmaddubsw): 7-bit activations there, as the
        # recipe advises; the package is compiled for the building CPU's ISA, so the host's flags are the device's
        reduce = isa.arch == "x86_64" and not isa.vnni
        note = f"instruction set from {isa.origin} ({isa.arch}{', VNNI' if isa.vnni else ''}): " + (
            "7-bit activations (reduce_range), pre-VNNI" if reduce else "8-bit activations"
        )
        return replace(plan, per_channel=True, reduce_range=reduce, notes=(*plan.notes, note))

    def quantizer(self, plan, modules):
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

        config = x86.get_default_x86_inductor_quantization_config(
            is_dynamic=self.dynamic, reduce_range=plan.reduce_range
        )
        quantizer = x86.X86InductorQuantizer()
        # a pattern is annotated where all its nodes come from one named module: a conv followed by a ReLU module
        # (nn.Sequential) is quantized as the conv alone, and the ReLU runs in float after it
        for module in sorted(modules):
            quantizer.set_module_name_qconfig(module, config)
        return quantizer


class Pt2eX86InductorDynamic(Pt2eX86Inductor):
    name = "pt2e-x86-inductor-dynamic"
    kernels = "oneDNN's u8 × s8 kernels, a scale per tensor per call"
    dynamic = True
