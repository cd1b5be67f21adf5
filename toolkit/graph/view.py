"""An ONNX model loaded for analysis at the build's shapes: who produces and who consumes each tensor,
shapes from shape inference with the project's dims pinned, constants, and control-flow bodies flattened
in front of the node that runs them.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tapeout.core.errors import BadInput
from tapeout.core.onnx_graphs import bodies, graphs_in
from tapeout.core.paths import confined
from tapeout.core.schemas import InputSpec


@dataclass
class GraphView:
    """An ONNX graph with the lookups every detector needs: who produces and who consumes a tensor."""

    model: object
    nodes: list = field(default_factory=list)
    producer: dict = field(default_factory=dict)
    consumers: dict = field(default_factory=dict)
    initializers: dict = field(default_factory=dict)  # name -> numpy array (weights, small constants)
    shapes: dict = field(default_factory=dict)  # tensor name -> tuple of ints (or None per unknown dim)
    dtypes: dict = field(default_factory=dict)
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    # If/Loop/Scan bodies: their nodes are in `nodes` (before the node that runs them), each with the
    # times it runs per inference (0 for the cheaper branch of an If: one branch runs)
    parent: dict = field(default_factory=dict)  # body node name -> the control-flow node's name
    control_flow: list = field(default_factory=list)  # control-flow nodes, outermost first
    body_outputs: dict = field(default_factory=dict)  # control-flow node name -> its bodies' output tensors

    @classmethod
    def load(
        cls, model_path: Path, inputs: list[InputSpec] | None = None, dims: dict[str, int] | None = None
    ) -> GraphView:
        import onnx
        from onnx import numpy_helper

        try:
            model = onnx.load(str(model_path), load_external_data=False)
        except Exception as exc:
            raise BadInput(
                f"{model_path} is not a readable ONNX model ({type(exc).__name__}: {exc})",
                fix="re-export it, or point the project at the right file",
            ) from None
        weights = _take_weights(model, Path(model_path).parent)
        model = onnx.load_from_string(model.SerializeToString())  # the weights' bytes go with the first copy
        _pin_inputs(model, inputs or [], dims or {})
        del model.graph.value_info[:]  # stale symbolic shapes would shadow the pinned ones
        model = _infer_shapes(model)
        view = cls(model=model)
        view.nodes = _flatten(view, model.graph, None)
        for node in view.nodes:
            for out in node.output:
                view.producer[out] = node
            for inp in node.input:
                if inp:
                    view.consumers.setdefault(inp, []).append(node)
        graphs = list(graphs_in(model.graph))
        for init in (i for g in graphs for i in g.initializer):
            view.initializers[init.name] = weights.get(init.name)
            if view.initializers[init.name] is None:
                view.initializers[init.name] = numpy_helper.to_array(init)
        for node in view.nodes:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                view.initializers[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        for vi in [
            *model.graph.input,
            *(v for g in graphs for v in g.value_info),
            *model.graph.output,
            *(v for g in graphs[1:] for v in [*g.input, *g.output]),
        ]:
            tensor = vi.type.tensor_type
            view.shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
            view.dtypes[vi.name] = tensor.elem_type
        for name, array in view.initializers.items():
            view.shapes[name] = tuple(array.shape)
        view.inputs = [i.name for i in model.graph.input if i.name not in view.initializers]
        view.outputs = [o.name for o in model.graph.output]
        return view

    def is_const(self, tensor: str) -> bool:
        return tensor in self.initializers or (
            tensor in self.producer
            and self.producer[tensor].op_type in ("Transpose", "Cast", "DequantizeLinear")
            and all(self.is_const(i) for i in self.producer[tensor].input if i)
        )

    def const_array(self, tensor: str) -> np.ndarray | None:
        """The value of a constant tensor, looking through Transpose/Cast of an initializer."""
        if tensor in self.initializers:
            return self.initializers[tensor]
        node = self.producer.get(tensor)
        if node is not None and node.op_type in ("Transpose", "Cast") and node.input[0] in self.initializers:
            return self.initializers[node.input[0]]
        return None

    def weight_of(self, node) -> np.ndarray | None:
        """The weight of a MatMul/Gemm/Conv whose second input is constant, else None."""
        if node.op_type in ("MatMul", "Gemm", "Conv", "ConvTranspose") and len(node.input) > 1:
            return self.const_array(node.input[1])
        return None

    def size(self, tensor: str) -> int | None:
        shape = self.shapes.get(tensor)
        if shape is None or any(d is None for d in shape):
            return None
        return int(np.prod(shape, dtype=np.int64)) if shape else 1

    def elem_bytes(self, tensor: str) -> int:
        from onnx import helper

        elem = self.dtypes.get(tensor)
        if tensor in self.initializers:
            return self.initializers[tensor].dtype.itemsize
        try:
            return np.dtype(helper.tensor_dtype_to_np_dtype(elem)).itemsize if elem else 4
        except Exception:
            return 4

    def attr(self, node, name: str, default=None):
        from onnx import helper

        for a in node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default


def _flatten(view: GraphView, graph, parent) -> list:
    """The graph's nodes with each control-flow body's nodes just before the node that runs them."""
    nodes = []
    for i, node in enumerate(graph.node):
        if not node.name:  # body nodes are often nameless; names key roles and groups
            node.name = f"{parent.name if parent is not None else 'graph'}/{node.op_type}_{i}"
        held = bodies(node)
        if held:
            view.control_flow.append(node)
            view.body_outputs[node.name] = [o.name for _, body in held for o in body.output]
            for _, body in held:
                for inner in _flatten(view, body, node):
                    view.parent.setdefault(inner.name, node.name)
                    nodes.append(inner)
        nodes.append(node)
    return nodes


_WEIGHT_BYTES = 1 << 16  # a tensor this large is a weight, not a shape or an index shape inference reads


def _take_weights(model, folder: Path) -> dict:
    """The large initializers as arrays, their bytes cleared from `model` (dims and type kept): shape inference
    copies the model it is given, and a language model's weights copied twice more would set the build's peak
    memory. A weight in an external-data file is mapped, not read: the analysis reads its shape, rarely its values,
    so a large model's weights cost no memory here. Small constants stay, as shape inference reads their values."""
    from onnx import TensorProto, numpy_helper

    taken = {}
    for graph in graphs_in(model.graph):
        for init in graph.initializer:
            if init.data_location == TensorProto.EXTERNAL:
                array = _external_array(init, folder)
                del init.external_data[:]
                init.data_location = TensorProto.DEFAULT
                if isinstance(array, bytes):  # a packed or exotic type: decoded as onnx decodes it
                    init.raw_data = array
                    if len(array) < _WEIGHT_BYTES:
                        continue
                    array = numpy_helper.to_array(init)
                    init.ClearField("raw_data")
                elif array.nbytes < _WEIGHT_BYTES:
                    init.raw_data = np.ascontiguousarray(array).tobytes()
                    continue
                taken[init.name] = array
            elif init.HasField("raw_data") and len(init.raw_data) >= _WEIGHT_BYTES:
                taken[init.name] = numpy_helper.to_array(init)
                init.ClearField("raw_data")
        for node in graph.node:  # a Constant's value in external data (rare): read in, as onnx.load would
            for attr in node.attribute:
                if attr.HasField("t") and attr.t.data_location == TensorProto.EXTERNAL:
                    array = _external_array(attr.t, folder)
                    del attr.t.external_data[:]
                    attr.t.data_location = TensorProto.DEFAULT
                    attr.t.raw_data = array if isinstance(array, bytes) else np.ascontiguousarray(array).tobytes()
    return taken


