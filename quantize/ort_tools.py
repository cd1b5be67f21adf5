"""What every method that drives onnxruntime's quantization tools shares: quiet logging, a calibration reader
over the project's samples, the op types of the planned nodes, and the postcondition that no planned node is
left computing with a float weight.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

from tapeout.core.errors import BadInput
from tapeout.core.onnx_graphs import graphs_in

CALIBRATION = {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy"}
QTYPE = {"uint8": "QUInt8", "int8": "QInt8", "uint16": "QUInt16", "int16": "QInt16"}


@contextlib.contextmanager
def quiet():
    """ORT's quantizers log advice and per-node progress (root logger, and loggers of their own with
    INFO handlers); keep stderr to tapeout's own progress lines."""
    names = ["", *(n for n in logging.root.manager.loggerDict if n.startswith("onnxruntime"))]
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # GPTQ prints a progress bar: stdout is for --json
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def calibration_reader(samples: list[dict]):
    from onnxruntime.quantization import CalibrationDataReader

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(samples)

        def get_next(self):
            return next(self._it, None)

        def __len__(self) -> int:
            return len(samples)

        def rewind(self) -> None:
            self._it = iter(samples)

    return _Reader()


def op_types(model_in: Path, nodes: list[str]) -> list[str]:
    return planned_ops(model_in, nodes)[0]


def planned_ops(model_in: Path, nodes: list[str]) -> tuple[list[str], bool]:
    """The op types of the planned `nodes`, and whether any of them sits inside a control-flow body."""
    import onnx

    wanted = set(nodes)
    model = onnx.load(str(model_in), load_external_data=False)
    types = sorted({n.op_type for g in graphs_in(model.graph) for n in g.node if n.name in wanted})
    in_main = {n.name for n in model.graph.node} & wanted
    return types, in_main != wanted


def check_nbits(nodes: list[str], bits: int, model_out: Path) -> None:
    """Postcondition: every planned node is a MatMulNBits of `bits` bits in the written model (ORT's quantizer names
    it `<node>_Q<bits>`), not a MatMul that kept its float weight."""
    import onnx

    if not nodes:
        return
    model = onnx.load(str(model_out), load_external_data=False)
    written = {
        n.name.rsplit("_Q", 1)[0]
        for g in graphs_in(model.graph)
        for n in g.node
        if n.op_type == "MatMulNBits" and n.name.endswith(f"_Q{bits}")
    }
    left = sorted(set(nodes) - written)
    if left:
        raise BadInput(
            f"{bits}-bit weight-only: onnxruntime left {len(left)} of {len(nodes)} planned node(s) without "
            f"MatMulNBits: {', '.join(left[:3])}{' …' if len(left) > 3 else ''}",
            fix="keep them at a higher rung with [quantization] overrides, or report the model's pattern",
        )


def check_quantized(nodes: list[str], model_out: Path, what: str) -> None:
    """Postcondition: no planned node is left computing with a float weight straight from an initializer
    (dynamic quantization replaces the node; static QDQ feeds its weight through DequantizeLinear)."""
    import onnx
    from onnx import TensorProto

    model = onnx.load(str(model_out), load_external_data=False)
    graphs = list(graphs_in(model.graph))
    floats = {i.name for g in graphs for i in g.initializer if i.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16)}
    # a float weight read through a Transpose (a tied LM head) is as float as one read directly
    floats |= {
        n.output[0] for g in graphs for n in g.node if n.op_type == "Transpose" and n.input and n.input[0] in floats
    }
    planned = set(nodes)
    # an LSTM keeps its name and op type only when the quantizer skipped it (it becomes DynamicQuantizeLSTM)
    left = [
        f"{n.name} ({n.op_type})"
        for g in graphs
        for n in g.node
        if n.name in planned
        and n.op_type in ("MatMul", "Gemm", "Conv", "LSTM")
        and len(n.input) > 1
        and n.input[1] in floats
    ]
    if left:
        raise BadInput(
            f"{what}: onnxruntime left {len(left)} of {len(planned)} planned node(s) in float: "
            f"{', '.join(left[:3])}{' …' if len(left) > 3 else ''}",
            fix="keep them float with [quantization] keep_float (the report would otherwise claim INT8), "
            "or report the model's pattern",
        )
