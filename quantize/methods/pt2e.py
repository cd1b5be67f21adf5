"""What the PT2E methods share: INT8 of the torch.export program by torchao's prepare_pt2e / convert_pt2e with a
backend's quantizer (XNNPACK's for ExecuTorch, `pt2e_xnnpack.py`; Inductor's x86 one for AOTInductor,
`pt2e_x86_inductor.py`). Weights are int8, symmetric, per output channel; activations int8, either calibrated per
tensor on the project's data (static) or quantized at run time (dynamic).

The plan's groups are ONNX nodes; the program is torch's. Each group is mapped to the torch modules its nodes came
from (the exporter's name scopes, `Analysis.scopes`: `features.2`, `inner.encoder.layer.0.attention.self.query`),
and the backend's quantizer is confined to exactly those modules, so it annotates nothing the plan did not name. A
group no module maps to (its nodes made by a graph pass) stays float, saying so. The quantized program is written
with torch.export.save and read back by the safe reader (`core/pt2.py`).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import warnings
from abc import abstractmethod
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

from tapeout.core.errors import BadInput
from tapeout.quantize.methods.base import Method
from tapeout.quantize.plan import FLOAT

_UNMAPPED = (
    "no torch module maps to its nodes (a graph pass made them): PT2E quantizes the torch program by "
    "module, and cannot name it"
)
_WEIGHTED = ("conv1d", "conv2d", "conv3d", "convolution", "linear", "conv_transpose1d", "conv_transpose2d")


def scope(node) -> str | None:
    """The innermost torch module an FX node was traced in, as its fully qualified name."""
    stack = node.meta.get("nn_module_stack")
    return list(stack.values())[-1][0] if stack else None


def int8_modules(program) -> set[str]:
    """The modules whose convolutions and Linear layers read int8 weights in `program` (their weight comes through a
    dequantize op from a constant): what the quantizer really quantized."""
    found = set()
    for node in program.graph.nodes:
        parts = str(node.target).split(".")  # "aten.conv2d.default"
        if node.op != "call_function" or len(parts) < 2 or parts[1] not in _WEIGHTED or len(node.args) < 2:
            continue
        weight = node.args[1]
        if getattr(weight, "op", None) == "call_function" and "dequantize" in str(weight.target):
            found.add(scope(node) or "")
    return found


def _without_unused_weights(module):
    """`module` without the float weights its graph no longer reads: convert_pt2e folds each quantized weight into an
    int8 constant but leaves the float parameter on its module, and a re-export would carry both."""
    used = {n.target for n in module.graph.nodes if n.op == "get_attr"}
    for name, _ in [*module.named_parameters(), *module.named_buffers()]:
        if name not in used:
            owner, _, attr = name.rpartition(".")
            delattr(module.get_submodule(owner), attr)
    return module


@contextlib.contextmanager
def quiet_export():
    """torch.export's notes on dims it specialised (Dim.AUTO) and the quantizer's warnings: off the terminal."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def with_modules(draft, analysis) -> tuple:
    """The draft plan's groups, each with the torch modules its nodes came from; a group no module maps to stays
    float, saying why. Refused where nothing is left to change (no scopes: not a torch.export source's graph)."""
    nodes = {g.name: g.nodes for g in analysis.groups}
    groups = []
    for g in draft.groups:
        # every node of the fusion group (its activation too, so conv + ReLU is annotated as one pattern);
        # the root module ("") would name the whole model
        members = nodes.get(g.group, g.nodes)
        mapped = all(n in analysis.scopes for n in g.nodes)
        modules = tuple(sorted({analysis.scopes[n] for n in members if n in analysis.scopes} - {""})) if mapped else ()
        if g.precision != FLOAT and not modules:
            g = replace(g, precision=FLOAT, reason=_UNMAPPED)
        groups.append(replace(g, modules=modules))
    if not any(g.precision != FLOAT for g in groups):
        raise BadInput(
            f"the {draft.family} rule found nothing to quantize in this model's torch program (roles: "
            f"{', '.join(sorted({g.role for g in analysis.groups})) or 'none'})",
            fix='use precision = "fp32", or check `tapeout analyze` for the roles found',
        )
    return tuple(groups)


