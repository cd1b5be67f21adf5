"""Sweeps: sampled configurations of each kernel class, measured on the device, as what the kernel predictors
learn from (`tapeout calibrate --sweep DEVICE`, docs/estimator.md).

A configuration is one small ONNX model holding one kernel as the estimator sees it (`cost_units.structure`: a
MatMul with its bias, a Conv with its bias and activation, a LayerNormalization, an Add, a Transpose, an LSTM…),
drawn from a log-uniform range of sizes per class. Each is measured on the target as a build measures a model
(fresh processes, `measurement/kernel_timer.py`), beside a one-Identity model, whose time is what the runtime
costs per run with one trivial node, and chains of one and nine Neg nodes on one element, whose difference is
what each node costs the runtime to dispatch. The kernel's time is the model's less the run's cost without any
node (Identity's less one dispatch), so it keeps its own dispatch: a model of many kernels pays one per kernel,
and an estimate sums them on the run's cost. On OpenVINO (definition 5, `PROFILED`) it is the kernel's layers as the
plugin's own counters timed them, with a dispatch measured on a Softmax chain. The draws are `sweep_draws.py`'s. The estimator's features of the same kernel (FLOPs, bytes, roofline
time at the device's roof) go beside it, so the predictors learn from what they will be asked about.

The sweep file (`<calibration folder>/sweeps/<device>--<target>.json`, schema `tapeout.sweep/1`) is rewritten
after every chunk: a sweep stopped by its time budget, Ctrl-C or a lost process goes on where it stopped.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tapeout.core.errors import BadInput
from tapeout.core.files import write_text

SCHEMA = "tapeout.sweep/1"
# how a point's kernel time is taken: 1, the run's p50 less Identity's (the first sweeps); 2, less the run's cost
# without any node and the reorders the runtime put around the kernel, with a conv's shape; 3, as 2 with a MaxPool's
# FLOPs counting its window (an output per window element), its window and stride drawn, and the layout reorders ONNX
# Runtime puts around a lone one taken out as a conv's are; 4, as 3 with a uint8 MaxPool timed on quantized feature
# maps, not uniform bytes (`kernel_timer.feature_maps`: its compare loop follows the data). Never mixed in a file: an
# older file loads as a 4 without the points it took otherwise (`load`): a definition-2 file without its MaxPools (all
# 3×3 stride 2 counted as 1×1), a definition-3 one without its uint8 MaxPools.
# 5 (a target whose kernels are timed by its own profiler, OpenVINO): a point's kernel time is its nodes' profiled
# time a run plus one dispatch, and the run's cost without a kernel is what a one-node chain's run takes beyond its
# node's profiled time (`PROFILED`). A lone kernel's run there costs more than the kernel does in a model: OpenVINO
# ran a lone 128 × 1024 ReLU 40 µs past its profiled 21 and a one-Softmax model 7.6 µs past Identity's, where
# distilbert-m's run took 2.5 % past its 68 layers' profiled sum, and its FullyConnecteds ran as profiled.
DEFINITION = 4
PROFILED_DEFINITION = 5
# `attention`: the scores, softmax and weighted sum an OpenVINO MHA subgraph runs as one kernel (no other target's
# kernel: ONNX Runtime's CPU EP runs a model's attention as its MatMuls and Softmax, each swept in its own class)
CLASSES = ("matmul", "conv", "reduce", "elementwise", "movement", "recurrent", "quantize", "attention")
OPSET = 17
GELU_OPSET = 20   # the ONNX Gelu op (as torch exports a transformer's MLP at opset 20)
MATMUL_NODE = "mm"  # the MatMul's name: what an INT8 configuration's plan quantizes
CELL_NODE = "cell"  # the LSTM's name: what an INT8 cell's plan quantizes (DynamicQuantizeLSTM)
CONV_NODE = "cv"    # the Conv's name: what an INT8 conv's plan quantizes (its weighted node, as a CNN's plan lists it)
# inputs that are not FP32: a Gather's indices, a DequantizeLinear's 8-bit input
INPUT_DTYPES = {"ids": "int64", "q8": "uint8"}


class Point(BaseModel):
    """One measured configuration."""

    model_config = ConfigDict(extra="forbid")

    key: str                               # the configuration, as a stable string
    cls: str
    op: str
    # what the kernel runs in, as a build's plan puts it: "int8", a MatMul quantized as the CPU rules' dynamic
    # method writes it (weights per channel, activations per call), which ONNX Runtime runs as one
    # DynamicQuantizeMatMul, its activation quantization inside; or a Conv quantized as their static method writes
    # it (QDQ, weights per channel), which it runs as a QLinearConv, the Q, DQ and NHWC Transposes around a lone
    # one taken out (`inserted_s`): a model runs them where its graph needs them, and the estimate counts those
    precision: str = "fp32"
    quantization: str | None = None        # the method an INT8 point was quantized by (`quantization_of`)
    config: dict[str, int | str]
    flops: float = Field(ge=0)
    bytes: float = Field(ge=0)
    nodes: int = Field(ge=1)
    launches: int = Field(ge=1)
    roof_s: float = Field(ge=0)            # the kernel's roofline time at the sweep's roof
    shape: dict[str, int] = Field(default_factory=dict)  # cost_units.Kernel.shape: a conv's, as the estimator sees it
    kernel_s: float                        # p50 of the model's run less the run's cost without a node, same process
    run_s: float = Field(gt=0)
    # p50 of the one-Identity model, same process; where the kernels are profiled (definition 5), the one-node chain's
    # p50 less its node's profiled time
    baseline_s: float = Field(gt=0)
    dispatch_s: float = Field(0.0, ge=0)   # one node's dispatch (Neg×9 − Neg×1)/8; 0 in sweeps made before it was
    # seconds per run of the nodes the runtime inserted around the kernel (layout reorders), by op type, from a
    # profiled pass: taken out of kernel_s (a lone Conv pays reorders on both sides, a CNN once for the graph)
    inserted_s: dict[str, float] = Field(default_factory=dict)
    # views (a Reshape) in the model beside its kernel, each a dispatch taken out of kernel_s: ONNX Runtime fuses no
    # GELU whose last node writes the graph's output
    views: int = Field(0, ge=0)
    # the model's inputs beyond the first, each `input_s` taken out of kernel_s (`TWO_INPUTS`: a target that sets its
    # inputs per call, OpenVINO); 0 in sweeps that did not take it out
    inputs: int = Field(1, ge=1)
    input_s: float = Field(0.0, ge=0)

    spread: float = Field(ge=0)            # (p90 − p10) / p50 of the model's runs
    runs: int = Field(ge=1)
    # the seconds a run its nodes took as the runtime's profiler timed them, the inserted ones left out: the kernel's
    # time where its target's kernels are timed so (definition 5); None where they are not
    profiled_s: float | None = Field(None, ge=0)


def definition_for(target: str) -> int:
    """How a sweep on `target` takes its points' kernel times (DEFINITION; PROFILED_DEFINITION for a target whose
    kernels are timed by its profiler, `PROFILED`)."""
    return PROFILED_DEFINITION if target in PROFILED else DEFINITION


class SweepFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_: str = Field(alias="schema")
    definition: int = 1                    # DEFINITION of its points' kernel times (absent: the first sweeps')
    pricing: int = 1                       # sweep_pricing.PRICING of its points' roof_s (absent: the first)
    device: str
    target: str
    host: str                              # roofline.host_key of the CPU it ran on
    threads: int = Field(ge=0)
    roof: dict[str, Any]                   # Roof.to_json() the roofline times are priced at
    host_speed: list[dict[str, Any]] = Field(default_factory=list)  # host_speed.host_state() before each chunk
    seconds: float = Field(0.0, ge=0)      # measuring time spent so far
    points: list[Point] = Field(default_factory=list)


@dataclass(frozen=True)
class Config:
    cls: str
    op: str
    sizes: tuple[tuple[str, int | str], ...]

    @property
    def key(self) -> str:
        return f"{self.op}:" + ",".join(f"{k}={v}" for k, v in self.sizes)

    def __getitem__(self, name: str):
        return dict(self.sizes)[name]


def model(config: Config, rng_seed: int = 0):
    """(onnx ModelProto, [(input name, shape)]) holding the configuration's one kernel."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(rng_seed)
    inits, nodes = [], []

    def weight(name: str, shape) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.05).astype(np.float32), name))
        return name

    def scalar(name: str, value: float) -> str:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), name))
        return name

    def weight_int(name: str, values) -> str:
        inits.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    op, s = config.op, dict(config.sizes)
    opset = OPSET
    if config.cls == "baseline" and "nodes" in s:  # a dispatch chain (`chain`): Neg on one element, Softmax on 16
        names = ["x", *(f"n{i}" for i in range(1, s["nodes"])), "y"]
        nodes += [helper.make_node(op, [a], [b], **({"axis": -1} if op == "Softmax" else {}))
                  for a, b in itertools.pairwise(names)]
        inputs = [("x", [1] if op == "Neg" else [1, 16])]
    elif op == "Gemm":  # a torch Linear as exported: its weight transposed, its bias inside
        nodes.append(helper.make_node("Gemm", ["x", weight("w", (s["n"], s["k"])), weight("b", (s["n"],))], ["y"],
                                      transB=1, name=MATMUL_NODE))
        inputs = [("x", [s["m"], s["k"]])]
    elif op == "MatMul":
        shape = [s["m"], s["k"]]
        act = s.get("act")
        nodes.append(helper.make_node("MatMul", ["x", weight("w", (s["k"], s["n"]))], ["mm" if s["bias"] else "y"],
                                      name=MATMUL_NODE))
        if s["bias"]:
            nodes.append(helper.make_node("Add", ["mm", weight("b", (s["n"],))], ["biased" if act else "y"]))
        if act:
            nodes.append(helper.make_node(act, ["biased"], ["y"]))
            opset = GELU_OPSET
        inputs = [("x", shape)]
    elif op == "Conv":
        shape = [1, s["c"], s["hw"], s["hw"] * s.get("wide", 1)]
        pad = s["k"] // 2
        nodes.append(helper.make_node("Conv", ["x", weight("w", (s["co"], s["c"] // s["groups"], s["k"], s["k"])),
                                               weight("b", (s["co"],))], ["cv" if s["relu"] else "y"],
                                      pads=[pad] * 4, strides=[s["stride"]] * 2, group=s["groups"], name=CONV_NODE))
        if s["relu"]:
            nodes.append(helper.make_node("Relu", ["cv"], ["y"]))
        inputs = [("x", shape)]
    elif op == "Conv1d":
        pad = s["k"] // 2 if s["k"] % 2 else 0
        nodes.append(helper.make_node("Conv", ["x", weight("w", (s["co"], s["c"] // s["groups"], s["k"])),
                                               weight("b", (s["co"],))], ["cv" if s["relu"] else "y"],
                                      pads=[pad, pad], strides=[s["stride"]], group=s["groups"]))
        if s["relu"]:
            nodes.append(helper.make_node("Relu", ["cv"], ["y"]))
        inputs = [("x", [1, s["c"], s["len"]])]
    elif op in ("GlobalAveragePool", "MaxPool"):
        k, stride = s.get("k", 3), s.get("stride", 2)  # a window's size and step (3×3 stride 2 in definition 2)
        pad = 1 if k == 3 else 0
        extra = {"kernel_shape": [k, k], "strides": [stride, stride], "pads": [pad] * 4} if op == "MaxPool" else {}
        source = "q8" if s.get("precision") == "int8" else "x"  # a uint8 tensor in, a uint8 tensor out
        nodes.append(helper.make_node(op, [source], ["y"], **extra))
        inputs = [(source, [1, s["c"], s["hw"], s["hw"]])]
    elif op == "LayerNormalization":
        nodes.append(helper.make_node(op, ["x", weight("g", (s["width"],)), weight("b", (s["width"],))], ["y"], axis=-1))
        inputs = [("x", [s["rows"], s["width"]])]
    elif op == "Add+LayerNormalization":
        nodes.append(helper.make_node("Add", ["x", "x2"], ["sum"]))
        nodes.append(helper.make_node("LayerNormalization", ["sum", weight("g", (s["width"],)),
                                                             weight("b", (s["width"],))], ["y"], axis=-1))
        inputs = [("x", [1, s["rows"], s["width"]]), ("x2", [1, s["rows"], s["width"]])]  # 3-D, as ORT fuses it
    elif op == "RMSNorm":
        nodes += [helper.make_node("Pow", ["x", scalar("two", 2.0)], ["squared"]),
                  helper.make_node("ReduceMean", ["squared"], ["mean"], axes=[-1], keepdims=1),
                  helper.make_node("Add", ["mean", scalar("eps", 1e-6)], ["var"]),
                  helper.make_node("Sqrt", ["var"], ["rms"]),
                  helper.make_node("Div", ["x", "rms"], ["normed"]),
                  helper.make_node("Mul", ["normed", weight("g", (s["width"],))], ["y"])]
        inputs = [("x", [1, s["rows"], s["width"]])]
    elif op == "Softmax":
        nodes.append(helper.make_node(op, ["x"], ["y"], axis=-1))
        inputs = [("x", [s["rows"], s["width"]])]
    elif op in ("Add", "Mul"):
        nodes.append(helper.make_node(op, ["x", "x2"], ["y"]))
        inputs = [("x", [s["size"]]), ("x2", [s["size"]])]
    elif op in ("Relu", "Sigmoid", "Tanh", "Erf"):
        nodes.append(helper.make_node(op, ["x"], ["y"]))
        inputs = [("x", [s["size"]])]
    elif op == "GeluTanh":
        nodes += [helper.make_node("Pow", ["x", scalar("three", 3.0)], ["cube"]),
                  helper.make_node("Mul", ["cube", scalar("c", 0.044715)], ["cubic"]),
                  helper.make_node("Add", ["x", "cubic"], ["inner"]),
                  helper.make_node("Mul", ["inner", scalar("k", math.sqrt(2 / math.pi))], ["scaled"]),
                  helper.make_node("Tanh", ["scaled"], ["t"]),
                  helper.make_node("Add", ["t", scalar("one", 1.0)], ["t1"]),
                  helper.make_node("Mul", ["x", scalar("half", 0.5)], ["halved"]),
                  helper.make_node("Mul", ["halved", "t1"], ["gelu"]),
                  # ONNX Runtime fuses no GELU whose last node writes a graph output: a view after it, whose
                  # dispatch the point's time leaves out (`features_of`: "views")
                  helper.make_node("Reshape", ["gelu", weight_int("shape", [1, s["size"]])], ["y"])]
        inputs = [("x", [1, s["size"]])]
    elif op == "Transpose":
        nodes.append(helper.make_node(op, ["x"], ["y"], perm=[0, 2, 1] if s.get("inner") else [1, 0, 2]))
        inputs = [("x", [s["a"], s["b"], s["c"]])]
    elif op == "Concat":
        nodes.append(helper.make_node(op, ["x", "x2"], ["y"], axis=1))
        inputs = [("x", [s["a"], s["b"], s["c"]]), ("x2", [s["a"], s["b"], s["c"]])]
    elif op == "Gather":
        nodes.append(helper.make_node(op, [weight("table", (s["vocab"], s["width"])), "ids"], ["y"], axis=0))
        inputs = [("ids", [s["rows"]])]
    elif op in ("QuantizeLinear", "DequantizeLinear"):
        inits.append(numpy_helper.from_array(np.array(128, np.uint8), "zero"))
        source = "x" if op == "QuantizeLinear" else "q8"
        nodes.append(helper.make_node(op, [source, scalar("scale", 0.02), "zero"], ["y"]))
        inputs = [(source, [1, s["size"]])]
    elif op in ("LSTM", "GRU"):
        gates = 4 if op == "LSTM" else 3
        h = s["hidden"]
        nodes.append(helper.make_node(op, ["x", weight("W", (1, gates * h, s["input"])), weight("R", (1, gates * h, h)),
                                           weight("B", (1, 2 * gates * h))], ["y"], hidden_size=h, name=CELL_NODE))
        inputs = [("x", [s["steps"], 1, s["input"]])]
    elif op == "Attention":  # named as torch names a model's nodes: OpenVINO's compiled graph names its layers so
        h, d, q, kv = s["heads"], s["d"], s["q"], s["kv"]
        nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2], name="keys_t"),
                  helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
                  helper.make_node("Mul", ["scores", scalar("scale", d ** -0.5)], ["scaled"], name="scaled")]
        last = "scaled"
        if s["causal"]:  # each query sees the keys up to its own place, the last query all of them
            mask = np.triu(np.full((q, kv), -1e9, np.float32), kv - q + 1)[None, None]
            inits.append(numpy_helper.from_array(mask, "mask"))
            nodes.append(helper.make_node("Add", ["scaled", "mask"], ["masked_scores"], name="masked"))
            last = "masked_scores"
        nodes += [helper.make_node("Softmax", [last], ["probs"], axis=-1, name="probs"),
                  helper.make_node("MatMul", ["probs", "v"], ["y"], name="weighted")]
        inputs = [("q", [1, h, q, d]), ("k", [1, h, kv, d]), ("v", [1, h, kv, d])]
    elif op == "Identity":
        nodes.append(helper.make_node(op, ["x"], ["y"]))
        inputs = [("x", [1])]

    else:
        raise BadInput(f"no sweep model for op {op}", fix="report it: the sweep's ops are listed in sweep_draws.sample")
    kinds = {"int64": TensorProto.INT64, "uint8": TensorProto.UINT8}
    graph = helper.make_graph(nodes, config.key.replace(":", "_")[:60],
                              [helper.make_tensor_value_info(n, kinds.get(INPUT_DTYPES.get(n, ""), TensorProto.FLOAT),
                                                             shape) for n, shape in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8 if op == "QuantizeLinear" or (
                                  op == "MaxPool" and inputs[0][0] == "q8") else TensorProto.FLOAT, None)],
                              initializer=inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 8 if opset == OPSET else 9
    return proto, inputs


IDENTITY = Config("baseline", "Identity", ())
NEG_CHAIN = (1, 9)   # Neg nodes on one element: their difference / 8 is one node's dispatch (Identity chains would
                     # be optimized away: ONNX Runtime eliminates Identity nodes)


def chain(op: str) -> tuple[Config, ...]:
    """The short and the long chain of `op` nodes on one small tensor a one-node dispatch is measured between."""
    return tuple(Config("baseline", op, (("nodes", n),)) for n in NEG_CHAIN)


NEGS = chain("Neg")
# the targets whose kernels are timed by their own profiler (definition 5), and the op their dispatch is measured on:
# OpenVINO's counters are in-process (a run's kernels summed to 97.5 % of distilbert-m's p50); its CPU plugin fuses
# a Neg chain into one JIT subgraph (a dispatch of 0), and a Softmax chain it runs node by node (1.6 µs a node)
PROFILED = {"openvino": "Softmax"}
# an Add on one element: less the one-Neg chain and a dispatch, what a model's second input costs a run. OpenVINO's
# Python API sets each input's tensor on every call: 5.3 µs an input here (ONNX Runtime: ~0.3), which a lone Add's
# point would otherwise count as the Add's, where a model's Adds read tensors already inside it
TWO_INPUTS = Config("baseline", "Add", (("size", 1),))


def input_s(two_inputs_s: float, short_s: float, dispatch: float) -> float:
    """What a run's second input costs, from the p50s of the one-element Add and the one-Neg chain (never below 0)."""
    return max(0.0, two_inputs_s - short_s - dispatch)


def dispatch_s(short_s: float, long_s: float) -> float:
    """One node's dispatch from the p50s of the short and the long Neg chain (never below 0)."""
    return max(0.0, (long_s - short_s) / (NEG_CHAIN[1] - NEG_CHAIN[0]))


def run_costs(p50s: list[float], chain_op: str | None = None) -> tuple[float, float, float] | str:
    """(A run's cost without a node, one node's dispatch, a second input's cost) from a chunk's baselines' p50s, in
    the order `_time_chunk` times them: the Identity model (not where the target's kernels are profiled: `chain_op`
    names its chain's op, and the one-node chain's run is the cost), the short and the long chain, and the two-input
    Add where the target sets its inputs per call. Or why the chunk cannot be used: both targets' chains run node by
    node (`PROFILED`), so a long chain no slower than the short one measured the host's load, not a dispatch of 0;
    and a target whose inputs are timed apart pays for each, so an Add no slower than the chain measured it too."""
    identity, short, long, *two = (None, *p50s) if chain_op else p50s
    dispatch = dispatch_s(short, long)
    if dispatch <= 0:
        return (f"its {NEG_CHAIN[1]}-node {chain_op or 'Neg'} chain ran no slower than its {NEG_CHAIN[0]}-node one "
                f"({long * 1e6:.2f} µs against {short * 1e6:.2f}): the host was busy while it was timed")
    # the one-node chain's run beyond its node, and a second input's beyond that (profiled); else beyond it and a
    # dispatch. The Add is timed only where the target sets each input per call (OpenVINO: ~5 µs), so none is noise
    second = (two[0] - short if chain_op else input_s(two[0], short, dispatch)) if two else 0.0
    if two and second <= 0:
        return (f"its two-input Add ran no slower than its {NEG_CHAIN[0]}-node {chain_op or 'Neg'} chain "
                f"({two[0] * 1e6:.2f} µs against {short * 1e6:.2f}): the host was busy while it was timed")
    return (short if chain_op else identity), dispatch, second


def precision_of(config: Config) -> str:
    """What the configuration's kernel runs in: "fp32", or "int8" for a dynamically quantized MatMul or LSTM or a
    statically quantized Conv."""
    return str(dict(config.sizes).get("precision", "fp32"))


def quantization_of(config: Config, target: str = "onnxruntime") -> str | None:
    """The rules' method an INT8 configuration is quantized by on `target`, as an INT8 build for it quantizes such a
    kernel (`predictor.QUANTIZED_BY`; ONNX Runtime: "dynamic" for a MatMul or an LSTM, "static" for a Conv); None for
    an FP32 one, or a class the target's INT8 builds do not quantize (OpenVINO's NNCF leaves recurrent cells float)."""
    from tapeout.estimation.predictor import QUANTIZED_BY

    if precision_of(config) == "fp32":
        return None
    chosen = dict(config.sizes).get("quantization")  # drawn as another method's kernel (a static QGemm)
    return str(chosen) if chosen and target == "onnxruntime" else QUANTIZED_BY.get(target, {}).get(config.cls)


@dataclass(frozen=True)
class IrModel:
    """An OpenVINO IR as NNCF writes one: the graph (.xml) and its weights (.bin)."""

    xml: bytes
    weights: bytes


def save_model(model, stem: Path) -> Path:
    """`model` (an ONNX ModelProto or an IrModel) written beside `stem`, as the file a target compiles."""
    if isinstance(model, IrModel):
        stem.with_suffix(".bin").write_bytes(model.weights)
        stem.with_suffix(".xml").write_bytes(model.xml)
        return stem.with_suffix(".xml")
    import onnx

    onnx.save(model, str(stem.with_suffix(".onnx")))
    return stem.with_suffix(".onnx")


def timed_model(config: Config, proto, inputs=(), target: str = "onnxruntime"):
    """The model the configuration is timed as: its FP32 one-kernel model, or for an INT8 one that model quantized
    by the rules' own method for `target` (`quantize/methods/`): dynamic (weights int8 per channel, activations uint8
    per call), static (QDQ, weights int8 per channel, activations uint8) or NNCF's (an IrModel; a conv with the CNN
    rule's performance preset, a MatMul with the transformer rule's mixed preset and model type), the static ones
    calibrated on four random inputs."""
    method = quantization_of(config, target)
    if method is None or any(INPUT_DTYPES.get(n) == "uint8" for n, _ in inputs):
        return proto  # FP32, or 8-bit as built (a uint8 MaxPool): nothing to quantize
    import tempfile

    import numpy as np
    import onnx

    from tapeout.quantize import methods
    from tapeout.quantize.ort_tools import quiet
    from tapeout.quantize.plan import GroupPlan, Plan

    nodes = {"matmul": (MATMUL_NODE,), "conv": (CONV_NODE,), "recurrent": (CELL_NODE,)}[config.cls]
    nncf = {"conv": ("performance", None), "matmul": ("mixed", "transformer")}.get(config.cls, (None, None))
    plan = Plan(method=method, family="sweep", target=target, ladder=("int8", "fp32"),
                groups=(GroupPlan(config.cls, config.cls, nodes, "int8", "swept"),),
                **({"preset": nncf[0], "model_type": nncf[1]} if method == "nncf" else {}))
    rng = np.random.default_rng(0)
    calibration = [{n: rng.standard_normal(shape).astype(np.float32) for n, shape in inputs} for _ in range(4)]
    with tempfile.TemporaryDirectory(prefix="tapeout-sweep-q-") as folder, quiet():
        source, out = Path(folder) / "m.onnx", Path(folder) / f"q{methods.get(method).model_suffix}"
        onnx.save(proto, str(source))
        methods.get(method).apply(plan, source, out, None if method == "dynamic" else calibration)
        if out.suffix == ".xml":
            return IrModel(out.read_bytes(), out.with_suffix(".bin").read_bytes())
        return onnx.load(str(out))


def features_of(proto, inputs, roof, precision: str = "fp32", ov_config: dict | None = None
                ) -> dict[str, float] | None:
    """The estimator's view of the model's kernel: FLOPs, bytes, nodes, launches and roofline seconds, and how many
    views (a Reshape: no bytes, one dispatch) the model holds beside it (None where the model is not one kernel to the
    estimator). `precision`: the kernel as a plan putting it there prices it (bytes at that precision, its peak); the
    activation quantization the plan adds beside an INT8 kernel is inside its time here, as inside ONNX Runtime's
    DynamicQuantizeMatMul. `ov_config`: OpenVINO's compile configuration, where a model of several cost units is one
    kernel only as its CPU plugin runs it (an MHA subgraph): mapped as an estimate maps a build's
    (`openvino_graph.mapped`)."""
    import tempfile

    import onnx

    from tapeout.core.schemas import InputSpec
    from tapeout.estimation import cost_units as kern
    from tapeout.estimation import predictor
    from tapeout.graph.analyze import analyze_view
    from tapeout.graph.view import GraphView

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.onnx"
        onnx.save(proto, str(path))
        specs = [InputSpec(name=n, shape=shape, dtype=INPUT_DTYPES.get(n, "float32")) for n, shape in inputs]
        view = GraphView.load(path, specs, {})
        kernels = kern.structure(view, analyze_view(view))
        if ov_config is not None and len([k for k in kernels if k.cls != "movement" or k.bytes]) > 1:
            from tapeout.estimation import openvino_graph

            kernels = openvino_graph.mapped(view, kernels, str(path), ov_config)
    views = [k for k in kernels if k.cls == "movement" and k.bytes == 0]
    kernels = [k for k in kernels if k not in views]
    if len(kernels) != 1:
        return None
    k = kernels[0]
    if precision != "fp32" and any(INPUT_DTYPES.get(n) == "uint8" for n, _ in inputs):
        k = replace(k, precision=precision)  # its tensors 8-bit already (a uint8 MaxPool): its bytes as counted
    elif precision != "fp32":
        k = kern.at_precision([k], {"groups": [{"nodes": [k.lead], "precision": precision}]}, "fp32")[0]
    shape = predictor.with_derived(dict(k.shape), predictor.SHAPE_FEATURES.get(k.cls, ()))  # a conv's layout too
    return {"cls": k.cls, "precision": k.precision, "flops": float(k.flops), "bytes": float(k.bytes), "nodes": k.nodes,
            "launches": k.launches, "roof_s": max(kern.roof_times(k, roof)), "shape": shape, "views": len(views)}


# the ONNX ops a composite configuration's kernel is made of, where its name is not one (`point_shape`)
_COMPOSITE_OPS = {"GeluTanh": ("Pow", "Mul", "Add", "Tanh")}


def point_shape(point: dict) -> dict:
    """A point's shape with what its class's predictor reads that a point swept before the shape kept it lacks: a
    MatMul's m, k and n, a cell's input and hidden (from its configuration), a conv's output width, a kernel's
    `function` (from its op; kernel_shape.function_shape), a Softmax's masked share (its configuration's)."""
    from tapeout.estimation import cost_units as kern
    from tapeout.estimation import softmax_masks

    shape = dict(point.get("shape") or {})
    if point["op"] in ("MatMul", "Gemm") and "m" not in shape:
        shape.update({n: int(point["config"][n]) for n in ("m", "k", "n")})
    if point["op"] in ("Conv", "Conv1d") and "width" not in shape and shape.get("positions"):
        # a point before the width was kept: a square 2-D conv's (its positions' root), a 1-D one's positions
        shape["width"] = math.isqrt(shape["positions"]) if point["op"] == "Conv" else shape["positions"]
    if point["cls"] == "movement" and "run" not in shape:
        c = point["config"]  # Transpose [a, b, c] → [b, a, c] (or `inner`: [a, c, b]); Concat of two on axis 1
        if point["op"] == "Transpose":
            shape["run"] = 1 if c.get("inner") else int(c["c"])
        else:  # a Concat's two [b, c] blocks, a Gather's rows
            shape["run"] = int(c["b"] * c["c"] if point["op"] == "Concat" else c.get("width", 1))
    if point["op"] in ("LSTM", "GRU") and "hidden" not in shape:
        shape.update({n: int(point["config"][n]) for n in ("input", "hidden")})
    if point["op"] == "Softmax":  # what its feed masked (kernel_timer), in percent; its kept shape has the default
        shape["masked"] = softmax_masks.feature(float(point["config"].get("masked", 0)))
    if point["cls"] in kern.FUNCTION_CLASSES and "function" not in shape:
        shape.update(kern.function_shape(point["cls"], _COMPOSITE_OPS.get(point["op"], (point["op"],))))
    return shape


def path_for(device: str, target: str, folder: Path | None = None) -> Path:
    from tapeout.estimation.fit import user_folder

    return (folder or user_folder()) / "sweeps" / f"{device}--{target}.json"


def load(path: Path) -> SweepFile | None:
    if not path.is_file():
        return None
    try:
        found = SweepFile.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError, RecursionError) as exc:
        raise BadInput(f"the sweep file {path} is malformed ({str(exc).splitlines()[0]})",
                       fix="delete it and sweep again") from None
    if found.schema_ != SCHEMA:
        raise BadInput(f"the sweep file {path} has schema {found.schema_!r}, not {SCHEMA}", fix="delete it and sweep again")
    if found.definition in _TAKEN_OTHERWISE:  # its other points are this definition's
        stale = _TAKEN_OTHERWISE[found.definition]
        found = found.model_copy(update={"definition": DEFINITION, "points": [p for p in found.points if not stale(p)]})
    return found


# the points an older definition took otherwise (a 2's MaxPool's FLOPs, a 3's uint8 MaxPool's data: see DEFINITION)
_TAKEN_OTHERWISE = {2: lambda p: p.op == "MaxPool", 3: lambda p: p.op == "MaxPool" and p.precision == "int8"}


def save(sweep: SweepFile, path: Path) -> None:
    write_text(path, json.dumps(sweep.model_dump(by_alias=True)))  # compact: rewritten after every chunk
