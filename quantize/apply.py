"""Turn a Plan into an ONNX model with onnxruntime's quantization tools, driven by explicit node lists.

Never "quantize everything": every call names the nodes (research quant-prune §1.5: ORT's defaults
quantize Softmax, LayerNorm and residual Adds, which wrecks transformers).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import shutil
from pathlib import Path

from tapeout.core.errors import BadInput, TargetUnavailable, first_line, runtime_detail
from tapeout.core.onnx_graphs import graphs_in
from tapeout.quantize.plan import FLOAT, Plan

_CALIBRATION = {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy"}
_QTYPE = {"uint8": "QUInt8", "int8": "QInt8", "uint16": "QUInt16", "int16": "QInt16"}


@contextlib.contextmanager
def _quiet():
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


def apply(plan: Plan, model_in: Path, model_out: Path, calibration: list[dict] | None = None,
          max_ir_version: int | None = None) -> dict:
    """Write the quantized model for `plan`; returns what was done (for the report)."""
    import onnx

    model_out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with _quiet():
            if plan.method == "dynamic":
                info = _dynamic(plan, model_in, model_out)
            elif plan.method == "static":
                info = _static(plan, model_in, model_out, calibration)
            elif plan.method == "npu-static":
                info = _npu_static(plan, model_in, model_out, calibration)
            elif plan.method == "float16":
                info = _float16(plan, model_in, model_out)
            elif plan.method in ("nncf", "nncf-weights"):
                from tapeout.quantize import openvino_nncf

                run = openvino_nncf.quantize if plan.method == "nncf" else openvino_nncf.compress_weights
                info = run(plan, model_in, model_out, calibration)
            elif plan.method == "modelopt":
                from tapeout.quantize import modelopt_qdq

                info = modelopt_qdq.quantize(plan, model_in, model_out, calibration)
            else:
                info = _weight_only(plan, model_in, model_out, calibration)
    except (BadInput, TargetUnavailable):
        raise
    except Exception as exc:  # the quantizer's own failure, named with the node it was working on
        where = failed_at(exc)
        who = {"nncf": "NNCF", "nncf-weights": "NNCF", "modelopt": "NVIDIA Model Optimizer"}.get(plan.method, "onnxruntime")
        raise BadInput(f"{who} could not quantize the model ({plan.method}, {len(plan.quantized())} groups)"
                       f"{where}: {first_line(exc)}", detail=runtime_detail(exc),
                       fix=("keep that node's group float with [quantization] keep_float" if where else
                            "keep the failing nodes float with [quantization] keep_float") +
                           ", or use precision = \"fp32\"") from None
    if max_ir_version is not None and plan.model_suffix == ".onnx":
        model = onnx.load(str(model_out), load_external_data=False)
        if model.ir_version > max_ir_version:
            model.ir_version = max_ir_version  # the quantizers write the newest IR; the runtime may accept less
            onnx.save(model, str(model_out))
    return info


_TENSOR_LOCALS = ("tensor_name", "weight_name", "input_name", "bias_name")


def failed_at(exc: BaseException) -> str:
    """Which node (and tensor) ORT's quantizer was on when it raised: its own messages rarely say, but
    its per-node frames hold the node (`node`, or an op quantizer's `self.node`) and tensor names."""
    node = tensor = None
    tb = exc.__traceback__
    while tb is not None:  # outermost to innermost: the innermost names win
        local = tb.tb_frame.f_locals
        candidate = local.get("node")
        if candidate is None and hasattr(local.get("self"), "node"):
            candidate = local["self"].node
        if hasattr(candidate, "op_type") and hasattr(candidate, "name"):
            node = candidate
        tensor = next((local[k] for k in _TENSOR_LOCALS if isinstance(local.get(k), str) and local[k]), tensor)
        tb = tb.tb_next
    if node is None:
        return ""
    return f" at node '{node.name}' ({node.op_type})" + (f", tensor '{tensor}'" if tensor else "")


def _op_types(model_in: Path, nodes: list[str]) -> list[str]:
    import onnx

    wanted = set(nodes)
    model = onnx.load(str(model_in), load_external_data=False)
    return sorted({n.op_type for g in graphs_in(model.graph) for n in g.node if n.name in wanted})


def _dynamic(plan: Plan, model_in: Path, model_out: Path) -> dict:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    nodes = plan.nodes_at("int8")
    if not nodes:
        shutil.copyfile(model_in, model_out)
        return {"method": "dynamic", "nodes": 0}
    # ORT's dynamic quantizer has no Gemm: it splits Gemm into MatMul + Add under new names and then
    # skips them as not planned, leaving FP32. Rewritten here first, the MatMul keeps the planned name;
    # a model with no planned Gemm is passed through untouched (no second copy of 90 MB of MiniLM).
    source, rewritten = model_in, 0
    if "Gemm" in _op_types(model_in, nodes):
        model = onnx.load(str(model_in))
        rewritten = gemm_as_matmul(model, set(nodes))
        source = model_out.with_name(f"{model_out.stem}.gemm-as-matmul.onnx")
        onnx.save(model, str(source))
    try:
        quantize_dynamic(source, model_out, op_types_to_quantize=_op_types(source, nodes), nodes_to_quantize=nodes,
                         per_channel=plan.per_channel, reduce_range=plan.reduce_range,
                         weight_type=getattr(QuantType, _QTYPE[plan.weight_type]),
                         # EnableSubgraph: planned nodes inside If/Loop/Scan bodies are quantized too
                         extra_options={"MatMulConstBOnly": True, "EnableSubgraph": True})
    finally:
        if source != model_in:
            source.unlink(missing_ok=True)
    check_quantized(nodes, model_out, "dynamic INT8")
    return {"method": "dynamic", "nodes": len(nodes), "per_channel": plan.per_channel, "reduce_range": plan.reduce_range,
            "gemm_as_matmul": rewritten}


def gemm_as_matmul(model, names: set[str]) -> int:
    """Rewrite each Gemm in `names` (in the main graph or a control-flow body) whose B (and C, when
    beta != 1) is a constant of its own and whose A is not transposed as MatMul (same name; B transposed
    and scaled by alpha in its initializer) + Add (C, scaled by beta); returns how many. What it cannot
    rewrite stays Gemm: the postcondition names it."""
    import numpy as np
    from onnx import helper, numpy_helper

    graphs = list(graphs_in(model.graph))
    inits = {i.name: i for g in graphs for i in g.initializer}
    uses: dict[str, int] = {}
    for graph in graphs:
        for node in graph.node:
            for name in node.input:
                uses[name] = uses.get(name, 0) + 1

    def own_constant(name: str) -> bool:
        return name in inits and uses.get(name, 0) == 1

    count, changed = 0, set()
    for graph in reversed(graphs):  # bodies first: re-adding a parent's nodes copies the bodies in them
        out = []
        for node in graph.node:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            b = node.input[1] if len(node.input) > 1 else ""
            c = node.input[2] if len(node.input) > 2 else ""
            alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
            if (node.op_type != "Gemm" or node.name not in names or attrs.get("transA", 0) or not own_constant(b)
                    or (c and beta != 1.0 and not own_constant(c))):
                out.append(node)
                continue
            weight = numpy_helper.to_array(inits[b])
            weight = (weight.T if attrs.get("transB", 0) else weight) * weight.dtype.type(alpha)
            inits[b].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(weight), b))
            if c and beta != 1.0:
                bias = numpy_helper.to_array(inits[c])
                inits[c].CopyFrom(numpy_helper.from_array(bias * bias.dtype.type(beta), c))
            product = f"{node.output[0]}_matmul" if c else node.output[0]
            out.append(helper.make_node("MatMul", [node.input[0], b], [product], name=node.name))
            if c:
                out.append(helper.make_node("Add", [product, c], [node.output[0]], name=f"{node.name}_bias"))
            changed.add(b)
            count += 1
        del graph.node[:]
        graph.node.extend(out)
    # the transposed weights' old shapes must not linger in shape annotations (shape inference compares)
    for graph in graphs:
        kept = [v for v in graph.value_info if v.name not in changed]
        del graph.value_info[:]
        graph.value_info.extend(kept)
    for graph_input in model.graph.input:
        if graph_input.name in changed:  # old IR versions list initializers as inputs too
            dims = graph_input.type.tensor_type.shape.dim
            for dim, size in zip(dims, inits[graph_input.name].dims, strict=False):
                dim.Clear()
                dim.dim_value = size
    return count


