"""Methods `pt2e-xnnpack` and `pt2e-xnnpack-dynamic`: INT8 of the torch.export program for ExecuTorch's XNNPACK
delegate, by PT2E (torchao's prepare_pt2e / convert_pt2e) with ExecuTorch's XNNPACKQuantizer. Weights are int8,
symmetric, per output channel; activations int8, either calibrated per tensor on the project's data (static: the
delegate's QS8 kernels, what the CNN rule uses) or quantized at run time (dynamic: its QD8 kernels for Linear
layers, what the transformer rule uses, as ORT's CPU rule does).

The plan's groups are ONNX nodes; the program is torch's. Each group is mapped to the torch modules its nodes came
from (the exporter's name scopes, `Analysis.scopes`: `features.2`, `inner.encoder.layer.0.attention.self.query`),
and the quantizer is filtered to exactly those modules, so it annotates nothing the plan did not name. A group
no module maps to (its nodes made by a graph pass) stays float, saying so. The quantized program is written with
torch.export.save and read back by the safe reader (`core/pt2.py`).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import warnings
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

from tapeout.core.errors import BadInput
from tapeout.quantize.methods.base import Method
from tapeout.quantize.plan import FLOAT

_UNMAPPED = ("no torch module maps to its nodes (a graph pass made them): PT2E quantizes the torch program by "
             "module, and cannot name it")
_WEIGHTED = ("conv1d", "conv2d", "conv3d", "convolution", "linear", "conv_transpose1d", "conv_transpose2d")


def _scope(node) -> str | None:
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
            found.add(_scope(node) or "")
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


def _scalars_as_tensors(model):
    """The scalar operands of float adds and muls as tensor constants, so the quantizer can give them quantization
    parameters (what XNNPACKQuantizer's own transform does). Its own converts every add and mul, integer index
    arithmetic too, into float32: MiniLM's position ids (arange + 0) became float and the attention mask's indexing
    failed. Integer arithmetic is left as it is."""
    import torch

    aten = torch.ops.aten
    made = 0
    for node in list(model.graph.nodes):
        value = node.meta.get("val")
        if (node.op != "call_function" or node.target not in (aten.add.Tensor, aten.mul.Tensor)
                or not getattr(getattr(value, "dtype", None), "is_floating_point", False)):
            continue
        args = []
        for arg in node.args:
            if isinstance(arg, int | float) and not isinstance(arg, bool):
                while hasattr(model, f"_tapeout_scalar_{made}"):
                    made += 1
                name = f"_tapeout_scalar_{made}"
                model.register_buffer(name, torch.tensor(float(arg)))
                with model.graph.inserting_before(node):
                    arg = model.graph.get_attr(name)
                arg.meta["val"] = value.fake_mode.from_tensor(model.get_buffer(name), static_shapes=True)
            args.append(arg)
        node.args = tuple(args)
    model.recompile()
    return model


@contextlib.contextmanager
def _quiet_export():
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


class Pt2eXnnpack(Method):
    name = "pt2e-xnnpack"
    tool = "PT2E (ExecuTorch's XNNPACKQuantizer)"
    model_suffix = ".pt2"
    fixed_why = "ExecuTorch programs are quantized in PT2E by XNNPACK's quantizer"
    dynamic: ClassVar[bool] = False     # activations quantized at run time (no calibration)

    def plan(self, draft, rule, analysis, settings, isa):
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
            raise BadInput(f"the {draft.family} rule found nothing to quantize in this model's torch program (roles: "
                           f"{', '.join(sorted({g.role for g in analysis.groups})) or 'none'})",
                           fix="use precision = \"fp32\", or check `tapeout analyze` for the roles found")
        activations = ("int8, quantized at run time (XNNPACK QD8)" if self.dynamic else
                       "int8 per tensor, calibrated with a histogram observer (XNNPACK QS8)")
        return replace(draft, groups=tuple(groups), activation_type="int8", weight_type="int8",
                       activation_symmetric=False, calibration_method="dynamic" if self.dynamic else "histogram",
                       per_channel=rule.per_channel if settings.per_channel is None else settings.per_channel,
                       notes=(f"PT2E with XNNPACK's quantizer, filtered to the planned groups' modules; activations "
                              f"{activations}; {rule.why}",))

    def needs_calibration(self, plan) -> bool:
        return not self.dynamic and bool(plan.quantized())

    def apply(self, plan, model_in: Path, model_out: Path, calibration) -> dict:
        modules = {m for g in plan.quantized() for m in g.modules}
        if not modules:
            shutil.copyfile(model_in, model_out)
            return {"method": self.name, "groups": 0}
        if self.needs_calibration(plan) and not calibration:
            raise BadInput("static INT8 needs calibration data, and the project has none",
                           fix="add [calibration] data = \"….npz\" (or module:callable) with real inputs to the project")
        import torch
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        from tapeout.core import pt2

        class PlanQuantizer(XNNPACKQuantizer):
            def transform_for_annotation(self, model):
                return _scalars_as_tensors(model)

        program = pt2.load(model_in)
        quantizer = PlanQuantizer().set_global(
            get_symmetric_quantization_config(is_per_channel=plan.per_channel, is_dynamic=self.dynamic))
        # weights and biases are graph constants with no module of their own: the op that reads them decides
        quantizer.set_filter_function(lambda n: n.op == "get_attr" or _scope(n) in modules)
        samples = calibration if not self.dynamic and calibration else []
        example = program.example_inputs[0]
        with _quiet_export(), torch.no_grad():
            prepared = prepare_pt2e(program.module(), quantizer)
            # the weights' observers see their weights when the model runs: dynamic runs it once, on the example
            for args in ([tuple(torch.from_numpy(v) for v in feeds.values()) for feeds in samples] or [example]):
                prepared(*args)  # a sample's values are in the project's input order (check_feeds builds them so)
            converted = _without_unused_weights(convert_pt2e(prepared))
            # dims stay as the program had them: Dim.AUTO keeps what the graph leaves dynamic, specialises the rest
            auto = tuple({i: torch.export.Dim.AUTO for i in range(t.ndim)} for t in example)
            quantized = torch.export.export(converted, example, dynamic_shapes=auto)
            torch.export.save(quantized, str(model_out))
        info = {"method": self.name, "groups": len(plan.quantized()), "modules": len(modules),
                "activations": "dynamic" if self.dynamic else "static", "per_channel": plan.per_channel}
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
            raise BadInput(f"XNNPACK's quantizer left the planned group {missed[0]}{more} float: none of its modules' "
                           "convolutions or Linear layers reads int8 weights",
                           fix=f"keep it float with [quantization] keep_float = [\"{missed[0]}\"], or use precision = \"fp32\"")


class Pt2eXnnpackDynamic(Pt2eXnnpack):
    name = "pt2e-xnnpack-dynamic"
    dynamic = True
