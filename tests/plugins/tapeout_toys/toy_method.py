"""Method `toy-int8-weights`: each planned weight rounded onto a symmetric per-tensor INT8 grid and stored in FP32
(simulated weight-only INT8), registered from outside tapeout. It stands in for the CPU rules' methods."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from tapeout.core.errors import BadInput
from tapeout.quantize.methods.base import Method


def _planned_weights(model, plan):
    inits = {i.name: i for i in model.graph.initializer}
    planned = set(plan.nodes_at(plan.ladder[0]))
    return [
        inits[n.input[1]] for n in model.graph.node if n.name in planned and len(n.input) > 1 and n.input[1] in inits
    ]


class ToyInt8Weights(Method):
    name = "toy-int8-weights"
    tool = "the toy INT8 rounder"
    stands_in_for = frozenset({"dynamic", "static"})

    def plan(self, draft, rule, analysis, settings, isa):
        return replace(draft, notes=("toy: weights rounded onto a per-tensor INT8 grid, stored FP32",))

    def apply(self, plan, model_in: Path, model_out: Path, calibration) -> dict:
        import onnx
        from onnx import numpy_helper

        model = onnx.load(str(model_in))
        weights = _planned_weights(model, plan)
        for tensor in weights:
            w = numpy_helper.to_array(tensor)
            scale = float(np.abs(w).max()) / 127 or 1.0
            tensor.CopyFrom(numpy_helper.from_array((np.round(w / scale) * scale).astype(w.dtype), tensor.name))
        onnx.save(model, str(model_out))
        return {"method": self.name, "weights": len(weights)}

    def postcondition(self, plan, model_in: Path, model_out: Path) -> None:
        import onnx
        from onnx import numpy_helper

        for tensor in _planned_weights(onnx.load(str(model_out)), plan):
            if len(np.unique(numpy_helper.to_array(tensor))) > 255:
                raise BadInput(f"weight {tensor.name} is not on an INT8 grid", fix="report the toy")