def check_quantized(nodes: list[str], model_out: Path, what: str) -> None:
    """Postcondition: no planned node is left computing with a float weight straight from an initializer
    (dynamic quantization replaces the node; static QDQ feeds its weight through DequantizeLinear)."""
    import onnx
    from onnx import TensorProto

    model = onnx.load(str(model_out), load_external_data=False)
    graphs = list(graphs_in(model.graph))
    floats = {i.name for g in graphs for i in g.initializer if i.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16)}
    planned = set(nodes)
    # an LSTM keeps its name and op type only when the quantizer skipped it (it becomes DynamicQuantizeLSTM)
    left = [f"{n.name} ({n.op_type})" for g in graphs for n in g.node
            if n.name in planned and n.op_type in ("MatMul", "Gemm", "Conv", "LSTM") and len(n.input) > 1
            and n.input[1] in floats]
    if left:
        raise BadInput(f"{what}: onnxruntime left {len(left)} of {len(planned)} planned node(s) in float: "
                       f"{', '.join(left[:3])}{' …' if len(left) > 3 else ''}",
                       fix="keep them float with [quantization] keep_float (the report would otherwise claim INT8), "
                           "or report the model's pattern")


def _static(plan: Plan, model_in: Path, model_out: Path, calibration: list[dict] | None) -> dict:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    nodes = plan.nodes_at("int8")
    if not nodes:
        shutil.copyfile(model_in, model_out)
        return {"method": "static", "nodes": 0}
    if not calibration:
        raise BadInput("static INT8 needs calibration data, and the project has none",
                       fix="add [calibration] data = \"….npz\" (or module:callable) with real inputs to the project")
    quantize_static(
        model_in, model_out, calibration_reader(calibration), quant_format=QuantFormat.QDQ,
        op_types_to_quantize=_op_types(model_in, nodes), nodes_to_quantize=nodes, per_channel=plan.per_channel,
        reduce_range=plan.reduce_range, activation_type=getattr(QuantType, _QTYPE[plan.activation_type]),
        weight_type=getattr(QuantType, _QTYPE[plan.weight_type]),
        calibrate_method=getattr(CalibrationMethod, _CALIBRATION[plan.calibration_method]),
        extra_options={"ActivationSymmetric": plan.activation_symmetric, "WeightSymmetric": True,
                       "CalibTensorRangeSymmetric": plan.activation_symmetric},
        calibration_providers=["CPUExecutionProvider"], use_external_data_format=False,
    )
    check_quantized(nodes, model_out, "static INT8")
    return {"method": "static", "nodes": len(nodes), "samples": len(calibration), "calibration": plan.calibration_method,
            "activation_type": plan.activation_type, "reduce_range": plan.reduce_range, "per_channel": plan.per_channel}