def reexport(module, example, path: Path) -> None:
    """`module` exported again with the program's dims as they were (Dim.AUTO keeps what the graph leaves dynamic,
    specialises the rest) and saved at `path`."""
    import torch

    auto = tuple({i: torch.export.Dim.AUTO for i in range(t.ndim)} for t in example)
    torch.export.save(torch.export.export(module, example, dynamic_shapes=auto), str(path))


class Pt2eMethod(Method):
    """A PT2E method: the plan mapped to modules, the backend's quantizer confined to them, prepare → calibrate (or
    one run, dynamic) → convert → re-export, and a check that every planned group reads int8 weights."""

    model_suffix = ".pt2"
    quantizer_name: ClassVar[str]  # "XNNPACK's quantizer": the plan's notes and error lines name it
    dynamic: ClassVar[bool] = False  # activations quantized at run time (no calibration)
    kernels: ClassVar[str] = ""  # the backend's kernels for the activations' format, for the plan's notes
    activations: ClassVar[str] = "int8"  # the activations' integer type (the weights' is int8)

    @abstractmethod
    def quantizer(self, plan, modules: set[str]):
        """The backend's quantizer for `plan`, annotating only `modules` (and the constants their ops read)."""

    def plan(self, draft, rule, analysis, settings, isa):
        groups = with_modules(draft, analysis)
        activations = (
            f"{self.activations}, quantized at run time ({self.kernels})"
            if self.dynamic
            else f"{self.activations} per tensor, calibrated with a histogram observer ({self.kernels})"
        )
        return replace(
            draft,
            groups=groups,
            activation_type=self.activations,
            weight_type="int8",
            activation_symmetric=False,
            calibration_method="dynamic" if self.dynamic else "histogram",
            per_channel=rule.per_channel if settings.per_channel is None else settings.per_channel,
            notes=(
                f"PT2E with {self.quantizer_name}, confined to the "
                f"planned groups' modules; activations {activations}; {rule.why}",
            ),
        )

    def needs_calibration(self, plan) -> bool:
        return not self.dynamic and bool(plan.quantized())

    def apply(self, plan, model_in: Path, model_out: Path, calibration) -> dict:
        modules = {m for g in plan.quantized() for m in g.modules}
        if not modules:
            shutil.copyfile(model_in, model_out)
            return {"method": self.name, "groups": 0}
        if self.needs_calibration(plan) and not calibration:
            raise BadInput(
                "static INT8 needs calibration data, and the project has none",
                fix='add [calibration] data = "….npz" (or module:callable) with real inputs to the project',
            )
        import torch
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        from tapeout.core import pt2

        program = pt2.load(model_in)
        samples = calibration if not self.dynamic and calibration else []
        example = program.example_inputs[0]
        module = program.module()
        # what no output reads goes first: an unused pooler's Linear → Tanh has no output node, and Inductor's x86
        # quantizer fails on such a pattern (IndexError in _get_output_nodes_of_partitions)
        module.graph.eliminate_dead_code()
        module.recompile()
        with quiet_export(), torch.no_grad():
            prepared = prepare_pt2e(module, self.quantizer(plan, modules))
            # the weights' observers see their weights when the model runs: dynamic runs it once, on the example
            for args in [tuple(torch.from_numpy(v) for v in feeds.values()) for feeds in samples] or [example]:
                prepared(*args)  # a sample's values are in the project's input order (check_feeds builds them so)
            reexport(_without_unused_weights(convert_pt2e(prepared)), example, model_out)
        info = {
            "method": self.name,
            "groups": len(plan.quantized()),
            "modules": len(modules),
            "activations": "dynamic" if self.dynamic else "static",
            "per_channel": plan.per_channel,
        }
        if samples:
            info.update(samples=len(samples), calibration="histogram")
        return info

    def postcondition(self, plan, model_in: Path, model_out: Path) -> None:
        from tapeout.core import pt2

        planned = plan.quantized()
        if not planned:
            return
        done = int8_modules(pt2.load(model_out))
        missed = [g.group for g in planned if not set(g.modules) & done]
        if missed:
            more = f" and {len(missed) - 1} more" if len(missed) > 1 else ""
            raise BadInput(
                f"{self.quantizer_name} left the planned group {missed[0]}"
                f"{more} float: none of its modules' convolutions or Linear layers reads int8 weights",
                fix=f'keep it float with [quantization] keep_float = ["{missed[0]}"], or use precision = "fp32"',
            )
