"""Turn a Plan into a model with the plan's quantization method (quantize/methods/), driven by explicit node lists.

Never "quantize everything": every method names the nodes (research quant-prune §1.5: ORT's defaults
quantize Softmax, LayerNorm and residual Adds, which wrecks transformers), and checks afterwards that the model
follows the plan. When the quantizer itself fails on a node, `apply_with_fallback` moves that node's group one
rung up the ladder and applies the plan again, saying so, instead of stopping the build; what a fallback wrote is
proven loadable (ONNX's checker, ONNX Runtime's CPU EP) before anything else sees it, and a node the runtime refuses
moves its group up the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from tapeout.core.errors import BadInput, TargetUnavailable, first_line, runtime_detail
from tapeout.core.heap import collect_and_return
from tapeout.quantize import methods
from tapeout.quantize.ort_tools import quiet
from tapeout.quantize.plan import Plan


class QuantizerFailed(BadInput):
    """The quantization tool raised while applying a plan; `node` is the node it was working on, where known."""

    def __init__(self, message: str, *, node: str | None, fix: str, detail: str | None = None):
        super().__init__(message, fix=fix, detail=detail)
        self.node = node


def apply(
    plan: Plan,
    model_in: Path,
    model_out: Path,
    calibration: list[dict] | None = None,
    max_ir_version: int | None = None,
) -> dict:
    """Write the quantized model for `plan` with its method, then check it follows the plan; returns what was done
    (for the report)."""
    import onnx

    method = methods.get(plan.method)
    model_out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with quiet():
            info = method.apply(plan, model_in, model_out, calibration)
    except (BadInput, TargetUnavailable):
        raise
    except Exception as exc:  # the quantizer's own failure, named with the node it was working on
        node, where = failed_at(exc)
        raise QuantizerFailed(
            f"{method.tool} could not quantize the model ({plan.method}, {len(plan.quantized())} "
            f"groups){where}: {first_line(exc)}",
            node=node,
            detail=runtime_detail(exc),
            fix=(
                "keep that node's group float with [quantization] keep_float"
                if where
                else "keep the failing nodes float with [quantization] keep_float"
            )
            + ', or use precision = "fp32"',
        ) from None
    collect_and_return()  # the quantizer's models, in reference cycles, go before the written one is read again
    try:
        method.postcondition(plan, model_in, model_out)
    except BadInput:  # a model that does not follow its plan is never left where a result would be
        for file in (model_out, model_out.with_suffix(".bin")) if model_out.suffix == ".xml" else (model_out,):
            file.unlink(missing_ok=True)
        raise
    if max_ir_version is not None and method.model_suffix == ".onnx":
        model = onnx.load(str(model_out), load_external_data=False)
        if model.ir_version > max_ir_version:
            model.ir_version = max_ir_version  # the quantizers write the newest IR; the runtime may accept less
            onnx.save(model, str(model_out))
    return info


def apply_with_fallback(
    plan: Plan,
    model_in: Path,
    model_out: Path,
    calibration: list[dict] | None = None,
    max_ir_version: int | None = None,
    log: Callable[[str], None] = lambda _msg: None,
) -> tuple[Plan, dict]:
    """`apply`, and where the quantizer fails on a node: a node of a plan group below the ladder's top moves that
    group one rung up; an ungrouped node the method quantizes anyway (a full-integer plan quantizes every op:
    ORT's QNN quantizer stops a diffusion UNet at "Quantization parameter shared mode is not supported for
    weight yet", on an op that shares its input's parameters) is kept float, where the method honours the plan's
    float nodes. The plan is applied again until it applies or the failure names nothing that can move. Returns
    the plan that applied and what was done, every move listed."""
    moved: list[dict] = []
    while True:
        try:
            info = apply(plan, model_in, model_out, calibration, max_ir_version)
            if moved and methods.get(plan.method).model_suffix == ".onnx":
                _proven_loadable(model_out)  # a fallback's graph is one no one has run: it loads, or moves on
            break
        except QuantizerFailed as exc:
            plan, move = _move_up(plan, exc)
            if move is None:
                raise
            moved.append(move)
            log(f"{move['group']}: {move['from']} → {move['to']} ({move['why']})")
    if moved:
        info = {**info, "fallbacks": moved}
    return plan, info


_REFUSED_NODE = re.compile(r"in node \(([^)]+)\)")  # ONNX Runtime's type and shape errors name the node so


def _proven_loadable(model_out: Path) -> None:
    """A fallback's result loads before the next stage sees it: ONNX's checker, then ONNX Runtime's CPU EP with its
    optimizations off (it still types every node's inputs, so a QDQ graph with a float where an integer belongs is
    refused here, not by an NPU's compiler after the work). Raises QuantizerFailed naming the node it refuses."""
    import onnx
    import onnxruntime as ort

    try:
        onnx.checker.check_model(str(model_out))  # by path: a model over 2 GB keeps its weights outside
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        ort.InferenceSession(str(model_out), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # the checker's ValidationError, ORT's InvalidGraph/Fail: the graph is not valid
        named = _REFUSED_NODE.search(str(exc))
        raise QuantizerFailed(
            f"the quantized model does not load: {first_line(exc)}",
            node=named.group(1) if named else None,
            detail=runtime_detail(exc),
            fix='keep that node\'s group float with [quantization] keep_float, or use precision = "fp32"',
        ) from None


def _move_up(plan: Plan, exc: QuantizerFailed) -> tuple[Plan, dict | None]:
    """The plan with what the failure names moved up, and the move; (plan, None) where nothing can move. A node the
    quantizer wrote (`mm_quant`, `x_QuantizeLinear`) stands for the planned node its name starts with."""
    if not exc.node:
        return plan, None
    why = f"the quantizer failed on {exc.node}: {exc.problem}"
    group = next((g for g in plan.groups if exc.node in g.nodes), None) or _group_written_for(plan, exc.node)
    if group is not None:
        rung = plan.next_rung(group.group)
        if rung is None:
            return plan, None
        return (
            plan.with_group(group.group, rung, f"moved up from {group.precision}: {why}"),
            {"group": group.group, "from": group.precision, "to": rung, "why": why},
        )
    if methods.get(plan.method).honours_float_nodes and exc.node not in plan.float_nodes:
        return (
            replace(plan, float_nodes=(*plan.float_nodes, exc.node)),
            {"group": exc.node, "from": plan.ladder[0], "to": plan.ladder[-1], "why": why},
        )
    return plan, None


def _group_written_for(plan: Plan, node: str):
    """The group of the planned node a quantizer's node was written for: the longest planned name `node` starts
    with, followed by `_`; None where none is."""
    owners = [(len(n), g) for g in plan.groups for n in g.nodes if node.startswith(f"{n}_")]
    return max(owners, key=lambda owner: owner[0])[1] if owners else None


_TENSOR_LOCALS = ("tensor_name", "weight_name", "input_name", "bias_name")


def failed_at(exc: BaseException) -> tuple[str | None, str]:
    """Which node (and tensor) ORT's quantizer was on when it raised — its own messages rarely say, but its
    per-node frames hold the node (`node`, or an op quantizer's `self.node`) and tensor names: the node's name,
    and the words saying where."""
    node = tensor = None
    named = None  # a node named but not at hand: the op sharing its input's parameters, in ORT's QDQ quantizer
    tb = exc.__traceback__
    while tb is not None:  # outermost to innermost: the innermost names win
        local = tb.tb_frame.f_locals
        candidate = local.get("node")
        if candidate is None and hasattr(local.get("self"), "node"):
            candidate = local["self"].node
        if hasattr(candidate, "op_type") and hasattr(candidate, "name"):
            node, named = candidate, None
        provider = local.get("quant_provider")
        if isinstance(getattr(provider, "node_name", None), str) and provider.node_name:
            node, named = None, provider.node_name  # deeper than an outer loop's last node: this is the op
        tensor = next((local[k] for k in _TENSOR_LOCALS if isinstance(local.get(k), str) and local[k]), tensor)
        tb = tb.tb_next
    if node is None and named is not None:
        return named, f" at node '{named}'" + (f", tensor '{tensor}'" if tensor else "")
    if node is None:
        return None, ""
    return node.name, f" at node '{node.name}' ({node.op_type})" + (f", tensor '{tensor}'" if tensor else "")