def _npu_static(plan: Plan, model_in: Path, model_out: Path, calibration: list[dict] | None) -> dict:
    """Full-integer QDQ through ORT's QNN config: every op quantized, except the groups the ladder moved
    to FP16 (they run as float, in FP16 on the HTP); groups at a16w8 get 16-bit activations by tensor
    overrides (the config inserts the 8↔16-bit converts)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    if not calibration:
        raise BadInput("NPU (full-integer) quantization needs calibration data, and the project has none",
                       fix="add [calibration] data = \"….npz\" (or module:callable) with real inputs to the project")
    act16 = plan.activation_type == "uint16"
    overrides: dict[str, list[dict]] = {}
    if not act16:
        wanted = set(plan.nodes_at("a16w8"))
        model = onnx.load(str(model_in), load_external_data=False)
        weights = {i.name for i in model.graph.initializer}
        for node in model.graph.node:
            if node.name in wanted:  # every activation in and out: a recurrent cell's state too
                for tensor in [*node.input, *node.output]:
                    if tensor and tensor not in weights:
                        overrides[tensor] = [{"quant_type": QuantType.QUInt16}]
    # float on the HTP is FP16 (fp32: ranking isolation); float_nodes are the rule's (attention masks, softmax)
    excluded = plan.nodes_at("fp16") + plan.nodes_at("fp32") + list(plan.float_nodes)
    config = get_qnn_qdq_config(
        str(model_in), calibration_reader(calibration),
        calibrate_method=getattr(CalibrationMethod, _CALIBRATION[plan.calibration_method]),
        activation_type=QuantType.QUInt16 if act16 else QuantType.QUInt8,
        # uint8 weights, per-channel or not: with int8 per-channel weights the HTP rejects QDQ LayerNorm
        # ("Failed to add node"; MiniLM: 66 nodes fell back to the CPU, 1 with uint8)
        weight_type=getattr(QuantType, _QTYPE[plan.weight_type]), per_channel=plan.per_channel,
        init_overrides=overrides or None, nodes_to_exclude=excluded or None)
    quantize(str(model_in), str(model_out), config)
    check_quantized(plan.nodes_at("int8") + plan.nodes_at("a16w8"), model_out, "NPU full-integer QDQ")
    _check_activation_bits(plan.nodes_at("a16w8") if not act16 else [], model_out)
    return {"method": "npu-static", "activation_type": plan.activation_type, "per_channel": plan.per_channel,
            "a16_tensors": len(overrides), "fp16_nodes": len(excluded), "samples": len(calibration)}


def _check_activation_bits(nodes: list[str], model_out: Path) -> None:
    """Postcondition for groups the plan put at A16W8 in an 8-bit plan (recurrent state, groups the loop
    moved): their activation inputs arrive through a 16-bit DequantizeLinear."""
    import onnx
    from onnx import TensorProto

    if not nodes:
        return
    model = onnx.load(str(model_out), load_external_data=False)
    inits = {i.name: i.data_type for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    wide = (TensorProto.UINT16, TensorProto.INT16)
    planned = set(nodes)
    narrow = []
    for node in model.graph.node:
        if node.name not in planned:
            continue
        source = producer.get(node.input[0])
        if (source is not None and source.op_type == "DequantizeLinear" and len(source.input) > 2
                and inits.get(source.input[2]) not in wide):
            narrow.append(node.name)
    if narrow:
        raise BadInput(f"NPU full-integer QDQ: {len(narrow)} node(s) planned at A16W8 got 8-bit activations: "
                       f"{', '.join(narrow[:3])}", fix="keep them float with [quantization] keep_float, or report the "
                       "model's pattern")


def _float16(plan: Plan, model_in: Path, model_out: Path) -> dict:
    """ORT's FP16 converter with I/O kept FP32 (callers feed FP32): blocked are the rule's op types, the
    ungrouped nodes it keeps, and the weighted nodes of groups at fp32. Then the weights are checked."""
    import onnx
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    model = onnx.load(str(model_in))
    kept = [*plan.nodes_at(FLOAT), *plan.float_nodes]
    converted = convert_float_to_float16(model, keep_io_types=True, node_block_list=kept or None,
                                         op_block_list=sorted(set(DEFAULT_OP_BLOCK_LIST) | set(plan.float_ops)))
    _merge_repeated_casts(converted)
    _check_weight_precision(plan, converted)
    onnx.save(converted, str(model_out))
    return {"method": "float16", "fp16_nodes": len(plan.nodes_at("fp16")), "fp32_nodes": len(kept),
            "fp32_op_types": list(plan.float_ops), "casts": sum(n.op_type == "Cast" for n in converted.graph.node),
            "io": "float32 (the converter keeps graph inputs and outputs FP32)"}


def _merge_repeated_casts(model) -> None:
    """onnxruntime 1.31's converter writes one Cast back to FP32 per blocked consumer of an FP16 tensor,
    all with the same name and output, which no runtime loads ("two nodes with same node name"; tiny-lm's
    RMSNorms, seen on an H100 with onnxruntime-gpu 1.31.1). 1.32 writes one shared Cast; so do we."""
    casts, nodes = set(), []
    for node in model.graph.node:
        if node.op_type == "Cast":
            key = node.SerializeToString()
            if key in casts:
                continue
            casts.add(key)
        nodes.append(node)
    names, infos = set(), []
    for info in model.graph.value_info:
        if info.name not in names:
            names.add(info.name)
            infos.append(info)
    if len(nodes) < len(model.graph.node):
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    if len(infos) < len(model.graph.value_info):
        del model.graph.value_info[:]
        model.graph.value_info.extend(infos)


def _check_weight_precision(plan: Plan, model) -> None:
    """Postcondition: every planned node whose weight is an initializer of its own holds it in the
    plan's precision (the converter skips what it cannot handle without saying so). A weight is a
    floating-point initializer in any input slot: a Gather's table is its first input, and its integer
    indices (a learned position embedding's constant positions) are no weight at all."""
    from onnx import TensorProto

    floating = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)
    initializers = {i.name: i.data_type for i in model.graph.initializer if i.data_type in floating}
    uses: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    by_name = {n.name: n for n in model.graph.node}
    want = {"fp16": TensorProto.FLOAT16, FLOAT: TensorProto.FLOAT}
    planned = [(name, group.group, group.precision) for group in plan.groups for name in group.nodes]
    planned += [(name, "kept float by the rule", FLOAT) for name in plan.float_nodes]
    wrong = []
    for name, where, precision in planned:
        node = by_name.get(name)
        weight = next((i for i in (node.input if node is not None else []) if i in initializers), None)
        if weight is None or uses.get(weight, 0) != 1:  # computed or shared weights: not checkable here
            continue
        if initializers[weight] != want[precision]:
            wrong.append(f"{name} ({where}: planned {precision})")
    if wrong:
        raise BadInput(f"the FP16 conversion did not follow the plan for {len(wrong)} node(s): {', '.join(wrong[:3])}",
                       fix="keep those groups float with [quantization] keep_float, or use precision = \"fp32\"")


