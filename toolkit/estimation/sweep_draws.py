"""The sweep's draws: a configuration of each kernel class, its sizes log-uniform over what the sample models and the
zoo run (`sample`), as `sweep.model` writes it into a one-kernel ONNX model."""

from __future__ import annotations

import math
import random

from tapeout.core.errors import BadInput
from tapeout.estimation.sweep import CLASSES, Config


def _log(rng: random.Random, low: int, high: int) -> int:
    return round(math.exp(rng.uniform(math.log(low), math.log(high))))


MAX_FLOPS = 2e9   # a configuration's kernel at most this: ~10-20 ms on a 2-core host, so a sweep covers many


def sample(cls: str, rng: random.Random) -> Config:
    """One configuration of `cls`, sizes log-uniform over what the sample models and the zoo run (redrawn until
    its FLOPs are under MAX_FLOPS)."""
    while True:
        config = _draw(cls, rng)
        if rough_flops(config) <= MAX_FLOPS:
            return config


def rough_flops(config: Config) -> float:
    s = dict(config.sizes)
    if config.op in ("MatMul", "Gemm"):
        return 2.0 * s["m"] * s["k"] * s["n"]
    if config.op == "Conv":
        out = (s["hw"] // s["stride"]) ** 2 * s.get("wide", 1)
        return 2.0 * out * s["co"] * (s["c"] // s["groups"]) * s["k"] ** 2
    if config.op == "Conv1d":
        return 2.0 * (s["len"] // s["stride"]) * s["co"] * (s["c"] // s["groups"]) * s["k"]
    if config.op in ("LSTM", "GRU"):
        return 8.0 * s["steps"] * s["hidden"] * (s["input"] + s["hidden"])
    if config.op == "Attention":
        return 4.0 * s["heads"] * s["q"] * s["kv"] * s["d"]
    return 0.0


def _channels(rng: random.Random, low: int) -> int:
    """A channel count in [low, 512]: log-uniform, or half the time the multiple of 16 nearest to one."""
    count = _log(rng, low, 512)
    return max(16, round(count / 16) * 16) if rng.random() < 0.5 else count


def _gemm_size(rng: random.Random, low: int, high: int) -> int:
    """A GEMM's depth or column count in [low, high]: log-uniform, or half the time the multiple of 16, 32 or 64
    nearest to one, as models have them. A log-uniform draw alone is almost never a multiple of 32, and a GEMM on AMX
    tiles pads a depth off the tile: OpenVINO ran an INT8 128 × 768 × 768 in 137 µs and 129 × 767 × 770 in 204 on one
    thread here (`predictor.alignment`)."""
    size = _log(rng, low, high)
    if rng.random() < 0.5:
        step = rng.choice((16, 32, 64))
        return max(step, round(size / step) * step)
    return size


def _draw_conv1d(rng: random.Random) -> Config:
    """A 1-D conv as speech models have them: a front end's many taps on a few channels over raw samples or frames
    (speech-vad: 64 taps on one channel), Whisper's 3-tap convs over 1500-3000 frames, a conformer's depthwise ones."""
    c = 1 if rng.random() < 0.15 else _channels(rng, 1)
    depthwise = c >= 8 and rng.random() < 0.25
    co = c if depthwise else _channels(rng, 8)
    k = rng.choice((1, 3, 3, 5, 7, 15, 31)) if depthwise else rng.choice((1, 3, 3, 5, 8, 16, 32, 64))
    return Config("conv", "Conv1d", (("c", c), ("co", co), ("len", _log(rng, max(k, 8), 4096)), ("k", k),
                                     ("stride", rng.choice((1, 1, 2, max(1, k // 2)))), ("groups", c if depthwise else 1),
                                     ("relu", rng.choice((0, 1)))))


def _draw(cls: str, rng: random.Random) -> Config:
    if cls == "matmul":
        sizes = (("m", _log(rng, 1, 4096)), ("k", _gemm_size(rng, 16, 4096)), ("n", _gemm_size(rng, 16, 4096)))
        bias = rng.choice((0, 1))
        # a transformer's MLP input: MatMul, bias and Gelu are one kernel to the estimator, which ONNX Runtime runs
        # as a GEMM and a Gelu (or a MatMul and a BiasGelu): the activation's time is the kernel's too
        if bias and rng.random() < 0.4:
            return Config(cls, "MatMul", (*sizes, ("bias", 1), ("act", "Gelu")))
        if rng.random() < 0.3:  # dynamic INT8, as a transformer's or a decoder's cpu-int8 build runs its MatMuls
            if rng.random() < 0.3:  # static, as a CNN's or a UNet's Linear: a QDQ Gemm, which ONNX Runtime runs as
                return Config(cls, "Gemm", (*sizes, ("precision", "int8"), ("quantization", "static")))  # a QGemm
            return Config(cls, "MatMul", (*sizes, ("bias", bias), ("precision", "int8")))
        return Config(cls, "MatMul", (*sizes, ("bias", bias)))
    if cls == "conv":
        # half the channel counts as models have them, multiples of 16 (ONNX Runtime blocks those without padding:
        # a log-uniform draw alone gave 1 conv in 20 such, and the predictor priced the samples' convs as padded ones)
        if rng.random() < 0.25:
            return _draw_conv1d(rng)
        c, co = _channels(rng, 3), _channels(rng, 8)
        if rng.random() < 0.12:  # a head's few outputs (a UNet's 4 noise channels, a mask's 1): ONNX Runtime still
            co = rng.choice((1, 2, 3, 4, 4, 6))  # computes a whole block of them (unet-m's 128 → 4 head: 0.84 ms,
            # the time of 16 outputs; the sweep drew 8 and up, so a fill under a half was never measured)
        depthwise = c >= 8 and rng.random() < 0.3
        # one in four `wide`: a spectrogram's few rows of many frames (cnn-lstm-m's 8 × 128 and 4 × 128): ONNX
        # Runtime's NCHWc kernel computes an output row at a time, and its 16 → 32 conv on 8 × 128 ran at ~270
        # GFLOP/s profiled where the predictor, knowing square inputs of its 1,024 positions only, put ~215
        wide = rng.choice((2, 4, 8, 16)) if rng.random() < 0.25 else 1
        sizes = (("c", c), ("co", c if depthwise else co), ("hw", _log(rng, 7, 128)),
                 *((("wide", wide),) if wide > 1 else ()),
                 ("k", rng.choice((1, 3, 3, 5, 7))), ("stride", rng.choice((1, 1, 2))),
                 ("groups", c if depthwise else 1), ("relu", rng.choice((0, 1))))
        if rng.random() < 0.3:  # static INT8, as a CNN's cpu-int8 build runs its convs (QLinearConv)
            # without a Relu: the plan quantizes the conv alone, and what runs of its activation (fused away between
            # a DQ and a Q, or a float Relu after a DQ) is the model's graph's to say, which the estimate reads
            return Config(cls, "Conv", (*sizes[:-1], ("relu", 0), ("precision", "int8")))
        return Config(cls, "Conv", sizes)
    if cls == "reduce":
        # Add+LayerNormalization: the residual add feeding a norm, one kernel to the estimator and to ONNX Runtime
        # (SkipLayerNormalization), whose kernel is not its LayerNormalization's: 203 against 25 µs on a
        # 128 × 384 activation here (ONNX Runtime 1.32, one thread)
        # RMSNorm: written out as Llama, Qwen and tiny-lm export it (Pow, ReduceMean, Add, Sqrt, Div, Mul by the
        # weight), one kernel to the estimator and to ONNX Runtime (SimplifiedLayerNormalization)
        # MaxPool twice, half of them on uint8: that kernel's time follows its data, and a 30-minute sweep drawing
        # one pool in six, 3 in 10 of them uint8, held ~100, too few to price a CNN's 8-bit pool within ±15 %
        op = rng.choice(("LayerNormalization", "Add+LayerNormalization", "RMSNorm", "Softmax", "GlobalAveragePool",
                         "MaxPool", "MaxPool"))
        if op in ("GlobalAveragePool", "MaxPool"):
            sizes = (("c", _log(rng, 8, 512)), ("hw", _log(rng, 4, 112)))
            if op == "MaxPool":  # the windows CNNs pool over: 3×3 stride 2 (a ResNet's stem), 2×2 stride 2 and
                # stride-1 ones; half the channel counts multiples of 16, which ONNX Runtime runs blocked (NCHWc)
                sizes = (("c", _channels(rng, 8)), sizes[1], ("k", rng.choice((2, 3))), ("stride", rng.choice((1, 2, 2))))
            if op == "MaxPool" and rng.random() < 0.5:  # on uint8, as a static INT8 CNN's graph runs its MaxPool
                # between a Q and a DQ (runtime_kernels.quantized_graph): a static plan's kernel, `reduce@int8~static`
                return Config(cls, op, (*sizes, ("precision", "int8"), ("quantization", "static")))
            return Config(cls, op, sizes)
        rows = (("rows", _log(rng, 1, 8192)), ("width", _log(rng, 16, 4096)))
        if op == "Softmax" and rng.random() < 0.5:  # half masked: a mask's share of its input sets its time
            return Config(cls, op, (*rows, ("masked", rng.randint(5, 95))))  # (softmax_masks.py), percent
        return Config(cls, op, rows)
    if cls == "elementwise":
        # GeluTanh: GPT-2's tanh GELU written out, eight nodes, one kernel to the estimator and to ONNX Runtime
        # (FastGelu), whose time is not the sum of its parts'
        return Config(cls, rng.choice(("Add", "Mul", "Relu", "Sigmoid", "Tanh", "Erf", "GeluTanh")),
                      (("size", _log(rng, 64, 1 << 23)),))
    if cls == "movement":
        op = rng.choice(("Transpose", "Concat", "Gather"))
        if op == "Gather":
            return Config(cls, op, (("vocab", _log(rng, 256, 65536)), ("width", _log(rng, 16, 1024)),
                                    ("rows", _log(rng, 1, 2048))))
        sizes = (("a", _log(rng, 1, 512)), ("b", _log(rng, 8, 1024)), ("c", _log(rng, 8, 1024)))
        if op == "Transpose" and rng.random() < 0.4:  # `inner`: the last axis moved (perm 0, 2, 1), every run one
            return Config(cls, op, (*sizes, ("inner", 1)))  # element, as a key's transpose or a layout reorder is
        return Config(cls, op, sizes)
    if cls == "quantize":
        # the activation (de)quantization a statically quantized model runs where its graph leaves INT8
        return Config(cls, rng.choice(("QuantizeLinear", "DequantizeLinear")), (("size", _log(rng, 64, 1 << 23)),))
    if cls == "recurrent":
        op = rng.choice(("LSTM", "GRU"))
        sizes = (("steps", _log(rng, 1, 256)), ("input", _log(rng, 8, 512)), ("hidden", _log(rng, 8, 512)))
        if op == "LSTM" and rng.random() < 0.3:  # dynamic INT8, as an LSTM's cpu-int8 build runs it (ONNX Runtime's
            return Config(cls, op, (*sizes, ("precision", "int8")))  # DynamicQuantizeLSTM; it quantizes no GRU)
        return Config(cls, op, sizes)
    if cls == "attention":
        # as a transformer's MHA runs it: its heads' queries against as many keys (a prefill, an encoder) or fewer
        # (a decoder's step over its cache), a head's width as models have them or any, half under a causal mask
        kv = _log(rng, 4, 1536)
        q = kv if rng.random() < 0.75 else _log(rng, 1, kv)
        d = rng.choice((16, 32, 64, 64, 128)) if rng.random() < 0.6 else _log(rng, 8, 256)
        return Config(cls, "Attention", (("heads", _log(rng, 1, 16)), ("q", q), ("kv", kv), ("d", d),
                                         ("causal", rng.choice((0, 1)))))
    raise BadInput(f"unknown kernel class '{cls}'", fix=f"use one of: {', '.join(CLASSES)}")
