"""Methods `pt2e-xnnpack` and `pt2e-xnnpack-dynamic`: INT8 of the torch.export program for ExecuTorch's XNNPACK
delegate, by PT2E (`pt2e.py`) with ExecuTorch's XNNPACKQuantizer: static activations run on the delegate's QS8
kernels (what the CNN rule uses), dynamic ones on its QD8 kernels for Linear layers (what the transformer rule uses,
as ORT's CPU rule does). The quantizer is confined to the plan's modules by its filter function.
"""

from __future__ import annotations

from tapeout.quantize.methods.pt2e import Pt2eMethod, scope


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
        if (
            node.op != "call_function"
            or node.target not in (aten.add.Tensor, aten.mul.Tensor)
            or not getattr(getattr(value, "dtype", None), "is_floating_point", False)
        ):
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


class Pt2eXnnpack(Pt2eMethod):
    name = "pt2e-xnnpack"
    tool = "PT2E (ExecuTorch's XNNPACKQuantizer)"
    quantizer_name = "XNNPACK's quantizer"
    kernels = "XNNPACK QS8"
    fixed_why = "ExecuTorch programs are quantized in PT2E by XNNPACK's quantizer"

    def quantizer(self, plan, modules):
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )

        class PlanQuantizer(XNNPACKQuantizer):
            def transform_for_annotation(self, model):
                return _scalars_as_tensors(model)

        quantizer = PlanQuantizer().set_global(
            get_symmetric_quantization_config(is_per_channel=plan.per_channel, is_dynamic=self.dynamic)
        )
        # weights and biases are graph constants with no module of their own: the op that reads them decides
        quantizer.set_filter_function(lambda n: n.op == "get_attr" or scope(n) in modules)
        return quantizer


class Pt2eXnnpackDynamic(Pt2eXnnpack):
    name = "pt2e-xnnpack-dynamic"
    kernels = "XNNPACK QD8"
    dynamic = True
