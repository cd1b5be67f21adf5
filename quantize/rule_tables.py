"""The rule tables: (family × precision) → the rule, per rule set. What a rule is and why each says what it says:
docs/quantization-rules.md. `quantize.rules` picks the table from the target's capabilities and makes the first plan.

A rule says which roles are quantized (or converted to FP16), which stay float and why, and which method and number
formats the hardware wants. Roles come from the analysis, so a rule never keys on op types alone; FP16 rules add the
op types whose arithmetic overflows in FP16.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

LINEARS = frozenset({"attn_q", "attn_k", "attn_v", "attn_qkv", "attn_out", "ffn_in", "ffn_gate", "ffn_up", "ffn_out"})


@dataclass(frozen=True)
class Rule:
    method: str
    quantize: frozenset[str]
    keep: dict[str, str]  # role -> why it stays float
    per_channel: bool = True
    why: str = ""
    keep_ops: frozenset[str] = frozenset()  # op types kept float wherever they are (FP16 rules)
    keep_ops_why: str = ""  # why, for the groups whose weighted node is one of them
    options: Mapping[str, str | None] = field(default_factory=dict)  # what the method takes from the rule
    start: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # role -> (the rung it starts at, why)


_KEEP_TRANSFORMER = {
    "embedding": "embeddings: a table lookup, no matmul to speed up; quantizing it costs accuracy for no time",
    "lm_head": "LM head: logits are the most sensitive output; kept float",
    "head": "task head: small and sensitive; kept float",
    "norm": "LayerNorm/RMSNorm stay float (not quantized by the plan at all)",
}
_KEEP_CNN = {
    "first_conv": "first conv: few input channels, tiny compute, high sensitivity",
    "head": "classifier / detection head: kept float",
    "recurrent_cell": "static QDQ has no LSTM/GRU kernel in ORT: the recurrence stays float",
}

# The LM head is a vocabulary-sized matmul that every decode step reads whole: in FP32 it was the largest
# single cost of decode on samples/llama-40m (32 000 × 512, 65 MB a token; ORT profile on the build host,
# 2 threads: MatMul ~2 ms of a 4.1 ms step). Its logits are the most sensitive output, so 8 bits, not 4
# (NNCF's INT4 default keeps the last layer at 8 bits too); the sensitivity loop can still move it to FP32.
_LM_HEAD_8BIT = (
    "LM head: 8-bit block-wise weights (MatMulNBits, 8 bits): a vocabulary-sized matmul read whole every "
    "decode step, too sensitive for 4 bits"
)

_LM_HEAD_INT8 = (
    "LM head: dynamic INT8, per-channel weights: a vocabulary-sized matmul read whole for every token, "
    "at a quarter of FP32's bytes; the loop moves it to FP32 if the budget is missed"
)

# cpu-int8 can take the head at 4 bits (`overrides = { lm_head = "int4" }`): a 4-bit MatMulNBits with integer compute,
# the rest dynamic INT8. Prefill computes logits at the last position only, so it costs prefill nothing, while
# MatMulNBits at prefill's M = 128 runs 2.5–3× slower than dynamic INT8 (why the body stays INT8). It is not the
# default: on llama-40m (AMD EPYC Zen 5, 2 threads) the decode step fell 1.46 → 1.35 ms at block 32 (1.25 at
# block 128), but tiny-lm's greedy agreement with torch fell 88 % → 64 % at block 32 (perplexity 4.1473 → 4.1442,
# FP32 4.1490), and block 128 missed its perplexity budget.

_LM_HEAD_8BIT_NNCF = (
    "LM head: 8-bit weights (NNCF INT8_ASYM, per output channel): a vocabulary-sized matmul read "
    "whole every decode step, too sensitive for 4 bits"
)

# (family, precision) for the CPU target. INT8 on transformers is dynamic (ORT's recommendation and
# measured best here: activations quantized per inference avoid calibrating outlier ranges); CNNs
# are static QDQ with calibrated activations (dynamic ConvInteger is slower than FP32 on convnets).
CPU_RULES: dict[tuple[str, str], Rule] = {
    ("transformer-encoder", "int8"): Rule(
        "dynamic",
        LINEARS,
        _KEEP_TRANSFORMER,
        why="the six Linear layers per block, per-channel weights, activations per inference",
    ),
    ("decoder-llm", "int8"): Rule(
        "dynamic",
        LINEARS,
        _KEEP_TRANSFORMER,
        why="Linear layers dynamic INT8; embeddings float",
        start={"lm_head": ("int8", _LM_HEAD_INT8)},
    ),
    ("decoder-llm", "int4"): Rule(
        "weight-only",
        LINEARS,
        _KEEP_TRANSFORMER,
        why="INT4 block-wise weight-only (MatMulNBits): decode is memory-bound",
        start={"lm_head": ("int8-weight", _LM_HEAD_8BIT)},
    ),
    ("transformer-encoder", "int4"): Rule(
        "weight-only", LINEARS, _KEEP_TRANSFORMER, why="INT4 block-wise weight-only on the Linear layers"
    ),
    ("cnn", "int8"): Rule(
        "static",
        frozenset({"conv", "depthwise_conv", "linear"}),
        _KEEP_CNN,
        why="static QDQ, per-channel weights, calibrated per-tensor activations",
    ),
    ("diffusion", "int8"): Rule(
        "static",
        LINEARS | {"conv", "linear"},
        {
            **_KEEP_CNN,
            "timestep_embedding": "timestep embedding stays float",
            "embedding": _KEEP_TRANSFORMER["embedding"],
        },
        why="attention/FFN Linears and resnet convs static INT8",
    ),
    # ORT quantizes LSTM dynamically (DynamicQuantizeLSTM: int8 weights, float state and gates); it has
    # no integer GRU or RNN, so those cells stay float. A conv front-end's convs are INT8 too (ConvInteger;
    # the first conv, over the raw signal, stays float as in a CNN): without them a Conv + GRU VAD whose only
    # Linear is its head had nothing to quantize and was refused. Dynamic also reaches convs inside an If on
    # the sample rate, as VADs export (static QDQ does not reach If bodies).
    ("speech-recurrent", "int8"): Rule(
        "dynamic",
        LINEARS | {"linear", "recurrent_cell", "conv", "depthwise_conv"},
        {"head": _KEEP_TRANSFORMER["head"], "first_conv": _KEEP_CNN["first_conv"]},
        keep_ops=frozenset({"GRU", "RNN"}),
        keep_ops_why="ORT has no integer GRU/RNN kernel (only LSTM is quantized dynamically)",
        why="convs after the first, projections and LSTM weights INT8; the recurrent state and gates float",
    ),
    ("mlp", "int8"): Rule(
        "dynamic", frozenset({"linear"}), {"head": _KEEP_TRANSFORMER["head"]}, why="Linear layers dynamic INT8"
    ),
}

# The Hexagon HTP (QNN EP) runs integer QDQ graphs; float nodes run in FP16. So the NPU plan is
# full-integer (every op quantized through ORT's QNN config), and the ladder keeps a sensitive
# group on the NPU as long as it can: 16-bit activations first, FP16 last (never the CPU).
# Transformers start at A16W8 (the NPU transformer recipe, research quant-prune §1.10, §6.2):
# LayerNorm, Softmax and the residual stream do not survive 8-bit activations.
_ALL_ROLES = LINEARS | {
    "embedding",
    "lm_head",
    "head",
    "conv",
    "first_conv",
    "depthwise_conv",
    "linear",
    "timestep_embedding",
}
NPU_RULES: dict[tuple[str, str], tuple[Rule, str]] = {
    (family, "int8"): (Rule("npu-static", _ALL_ROLES | {"recurrent_cell"}, {}, why=why), act)
    for family, act, why in (
        ("cnn", "uint8", "full-integer QDQ, uint8 activations and weights (per-channel int8 for convs)"),
        ("mlp", "uint8", "full-integer QDQ, uint8 activations and weights"),
        ("diffusion", "uint16", "full-integer QDQ, 16-bit activations (A16W8)"),
        ("speech-recurrent", "uint16", "full-integer QDQ, 16-bit activations (A16W8) for the recurrent path"),
        ("transformer-encoder", "uint16", "A16W8: 16-bit activations keep LayerNorm, Softmax and residuals usable"),
        ("decoder-llm", "uint16", "A16W8; per-channel weights (blocked INT4 falls back to the CPU on the HTP)"),
    )
}

# GPUs (ORT's CUDA EP) at FP16: the whole graph in FP16 (tensor cores, half the bytes), except the
# arithmetic that overflows there. Fused norm, softmax and attention kernels accumulate in FP32, so
# LayerNormalization and Softmax ops stay FP16; the statistics of decomposed norms do not (x² passes
# 65504 once |x| > 256), nor does Pow elsewhere (x³ in tanh-GELU). The converter clamps constants to
# the FP16 range, so attention masks of -3.4e38 become -65504 instead of -inf (no NaN rows).
_FP16_OVERFLOW_OPS = frozenset({"Pow", "ReduceMean", "ReduceSumSquare", "ReduceL2", "Sqrt", "Reciprocal"})
_FP16_ROLES = _ALL_ROLES | {"recurrent_cell"}
GPU_FLOAT_RULES: dict[tuple[str, str], Rule] = {
    ("transformer-encoder", "fp16"): Rule(
        "float16",
        _FP16_ROLES,
        {},
        keep_ops=_FP16_OVERFLOW_OPS,
        why="everything FP16 except decomposed-norm statistics and Pow",
    ),
    ("decoder-llm", "fp16"): Rule(
        "float16",
        _FP16_ROLES,
        {},
        keep_ops=_FP16_OVERFLOW_OPS,
        why="everything FP16 except decomposed-norm statistics and Pow",
    ),
    ("cnn", "fp16"): Rule("float16", _FP16_ROLES, {}, why="everything FP16 (BatchNorm folds into the convs)"),
    ("mlp", "fp16"): Rule("float16", _FP16_ROLES, {}, why="everything FP16"),
    ("speech-recurrent", "fp16"): Rule(
        "float16",
        _FP16_ROLES,
        {"recurrent_cell": "recurrent state accumulates over the time steps: kept FP32"},
        keep_ops=_FP16_OVERFLOW_OPS,
        why="projections FP16, the recurrence FP32",
    ),
    ("diffusion", "fp16"): Rule(
        "float16",
        _FP16_ROLES,
        {"timestep_embedding": "sin/cos of timesteps up to 1000 lose their phase in FP16"},
        keep_ops=_FP16_OVERFLOW_OPS,
        why="UNet FP16, the timestep embedding FP32",
    ),
}

# OpenVINO (CPU, GPU, NPU) at INT8: NNCF post-training quantization of the OpenVINO model, which
# quantizes what the plugin runs in INT8 (convs, MatMuls and their activations). Transformers use
# NNCF's transformer model type (LayerNorm, Softmax, residual adds kept float; SmoothQuant on the
# MatMul inputs) and the mixed preset (asymmetric activations: GELU and attention outputs are
# one-sided); NNCF's default model type fails on a transformer's embedding Gather.
# Value: (rule, NNCF model type, NNCF preset).
# NNCF's transformer defaults are the fast plan: on MiniLM (2 threads) 3.36 ms vs 10.0 ms FP32 at mean
# cosine 0.9972; keeping FC2 float as well (its input is the GELU output) reaches 0.9989 at 5.68 ms
# (`python bench/quantization.py` times both). That trade is the accuracy budget's to make, through the sensitivity loop.
OV_RULES: dict[tuple[str, str], tuple[Rule, str | None, str]] = {
    ("transformer-encoder", "int8"): (
        Rule("nncf", LINEARS, _KEEP_TRANSFORMER, why="NNCF transformer INT8: Linear layers, activations calibrated"),
        "transformer",
        "mixed",
    ),
    ("decoder-llm", "int8"): (
        Rule(
            "nncf",
            LINEARS,
            _KEEP_TRANSFORMER,
            why="NNCF transformer INT8 on the Linear layers; lm_head, embeddings float",
        ),
        "transformer",
        "mixed",
    ),
    ("cnn", "int8"): (
        Rule(
            "nncf",
            frozenset({"conv", "depthwise_conv", "linear"}),
            {**_KEEP_CNN, "recurrent_cell": "NNCF does not quantize recurrent cells"},
            why="NNCF INT8: convs and inner Linear layers, symmetric (performance preset)",
        ),
        None,
        "performance",
    ),
    ("mlp", "int8"): (
        Rule("nncf", frozenset({"linear"}), {"head": _KEEP_TRANSFORMER["head"]}, why="NNCF INT8 on the Linear layers"),
        None,
        "performance",
    ),
    ("speech-recurrent", "int8"): (
        Rule(
            "nncf",
            LINEARS | {"linear"},
            {"recurrent_cell": "NNCF does not quantize recurrent cells", "head": _KEEP_TRANSFORMER["head"]},
            why="NNCF INT8 on the projections; recurrence float",
        ),
        None,
        "mixed",
    ),
    ("diffusion", "int8"): (
        Rule(
            "nncf",
            LINEARS | {"conv", "linear"},
            {
                **_KEEP_CNN,
                "timestep_embedding": "timestep embedding stays float",
                "embedding": _KEEP_TRANSFORMER["embedding"],
            },
            why="NNCF INT8 on attention/FFN Linears and convs",
        ),
        "transformer",
        "mixed",
    ),
    # INT4 weight compression (NNCF `compress_weights`, symmetric, block-wise): decode is memory-bound
    # (research §2.4). Embeddings stay float; the LM head gets 8-bit weights, as on ORT (_LM_HEAD_8BIT): float,
    # it was 65 MB of the ~85 MB a llama-40m decode step read.
    ("decoder-llm", "int4"): (
        Rule(
            "nncf-weights",
            LINEARS,
            _KEEP_TRANSFORMER,
            why="NNCF INT4 weight compression (symmetric, block-wise) of the Linear layers; activations float",
            start={"lm_head": ("int8-weight", _LM_HEAD_8BIT_NNCF)},
        ),
        None,
        "",
    ),
    ("transformer-encoder", "int4"): (
        Rule("nncf-weights", LINEARS, _KEEP_TRANSFORMER, why="NNCF INT4 weight compression of the Linear layers"),
        None,
        "",
    ),
}

# TensorRT (strongly typed networks; TensorRT 11 has no precision flags and no calibrators): FP16 is the
# same FP16 graph as on ORT's CUDA EP; INT8 and FP8 are explicit symmetric Q/DQ placed by NVIDIA Model
# Optimizer where TensorRT fuses them, on the roles below, with the remainder cast to FP16 in the same
# pass. Q/DQ on attention BMMs stays ModelOpt's default (on). A group the loop moves up runs in FP16.
_TRT_CNN = Rule(
    "modelopt",
    frozenset({"conv", "depthwise_conv", "linear"}),
    _KEEP_CNN,
    why="ModelOpt Q/DQ on convs and inner Linear layers (TensorRT's conv + residual-add fusion); the rest FP16",
)
# The FFN's output Linear reads the activation's output (GELU: one-sided, with outliers; SwiGLU: outliers):
# with TensorRT's symmetric per-tensor INT8 activations it costs most of the error. MiniLM, Q/DQ graph on
# ORT's CPU EP: mean cosine 0.867 with every Linear INT8, 0.988 with the FFN output Linear FP16.
_TRT_TRANSFORMER = Rule(
    "modelopt",
    LINEARS - {"ffn_out"},
    {
        **_KEEP_TRANSFORMER,
        "ffn_out": "FFN output Linear: its input is the activation's output "
        "(one-sided GELU, outliers), which symmetric INT8 activations resolve poorly; kept FP16",
    },
    keep_ops=_FP16_OVERFLOW_OPS,
    why="ModelOpt Q/DQ on the attention and FFN-input Linear layers; the FFN output Linear, "
    "embeddings, heads, norms and softmax FP16, decomposed-norm statistics FP32",
)
TRT_QDQ_RULES: dict[tuple[str, str], Rule] = {
    **{
        (family, p): rule
        for p in ("int8", "fp8")
        for family, rule in (
            ("cnn", _TRT_CNN),
            ("transformer-encoder", _TRT_TRANSFORMER),
            ("decoder-llm", _TRT_TRANSFORMER),
            (
                "mlp",
                Rule(
                    "modelopt",
                    frozenset({"linear"}),
                    {"head": _KEEP_TRANSFORMER["head"]},
                    why="ModelOpt Q/DQ on the Linear layers; the rest FP16",
                ),
            ),
            (
                "diffusion",
                Rule(
                    "modelopt",
                    LINEARS | {"conv", "linear"},
                    {
                        **_KEEP_CNN,
                        "timestep_embedding": "timestep embedding stays float",
                        "embedding": _KEEP_TRANSFORMER["embedding"],
                    },
                    keep_ops=_FP16_OVERFLOW_OPS,
                    why="ModelOpt Q/DQ on attention/FFN Linears and convs",
                ),
            ),
        )
    }
}

# ExecuTorch's XNNPACK delegate at INT8, quantized on the torch program by PT2E with XNNPACK's quantizer (its
# patterns: conv and Linear, with their ReLU, and the adds, muls, concats and pools between quantized ops). CNNs
# are static (calibrated per-tensor activations: the QS8 kernels, convs and pools run integer end to end), like
# the CPU rule; transformers are dynamic on their Linear layers alone (QD8: activations quantized at run time),
# which keeps LayerNorm, softmax and the residual stream float as the CPU rule does. XNNPACK's quantizer has no
# recurrent-cell pattern.
XNNPACK_RULES: dict[tuple[str, str], Rule] = {
    ("cnn", "int8"): Rule(
        "pt2e-xnnpack",
        frozenset({"conv", "depthwise_conv", "linear"}),
        {**_KEEP_CNN, "recurrent_cell": "XNNPACK's quantizer has no recurrent-cell pattern"},
        why="static INT8 (XNNPACK QS8): per-channel weights, calibrated per-tensor activations",
    ),
    ("mlp", "int8"): Rule(
        "pt2e-xnnpack",
        frozenset({"linear"}),
        {"head": _KEEP_TRANSFORMER["head"]},
        why="static INT8 (XNNPACK QS8) on the Linear layers",
    ),
    ("transformer-encoder", "int8"): Rule(
        "pt2e-xnnpack-dynamic",
        LINEARS,
        _KEEP_TRANSFORMER,
        why="dynamic INT8 (XNNPACK QD8) on the six Linear layers per block: "
        "per-channel weights, activations quantized at run time",
    ),
}

_BF16_ROLES = LINEARS | frozenset({"conv", "depthwise_conv", "first_conv", "linear", "head", "lm_head"})
_KEEP_BF16 = {
    "embedding": "embeddings: a table lookup, no GEMM to run in BF16",
    "norm": "LayerNorm/RMSNorm: no GEMM; statistics stay FP32",
    "recurrent_cell": "recurrent cells: the cast is defined for convs and Linear layers only",
}

# AOTInductor on x86 CPUs at INT8, quantized on the torch program by PT2E with Inductor's x86 quantizer, whose
# patterns Inductor lowers to oneDNN's integer convolutions and Linear layers. The same split as XNNPACK's: CNNs
# and MLPs static (calibrated activations), transformers dynamic on their Linear layers (LayerNorm, softmax and the
# residual stream float, as the CPU rule keeps them). The recipe has no recurrent-cell pattern.
X86_INDUCTOR_RULES: dict[tuple[str, str], Rule] = {
    ("cnn", "int8"): Rule(
        "pt2e-x86-inductor",
        frozenset({"conv", "depthwise_conv", "linear"}),
        {**_KEEP_CNN, "recurrent_cell": "Inductor's x86 quantizer has no recurrent-cell pattern"},
        why="static INT8 (oneDNN qconv/qlinear): per-channel weights, calibrated per-tensor activations",
    ),
    ("mlp", "int8"): Rule(
        "pt2e-x86-inductor",
        frozenset({"linear"}),
        {"head": _KEEP_TRANSFORMER["head"]},
        why="static INT8 (oneDNN qlinear) on the Linear layers",
    ),
    ("transformer-encoder", "int8"): Rule(
        "pt2e-x86-inductor-dynamic",
        LINEARS,
        _KEEP_TRANSFORMER,
        why="dynamic INT8 (oneDNN qlinear) on the six Linear layers per block: "
        "per-channel weights, activations quantized at run time",
    ),
    # BF16 (program-bf16): every convolution and Linear layer computes in BF16, as autocast would; embeddings (a
    # lookup) and norms (FP32 statistics) are no GEMM and stay FP32, as does everything between the planned ops
    **{
        (family, "bf16"): Rule(
            "program-bf16",
            _BF16_ROLES,
            _KEEP_BF16,
            why="BF16 convs and Linear layers on oneDNN's BF16 kernels, FP32 elsewhere",
        )
        for family in ("cnn", "mlp", "transformer-encoder")
    },
}

# AOTInductor on NVIDIA GPUs at BF16: the same casts around every convolution and Linear layer, run on the tensor
# cores by cuBLAS/cuDNN (or Inductor's Triton GEMMs); BF16 keeps FP32's exponent range, so nothing overflows that
# FP16 would (no decomposed-norm or Pow exceptions as in gpu-float). The method reads `device` from the rule.
GPU_INDUCTOR_RULES: dict[tuple[str, str], Rule] = {
    (family, "bf16"): Rule(
        "program-bf16",
        _BF16_ROLES,
        _KEEP_BF16,
        options={"device": "cuda"},
        why="BF16 convs and Linear layers on the GPU's tensor cores, FP32 elsewhere",
    )
    for family in ("cnn", "mlp", "transformer-encoder")
}

RULE_SETS: dict[str, dict[tuple[str, str], Rule]] = {
    "cpu-integer": CPU_RULES,
    "npu-integer": {key: replace(rule, options={"activation_type": act}) for key, (rule, act) in NPU_RULES.items()},
    "gpu-float": GPU_FLOAT_RULES,
    "ov-integer": {
        key: replace(rule, options={"model_type": model_type, "preset": preset})
        for key, (rule, model_type, preset) in OV_RULES.items()
    },
    "gpu-qdq": {**GPU_FLOAT_RULES, **TRT_QDQ_RULES},
    "xnnpack-integer": XNNPACK_RULES,
    "x86-inductor": X86_INDUCTOR_RULES,
    "gpu-inductor": GPU_INDUCTOR_RULES,
}
