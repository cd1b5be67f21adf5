"""Method `program-bf16`: BF16 compute for the planned convolutions and Linear layers of a torch.export program, as
autocast does it: each planned op's float inputs (activation, weight, bias) are cast to bfloat16 and its output back
to float32, so everything between them (norms, softmax, residual adds, the I/O) stays FP32. Inductor folds the
weights' casts into BF16 constants when it compiles with freezing, and runs the ops on oneDNN's BF16 kernels (AVX-512
BF16, AMX). What the `x86-inductor` rule set plans at `precision = "bf16"` for `aoti`, and `gpu-inductor` for
`aoti-cuda` (the casts run on the GPU's tensor cores; the rule's `device = "cuda"` skips the CPU's BF16 check).

The plan's groups are mapped to the torch modules their nodes came from, as for the PT2E methods (`pt2e.py`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tapeout.core.errors import BadInput
from tapeout.quantize.methods.base import Method
from tapeout.quantize.methods.pt2e import quiet_export, reexport, scope, with_modules

_COMPUTE = ("linear", "conv1d", "conv2d", "conv3d", "convolution")
# the CPU features that run BF16 arithmetic natively; without them oneDNN emulates it through FP32, slower than FP32
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def _is_compute(node) -> bool:
    parts = str(node.target).split(".")  # "aten.linear.default"
    return node.op == "call_function" and len(parts) >= 2 and parts[0] == "aten" and parts[1] in _COMPUTE


def bf16_modules(program) -> set[str]:
    """The modules whose convolutions and Linear layers compute in bfloat16 in `program` (their input is BF16)."""
    import torch

    found = set()
    for node in program.graph.nodes:
        if _is_compute(node) and node.args:
            value = getattr(node.args[0], "meta", {}).get("val")
            if getattr(value, "dtype", None) == torch.bfloat16:
                found.add(scope(node) or "")
    return found


def _cast_to_bf16(module, modules: set[str]) -> int:
    """Cast the planned compute ops' float inputs to BF16 and their outputs back to FP32, in place; how many."""
    import torch

    aten, graph, done = torch.ops.aten, module.graph, 0
    for node in list(graph.nodes):
        if not _is_compute(node) or scope(node) not in modules:
            continue
        with graph.inserting_before(node):
            node.args = tuple(
                graph.call_function(aten._to_copy.default, (a,), {"dtype": torch.bfloat16})
                if getattr(getattr(a, "meta", {}).get("val"), "is_floating_point", lambda: False)()
                else a
                for a in node.args
            )
        with graph.inserting_after(node):
            back = graph.call_function(aten._to_copy.default, (node,), {"dtype": torch.float32})
        node.replace_all_uses_with(back, delete_user_cb=lambda user, back=back: user is not back)
        done += 1
    module.recompile()
    return done


class ProgramBf16(Method):
    name = "program-bf16"
    tool = "torch.export (BF16 casts around the planned ops)"
    model_suffix = ".pt2"
    precisions = frozenset({"bf16"})
    fixed_why = "{precision} on a torch.export program is a float cast around the planned ops, not a quantizer"

    def plan(self, draft, rule, analysis, settings, isa):
        if rule.options.get("device") == "cuda":  # the GPU's tensor cores run it; the host CPU is not asked
            return replace(
                draft,
                groups=with_modules(draft, analysis),
                notes=(f"BF16 compute for the planned convs and Linear layers, FP32 between them ({rule.why})",),
            )
        if not isa.flags & BF16_FLAGS:
            raise BadInput(
                f"BF16 needs a CPU with BF16 arithmetic (AVX-512 BF16, AMX or Arm BF16), and {isa.origin} "
                f"has none ({isa.arch}): oneDNN would emulate it through FP32, slower than FP32",
                fix='use precision = "fp32" (or "int8") here, or name a device spec whose CPU has it',
            )
        flags = ", ".join(sorted(isa.flags & BF16_FLAGS))
        return replace(
            draft,
            groups=with_modules(draft, analysis),
            notes=(
                f"BF16 compute for the planned convs and Linear layers, FP32 between them ({rule.why}); "
                f"instruction set from {isa.origin}: {flags}",
            ),
        )

    def apply(self, plan, model_in: Path, model_out: Path, calibration) -> dict:
        import torch

        from tapeout.core import pt2

        modules = {m for g in plan.groups if g.precision == "bf16" for m in g.modules}
        program = pt2.load(model_in)
        module = program.module()
        with quiet_export(), torch.no_grad():
            cast = _cast_to_bf16(module, modules)
            reexport(module, program.example_inputs[0], model_out)
        return {
            "method": self.name,
            "groups": sum(g.precision == "bf16" for g in plan.groups),
            "ops": cast,
            "io": "float32 (each planned op casts in and out)",
        }

    def postcondition(self, plan, model_in: Path, model_out: Path) -> None:
        from tapeout.core import pt2

        done = bf16_modules(pt2.load(model_out))
        missed = [g.group for g in plan.groups if g.precision == "bf16" and not set(g.modules) & done]
        if missed:
            more = f" and {len(missed) - 1} more" if len(missed) > 1 else ""
            raise BadInput(
                f"the planned BF16 group {missed[0]}{more} has no convolution or Linear layer computing in "
                "BF16 in the program",
                fix=f'keep it float with [quantization] keep_float = ["{missed[0]}"]',
            )