# Tensor types stored as plain little-endian numpy elements, which can be mapped as they lie in the file.
_MAPPABLE = {
    "bool",
    "float32",
    "float64",
    "float16",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
}


def _external_array(init, folder: Path) -> np.ndarray | bytes:
    """An initializer kept in an external-data file: mapped read-only where its type is a plain numpy one, else its
    bytes. Its location is confined to the model's folder and its offset and length checked against the file."""
    from onnx import helper

    entries = {entry.key: entry.value for entry in init.external_data}
    source = confined(folder, entries.get("location", ""), f"initializer '{init.name}': external data")
    shape = tuple(int(d) for d in init.dims)
    try:
        offset = int(entries.get("offset", 0))
        length = int(entries["length"]) if "length" in entries else None
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type))
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(
            f"initializer '{init.name}' has an external-data entry tapeout cannot read ({exc})",
            fix="re-export the model with plain offsets and lengths",
        ) from None
    size = source.stat().st_size if source.is_file() else -1
    mappable = dtype.name in _MAPPABLE
    need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize if mappable else length
    if need is None:
        need = size - offset
    if offset < 0 or need < 0 or (length is not None and length != need) or offset + need > size:
        raise BadInput(
            f"initializer '{init.name}': {need} bytes at offset {offset} of {source.name} ({size} bytes) do not "
            "fit its dims and type",
            fix="the weights file does not belong to this model: copy the model and its weights file together",
        )
    if not mappable:
        with open(source, "rb") as file:
            file.seek(offset)
            return file.read(need)
    if need == 0:
        return np.zeros(shape, dtype.newbyteorder("<"))
    return np.memmap(source, dtype=dtype.newbyteorder("<"), mode="r", offset=offset, shape=shape)


def _infer_shapes(model):
    """ORT's symbolic inference first (it resolves broadcasts of size-1 dims that ONNX's leaves
    unknown), ONNX's as the fallback; best effort: costs of unknown shapes count as 0."""
    from onnx import shape_inference

    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        # When it cannot infer every shape it saves the model as sym_shape_infer_temp.onnx (plus external
        # data) in the current directory before raising: let it write into a directory of its own.
        with tempfile.TemporaryDirectory(prefix="tapeout-shapes-") as scratch, _working_directory(scratch):
            inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
        if inferred is not None:
            return inferred
    except Exception:
        pass
    try:
        return shape_inference.infer_shapes(model, data_prop=True)
    except Exception:
        return model


@contextlib.contextmanager
def _working_directory(path: str):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _pin_inputs(model, inputs: list[InputSpec], dims: dict[str, int]) -> None:
    """Give every input dim a value: the project's shape, else the named dim's value, else 1."""
    specs = {s.name: s for s in inputs}
    for graph_input in model.graph.input:
        tensor_dims = graph_input.type.tensor_type.shape.dim
        spec = specs.get(graph_input.name)
        shape = spec.concrete_shape(dims) if spec is not None else None
        if shape is None or len(tensor_dims) != len(shape):  # a rank mismatch is the lint's to report
            shape = [d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, 1) for d in tensor_dims]
        for dim, value in zip(tensor_dims, shape, strict=True):
            dim.ClearField("dim_param")
            dim.dim_value = value
