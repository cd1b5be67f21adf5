"""Small synthetic ONNX graphs, one per model family, built with onnx.helper (real random weights).

Each builder returns a ModelProto that ONNX Runtime loads and runs; the detector tests label them,
the rule tests plan them, the loop test quantizes one.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8


class Builder:
    def __init__(self, seed: int = 0):
        self.nodes: list = []
        self.inits: list = []
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def const(self, array: np.ndarray, prefix: str = "c") -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(
        self, op_type: str, inputs: list[str], prefix: str | None = None, outputs: int = 1, **attrs
    ) -> str | list[str]:
        name = self.name(prefix or op_type.lower())
        outs = [f"{name}_out{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs[0] if outputs == 1 else outs

    def linear(
        self, x: str, n_in: int, n_out: int, prefix: str = "linear", bias: bool = True, scale: float | None = None
    ) -> str:
        w = self.rng.normal(0, scale or n_in**-0.5, (n_in, n_out)).astype(np.float32)
        y = self.op("MatMul", [x, self.const(w, "w")], prefix)
        return self.op("Add", [y, self.const(np.zeros(n_out, np.float32), "b")], prefix + "_bias") if bias else y

    def layernorm(self, x: str, d: int) -> str:
        return self.op(
            "LayerNormalization",
            [x, self.const(np.ones(d, np.float32)), self.const(np.zeros(d, np.float32))],
            "ln",
            axis=-1,
        )

    def rmsnorm(self, x: str, d: int) -> str:
        sq = self.op("Pow", [x, self.const(np.array(2.0, np.float32))])
        mean = self.op("ReduceMean", [sq], axes=[-1], keepdims=1)
        std = self.op("Sqrt", [self.op("Add", [mean, self.const(np.array(1e-6, np.float32))])])
        return self.op("Mul", [self.op("Mul", [x, self.op("Reciprocal", [std])]), self.const(np.ones(d, np.float32))])

    def model(self, inputs: list, outputs: list) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "synthetic", inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = IR_VERSION
        for out in model.graph.output:  # outputs built with shape [] mean "unknown": let inference fill them
            if not out.type.tensor_type.shape.dim:
                out.type.tensor_type.ClearField("shape")
        return model


def transformer(
    causal: bool = False,
    layers: int = 2,
    d: int = 32,
    heads: int = 2,
    seq: int = 8,
    vocab: int = 64,
    lm_head: bool = False,
    swiglu: bool = False,
    tied: bool = False,
) -> onnx.ModelProto:
    """A BERT-like encoder (LayerNorm, GELU, padding mask) or a decoder (RMSNorm, causal mask, SwiGLU, LM head;
    `tied`: the head reads the embedding table through a Transpose, as tied embeddings export)."""
    b = Builder()
    dh = d // heads
    table = b.const(b.rng.normal(0, 1, (vocab, d)).astype(np.float32), "embed")
    x = b.op("Gather", [table, "input_ids"], "embedding")
    for _ in range(layers):
        h = b.rmsnorm(x, d) if causal else b.layernorm(x, d)

        def split(t: str) -> str:
            r = b.op("Reshape", [t, b.const(np.array([1, seq, heads, dh], np.int64))])
            return b.op("Transpose", [r], perm=[0, 2, 1, 3])

        q, k, v = (split(b.linear(h, d, d, p, bias=not causal)) for p in ("q_proj", "k_proj", "v_proj"))
        kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
        scores = b.op("Mul", [b.op("MatMul", [q, kt], "scores"), b.const(np.array(dh**-0.5, np.float32))])
        if causal:
            mask = b.const(np.tril(np.ones((seq, seq), bool)), "causal_mask")
            scores = b.op("Where", [mask, scores, b.const(np.array(-np.inf, np.float32))])
        else:
            scores = b.op("Add", [scores, b.const(np.zeros((1, 1, 1, seq), np.float32), "pad_mask")])
        ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v], "context")
        merged = b.op(
            "Reshape", [b.op("Transpose", [ctx], perm=[0, 2, 1, 3]), b.const(np.array([1, seq, d], np.int64))]
        )
        x = b.op("Add", [x, b.linear(merged, d, d, "o_proj", bias=not causal)], "residual")
        h = b.rmsnorm(x, d) if causal else b.layernorm(x, d)
        if swiglu:
            gate = b.linear(h, d, 4 * d, "gate_proj", bias=False)
            act = b.op("Mul", [gate, b.op("Sigmoid", [gate])])
            inner = b.op("Mul", [act, b.linear(h, d, 4 * d, "up_proj", bias=False)])
        else:
            inner = _gelu(b, b.linear(h, d, 4 * d, "fc1"))
        x = b.op("Add", [x, b.linear(inner, 4 * d, d, "fc2", bias=not causal)], "residual")
    out = x
    if lm_head:
        final = b.rmsnorm(x, d) if causal else b.layernorm(x, d)
        out = (
            b.op("MatMul", [final, b.op("Transpose", [table], perm=[1, 0])], "lm_head")
            if tied
            else b.linear(final, d, vocab, "lm_head", bias=False)
        )
    y = b.op("Identity", [out], "output")
    return b.model(
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [])],
    )


def _gelu(b: Builder, x: str) -> str:
    """GELU as exporters write it at opset < 20: x * 0.5 * (1 + erf(x / sqrt 2))."""
    erf = b.op("Erf", [b.op("Div", [x, b.const(np.array(np.sqrt(2), np.float32))])])
    return b.op(
        "Mul",
        [b.op("Mul", [x, b.op("Add", [erf, b.const(np.array(1.0, np.float32))])]), b.const(np.array(0.5, np.float32))],
    )


def cnn(depthwise: bool = True) -> onnx.ModelProto:
    b = Builder()

    def conv(x: str, c_in: int, c_out: int, group: int = 1) -> str:
        w = b.rng.normal(0, (9 * c_in / group) ** -0.5, (c_out, c_in // group, 3, 3)).astype(np.float32)
        y = b.op(
            "Conv",
            [x, b.const(w, "w"), b.const(np.zeros(c_out, np.float32), "b")],
            "conv",
            pads=[1, 1, 1, 1],
            group=group,
        )
        return b.op("Relu", [y])

    x = conv("image", 3, 8)
    x = conv(x, 8, 8, group=8) if depthwise else conv(x, 8, 8)
    x = conv(x, 8, 16)
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    w = b.const(b.rng.normal(0, 0.25, (10, 16)).astype(np.float32))
    y = b.op("Gemm", [x, w, b.const(np.zeros(10, np.float32))], "fc", transB=1)
    return b.model(
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 10])],
    )


def recurrent(features: int = 16, hidden: int = 32, seq: int = 10, cell: str = "LSTM") -> onnx.ModelProto:
    b = Builder()
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[cell]
    x = b.linear("features", features, hidden, "in_proj")
    w = b.const(b.rng.normal(0, 0.1, (1, gates * hidden, hidden)).astype(np.float32))
    r = b.const(b.rng.normal(0, 0.1, (1, gates * hidden, hidden)).astype(np.float32))
    out = b.op(cell, [x, w, r], cell.lower(), outputs=2 if cell != "LSTM" else 3, hidden_size=hidden)[0]
    y = b.linear(b.op("Squeeze", [out, b.const(np.array([1], np.int64))]), hidden, 29, "ctc_head")
    return b.model(
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [seq, 1, features])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [])],
    )


def diffusion() -> onnx.ModelProto:
    b = Builder()
    freqs = b.const(np.exp(-np.arange(8) / 8).astype(np.float32)[None])
    angles = b.op("Mul", [b.op("Unsqueeze", ["timestep", b.const(np.array([1], np.int64))]), freqs])
    temb = b.op("Concat", [b.op("Sin", [angles]), b.op("Cos", [angles])], axis=-1)
    temb = b.linear(temb, 16, 8, "time_mlp")
    x = b.op(
        "Conv", ["latent", b.const(b.rng.normal(0, 0.2, (8, 4, 3, 3)).astype(np.float32))], "conv_in", pads=[1, 1, 1, 1]
    )
    x = b.op("Add", [x, b.op("Unsqueeze", [temb, b.const(np.array([2, 3], np.int64))])])
    for _ in range(2):
        x = b.op(
            "Relu",
            [
                b.op(
                    "Conv",
                    [x, b.const(b.rng.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32))],
                    "conv",
                    pads=[1, 1, 1, 1],
                )
            ],
        )
    y = b.op("Conv", [x, b.const(b.rng.normal(0, 0.2, (4, 8, 3, 3)).astype(np.float32))], "conv_out", pads=[1, 1, 1, 1])
    return b.model(
        [
            helper.make_tensor_value_info("latent", TensorProto.FLOAT, [1, 4, 16, 16]),
            helper.make_tensor_value_info("timestep", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 4, 16, 16])],
    )


def mlp(width: int = 64, layers: int = 4, planted: int | None = None, seed: int = 0) -> onnx.ModelProto:
    """A ReLU MLP. `planted=i`: the input activation of layer i has one channel 1000× the others
    (layer i-1 scales that output channel up, layer i scales its weight row down: same function in
    FP32, but a per-tensor activation range 1000× too wide for every other channel)."""
    b = Builder(seed)
    weights = [b.rng.normal(0, (2 / width) ** 0.5, (width, width)).astype(np.float32) for _ in range(layers)]
    if planted is not None:
        weights[planted - 1][:, 0] *= 1000.0
        weights[planted][0, :] /= 1000.0
    x = "x"
    for i, w in enumerate(weights):
        y = b.op("MatMul", [x, b.const(w, f"w{i}")], f"layer{i}")
        x = b.op("Relu", [y]) if i < layers - 1 else y
    return b.model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, width])],
    )


def conv_recurrent(
    channels: int, hidden: int, deep: bool = False, steps: int = 20, bins: int = 16, cell: str = "LSTM"
) -> onnx.ModelProto:
    """A keyword-spotter shape: conv front-end over a [1, 1, steps, bins] spectrogram, an LSTM (or `cell`) over
    the steps, a linear head. `deep` adds a second, channels×channels conv (a conv-dominated model)."""
    b = Builder()

    def conv(x: str, c_in: int, c_out: int) -> str:
        w = b.rng.normal(0, (9 * c_in) ** -0.5, (c_out, c_in, 3, 3)).astype(np.float32)
        return b.op(
            "Relu",
            [b.op("Conv", [x, b.const(w, "w"), b.const(np.zeros(c_out, np.float32), "b")], "conv", pads=[1, 1, 1, 1])],
        )

    x = conv("spectrogram", 1, channels)
    if deep:
        x = conv(x, channels, channels)
    x = b.op("Transpose", [x], perm=[2, 0, 1, 3])  # [steps, 1, channels, bins]
    x = b.op("Reshape", [x, b.const(np.array([steps, 1, channels * bins], np.int64))])
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[cell]
    w = b.const(b.rng.normal(0, 0.1, (1, gates * hidden, channels * bins)).astype(np.float32))
    r = b.const(b.rng.normal(0, 0.1, (1, gates * hidden, hidden)).astype(np.float32))
    out = b.op(cell, [x, w, r], cell.lower(), outputs=3 if cell == "LSTM" else 2, hidden_size=hidden)[0]
    y = b.linear(b.op("Squeeze", [out, b.const(np.array([1], np.int64))]), hidden, 12, "head")
    return b.model(
        [helper.make_tensor_value_info("spectrogram", TensorProto.FLOAT, [1, 1, steps, bins])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [])],
    )
