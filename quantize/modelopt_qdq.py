"""Explicit Q/DQ for TensorRT with NVIDIA Model Optimizer's ONNX post-training quantization.

TensorRT 11 has no calibrators and no precision flags: INT8 and FP8 exist only as symmetric
QuantizeLinear/DequantizeLinear pairs in the ONNX, and the rest of the graph runs in the type it
has (strong typing). ModelOpt places the Q/DQ pairs where TensorRT fuses them (conv + residual add,
no Q/DQ on GEMVs or layers under 16 channels), calibrates on ONNX Runtime's CPU EP, and casts the
unquantized remainder to FP16 in the same pass. The plan decides which nodes it may touch: every
node the plan keeps in float goes in as an exclusion, and the result is checked against the plan.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from pathlib import Path

import numpy as np

from tapeout.core.errors import BadInput, TargetUnavailable
from tapeout.core.onnx_graphs import nonzero_zero_points
from tapeout.quantize.plan import Plan

INSTALL = (
    'pip install "tapeout[tensorrt]" (NVIDIA Model Optimizer and its ONNX dependencies; '
    "the CPU build of torch first, see docs/install.md)"
)
# ModelOpt's names for tapeout's calibration methods (its INT8 calibrators: entropy, max; FP8 wants max)
CALIBRATION = {"minmax": "max", "entropy": "entropy"}


def available() -> str | None:
    """None if ModelOpt's ONNX quantizer imports here, else why not."""
    try:
        with _quiet():
            from modelopt.onnx.quantization import quantize  # noqa: F401
    except Exception as exc:  # ImportError, or its optional dependencies' own errors at import
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


@contextlib.contextmanager
def _quiet():
    """ModelOpt logs INFO lines per step to its own logger, prints to stdout (stdout is for --json) and draws
    tqdm bars for calibration on stderr (tapeout's progress lines are there)."""
    loggers = [logging.getLogger(n) for n in ("modelopt", "onnx2torch", "")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def stacked(calibration: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """ModelOpt takes calibration data as one array per input, samples along the batch axis."""
    return {name: np.concatenate([s[name] for s in calibration], axis=0) for name in calibration[0]}


def quantize(plan: Plan, model_in: Path, model_out: Path, calibration: list[dict] | None) -> dict:
    mode = plan.ladder[0]  # "int8" or "fp8": the rung the plan quantizes to
    if not calibration:
        # ModelOpt would calibrate on random data without a word (research nvidia.md 4.1)
        raise BadInput(
            f"{mode} Q/DQ for TensorRT needs calibration data, and the project has none",
            fix='add [calibration] data = "….npz" (or module:callable) with real inputs',
        )
    why = available()
    if why:
        raise TargetUnavailable(f"NVIDIA Model Optimizer (nvidia-modelopt) is not importable here: {why}", fix=INSTALL)
    import onnx
    from modelopt.onnx.quantization import quantize as modelopt_quantize

    quantized = set(plan.nodes_at(mode))
    excluded = sorted({n for g in plan.groups if g.precision != mode for n in g.nodes} | set(plan.float_nodes))
    with _quiet():
        modelopt_quantize(
            str(model_in),
            quantize_mode=mode,
            calibration_data=stacked(calibration),
            calibration_method=CALIBRATION[plan.calibration_method] if mode == "int8" else "max",
            calibration_eps=["cpu"],
            output_path=str(model_out),
            high_precision_dtype=plan.high_precision,
            # exact node names: ModelOpt reads these as regular expressions
            nodes_to_exclude=[f"^{re.escape(n)}$" for n in excluded] or None,
            op_types_to_exclude_fp16=list(plan.float_ops) or None,
            log_level="ERROR",
        )
    if not model_out.is_file():
        raise BadInput(f"ModelOpt wrote no model for the {mode} plan", fix="run `tapeout build -v` and report the log")
    model = onnx.load(str(model_out), load_external_data=False)
    found = quantized_nodes(model)
    left = sorted(quantized - found)
    return {
        "method": "modelopt",
        "mode": mode,
        "quantized_nodes": len(found & quantized),
        "left_float_by_modelopt": left,
        "left_float_why": "ModelOpt's TensorRT placement rules (GEMVs, K or N under 16, convs under 16 "
        "channels) keep these in the high-precision type"
        if left
        else "",
        "remainder": plan.high_precision,
        "qdq_pairs": sum(n.op_type == "QuantizeLinear" for n in model.graph.node),
        "calibration_samples": len(calibration),
    }


def check_written(plan: Plan, model_out: Path) -> None:
    """The postcondition: ModelOpt quantized no node the plan keeps float, and every zero point is 0 (TensorRT
    takes symmetric Q/DQ only)."""
    import onnx

    mode = plan.ladder[0]
    excluded = {n for g in plan.groups if g.precision != mode for n in g.nodes} | set(plan.float_nodes)
    model = onnx.load(str(model_out), load_external_data=False)
    wrong = sorted(quantized_nodes(model) & excluded)
    if wrong:
        raise BadInput(
            f"ModelOpt quantized {len(wrong)} node(s) the plan keeps float: {', '.join(wrong[:3])}",
            fix='report this with the nvidia-modelopt version; use precision = "fp16" meanwhile',
        )
    asymmetric = nonzero_zero_points(model)
    if asymmetric:
        raise BadInput(
            f"TensorRT needs symmetric Q/DQ, and {len(asymmetric)} zero point(s) are not 0: "
            f"{', '.join(asymmetric[:3])}",
            fix="report this with the nvidia-modelopt version",
        )


def reconcile(plan: Plan, model_path: Path) -> Plan:
    """The plan as the model has it: a group ModelOpt's TensorRT placement left unquantized (GEMVs, K or N under
    16, convs under 16 channels) is recorded in the type it runs in, so the report never claims INT8 for it."""
    import onnx

    found = quantized_nodes(onnx.load(str(model_path), load_external_data=False))
    mode = plan.ladder[0]
    for group in plan.groups:
        if group.precision == mode and group.nodes and not set(group.nodes) & found:
            plan = plan.with_group(
                group.group,
                plan.high_precision,
                f"planned {mode}; left {plan.high_precision.upper()} by ModelOpt's TensorRT placement "
                "rules (GEMV, K or N under 16, or under 16 channels)",
            )
    return plan


def quantized_nodes(model) -> set[str]:
    """Compute nodes with an input that comes out of a DequantizeLinear: those TensorRT runs quantized."""
    dq_outputs = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {
        n.name
        for n in model.graph.node
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") and dq_outputs & set(n.input)
    }