def _weight_only(plan: Plan, model_in: Path, model_out: Path, calibration: list[dict] | None) -> dict:
    """MatMulNBits for the groups at int4 (and int8-weight, the ladder's next rung); nothing else.

    ORT's quantizer ORs `nodes_to_include` with its op types, so it would quantize every MatMul (the
    lm_head the rules keep float, the groups the loop moved up): the plan goes in as `nodes_to_exclude`
    (everything not at this rung), and the result is checked against the plan."""
    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits

    model = onnx.load(str(model_in))
    # MatMulNBits replaces MatMul only: a Linear exported as Gemm becomes MatMul (+ Add) first
    rewritten = gemm_as_matmul(model, set(plan.nodes_at("int4")) | set(plan.nodes_at("int8-weight")))
    done = {}
    for precision, bits in (("int4", 4), ("int8-weight", 8)):
        nodes = set(plan.nodes_at(precision))
        if not nodes:
            continue
        if plan.int4_algorithm == "gptq" and bits == 4:
            if not calibration:
                raise BadInput("int4_algorithm = \"gptq\" needs calibration data, and the project has none",
                               fix="add [calibration] data to the project, or use int4_algorithm = \"rtn\"")
            algo = nbits.GPTQWeightOnlyQuantConfig(calibration_data_reader=calibration_reader(calibration),
                                                   block_size=plan.block_size, percdamp=0.01, actorder=False)
        else:
            algo = nbits.DefaultWeightOnlyQuantConfig(block_size=plan.block_size, is_symmetric=True,
                                                      accuracy_level=None, bits=bits)
        others = sorted(n.name for n in model.graph.node if n.name not in nodes)
        quantizer = _planned_nbits()(model, bits=bits, block_size=plan.block_size, is_symmetric=True,
                                     nodes_to_exclude=others, algo_config=algo)
        quantizer.process()
        model = quantizer.model.model if hasattr(quantizer.model, "model") else quantizer.model
        quantized = {n.name.rsplit("_Q", 1)[0] for n in model.graph.node
                     if n.op_type == "MatMulNBits" and n.name.endswith(f"_Q{bits}")}
        if quantized != nodes:
            raise BadInput(f"onnxruntime's weight-only quantizer did not follow the plan at {precision}: quantized "
                           f"{sorted(quantized - nodes)[:3]} (kept float by the plan), missed {sorted(nodes - quantized)[:3]}",
                           fix="use int4_algorithm = \"rtn\", or report this with the onnxruntime version")
        done[precision] = len(nodes)
    onnx.save(model, str(model_out))
    return {"method": "weight-only", "nodes": done, "block_size": plan.block_size, "algorithm": plan.int4_algorithm,
            "gemm_as_matmul": rewritten}


@functools.cache
def _planned_nbits():
    """ORT's MatMulNBitsQuantizer, defined on first use (onnxruntime loads lazily), that skips excluded
    nodes on every algorithm path."""
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits

    class PlannedNBits(nbits.MatMulNBitsQuantizer):
        """The GPTQ path (Intel Neural Compressor code vendored in ORT) ignores `nodes_to_exclude`; its
        per-node config takes "fp32" as "skip" (as ORT's own RTN path writes it)."""

        def _generate_q4_node_config(self):
            config = super()._generate_q4_node_config()
            return {name: "fp32" if name in self.nodes_to_exclude else cfg for name, cfg in config.items()}

    return PlannedNBits
