"""The ONNX checks every target needs before its own: IR version and opset against the runtime's
limits, and the model's inputs against the project's [[inputs]] (names, dtypes, ranks, fixed dims).

ONNX Runtime's limits are the export's limits: every export is verified on ONNX Runtime, so they are
found once per process by loading tiny models.
"""

from __future__ import annotations

import functools
from pathlib import Path

from tapeout.core.errors import BadInput
from tapeout.core.schemas import InputSpec
from tapeout.targets.base import LintIssue, RuntimeLimits


@functools.cache
def ort_limits() -> RuntimeLimits:
    """Newest IR version and default-domain opset this onnxruntime loads, found by trying tiny models."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def loads(ir_version: int, opset: int) -> bool:
        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "probe",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = ir_version
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception:
            return False
        return True

    ir = next(v for v in range(onnx.IR_VERSION, 3, -1) if loads(v, 13))
    opset = next(v for v in range(onnx.defs.onnx_opset_version(), 12, -1) if loads(ir, v))
    return RuntimeLimits(max_ir_version=ir, max_opset=opset)


def read_header(model_path: Path):
    """The model without its weights, or one clear line saying why it cannot be read."""
    import onnx

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:
        raise BadInput(
            f"{model_path} is not a readable ONNX model ({type(exc).__name__}: {exc})",
            fix="re-export it, or point the project at the right file",
        ) from None
    where = _not_text(model)
    if where:  # ONNX is proto2: its parser keeps invalid UTF-8 names as bytes, and they break every report
        raise BadInput(
            f"{model_path} is corrupt: {where} is not UTF-8 text",
            fix="re-export it; a damaged download or a truncated copy does this",
        )
    return model


def _not_text(message, where: str = "model") -> str | None:
    """The first string field holding bytes that are not UTF-8, as a dotted path; None if all are text."""
    from google.protobuf.descriptor import FieldDescriptor

    for field, value in message.ListFields():
        path = f"{where}.{field.name}"
        repeated = field.is_repeated  # protobuf >= 5 dropped `label`
        values = value if repeated else [value]
        if field.type == FieldDescriptor.TYPE_STRING:
            if any(isinstance(v, bytes) for v in values):
                return path
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            for i, v in enumerate(values):
                found = _not_text(v, f"{path}[{i}]" if repeated else path)
                if found:
                    return found
    return None


def check(model_path: Path, inputs: list[InputSpec], dims: dict[str, int], limits: RuntimeLimits) -> list[LintIssue]:
    """IR version or opset too new; inputs that do not match the project."""
    model = read_header(model_path)
    issues: list[LintIssue] = []
    if model.ir_version > limits.max_ir_version:
        issues.append(
            LintIssue(
                "error",
                f"IR version {model.ir_version} is newer than this onnxruntime accepts ({limits.max_ir_version})",
                f"save the model with ir_version = {limits.max_ir_version}",
            )
        )
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx") and imp.version > limits.max_opset:
            issues.append(
                LintIssue(
                    "error",
                    f"opset {imp.version} is newer than this onnxruntime supports ({limits.max_opset})",
                    f"export with opset <= {limits.max_opset}",
                )
            )
    if not model.graph.output:
        issues.append(
            LintIssue(
                "error",
                "the model has no outputs",
                "export the model again; an ONNX graph lists the outputs it computes",
            )
        )
    initializers = {init.name for init in model.graph.initializer}
    graph_inputs = {i.name: i for i in model.graph.input if i.name not in initializers}
    declared = {spec.name: spec for spec in inputs}
    for name in graph_inputs.keys() - declared.keys():
        issues.append(
            LintIssue(
                "error",
                f"model input '{name}' is not declared in the project's [[inputs]]",
                f"add an [[inputs]] entry named '{name}'",
            )
        )
    for name in declared.keys() - graph_inputs.keys():
        issues.append(
            LintIssue(
                "error",
                f"project input '{name}' is not an input of the model "
                f"(model inputs: {', '.join(graph_inputs) or 'none'})",
                "rename or remove that [[inputs]] entry",
            )
        )
    for name in declared.keys() & graph_inputs.keys():
        issues.extend(_check_input(graph_inputs[name], declared[name], dims))
    return issues


def _check_input(graph_input, spec: InputSpec, dims: dict[str, int]) -> list[LintIssue]:
    from onnx import helper

    tensor = graph_input.type.tensor_type
    dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else None
    issues = []
    if dtype is not None and dtype != spec.dtype:
        issues.append(
            LintIssue(
                "error",
                f"input '{spec.name}' is {dtype} in the model but {spec.dtype} in the project",
                f"set dtype = \"{dtype}\" for '{spec.name}'",
            )
        )
    model_dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]
    want = spec.concrete_shape(dims)
    if len(model_dims) != len(want):
        return [
            *issues,
            LintIssue(
                "error",
                f"input '{spec.name}' has rank {len(model_dims)} in the model "
                f"{model_dims} but the project gives shape {list(spec.shape)}",
                f"give '{spec.name}' a shape of rank {len(model_dims)}",
            ),
        ]
    for axis, (have, need) in enumerate(zip(model_dims, want, strict=True)):
        if isinstance(have, int) and have > 0 and have != need:
            issues.append(
                LintIssue(
                    "error",
                    f"input '{spec.name}' axis {axis} is fixed to {have} in the model but the "
                    f"project gives {need} (shape {list(spec.shape)})",
                    f"set axis {axis} of '{spec.name}' to {have}",
                )
            )
    return issues
