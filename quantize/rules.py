"""The rule table: (family × rule set × precision) → the first plan. Documented in docs/quantization-rules.md.

A rule says which roles are quantized (or converted to FP16), which stay float and why, and which
method and number formats the hardware wants. The rule set and the precision ladder come from the
target's capabilities, never its name. Roles come from the analysis (`tapeout.arch`), so a rule
never keys on op types alone (research: quant-prune §2, §6.2); FP16 rules add the op types whose
arithmetic overflows in FP16.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from tapeout.core.capabilities import Capabilities
from tapeout.core.errors import BadInput
from tapeout.core.schemas import QuantizationSettings
from tapeout.graph.analysis import Analysis
from tapeout.quantize.plan import FLOAT, GroupPlan, Plan

LINEARS = frozenset({"attn_q", "attn_k", "attn_v", "attn_qkv", "attn_out", "ffn_in", "ffn_gate", "ffn_up", "ffn_out"})


@dataclass(frozen=True)
class Rule:
    method: str
    quantize: frozenset[str]
    keep: dict[str, str]            # role -> why it stays float
    per_channel: bool = True
    why: str = ""
    keep_ops: frozenset[str] = frozenset()   # op types kept float wherever they are (FP16 rules)
    keep_ops_why: str = ""                   # why, for the groups whose weighted node is one of them
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
_LM_HEAD_8BIT = ("LM head: 8-bit block-wise weights (MatMulNBits, 8 bits): a vocabulary-sized matmul read whole every "
                 "decode step, too sensitive for 4 bits")

_LM_HEAD_INT8 = ("LM head: dynamic INT8, per-channel weights: a vocabulary-sized matmul read whole for every token, "
                 "at a quarter of FP32's bytes; the loop moves it to FP32 if the budget is missed")

# cpu-int8 can take the head at 4 bits (`overrides = { lm_head = "int4" }`): a 4-bit MatMulNBits with integer compute,
# the rest dynamic INT8. Prefill computes logits at the last position only, so it costs prefill nothing, while
# MatMulNBits at prefill's M = 128 runs 2.5–3× slower than dynamic INT8 (why the body stays INT8). It is not the
# default: on llama-40m (AMD EPYC Zen 5, 2 threads) the decode step fell 1.46 → 1.35 ms at block 32 (1.25 at
# block 128), but tiny-lm's greedy agreement with torch fell 88 % → 64 % at block 32 (perplexity 4.1473 → 4.1442,
# FP32 4.1490), and block 128 missed its perplexity budget.

_LM_HEAD_8BIT_NNCF = ("LM head: 8-bit weights (NNCF INT8_ASYM, per output channel): a vocabulary-sized matmul read "
                      "whole every decode step, too sensitive for 4 bits")

# (family, precision) for the CPU target. INT8 on transformers is dynamic (ORT's recommendation and
# measured best here: activations quantized per inference avoid calibrating outlier ranges); CNNs
# are static QDQ with calibrated activations (dynamic ConvInteger is slower than FP32 on convnets).
CPU_RULES: dict[tuple[str, str], Rule] = {
    ("transformer-encoder", "int8"): Rule("dynamic", LINEARS, _KEEP_TRANSFORMER,
                                          why="the six Linear layers per block, per-channel weights, activations per inference"),
    ("decoder-llm", "int8"): Rule("dynamic", LINEARS, _KEEP_TRANSFORMER, why="Linear layers dynamic INT8; embeddings float",
                                  start={"lm_head": ("int8", _LM_HEAD_INT8)}),
    ("decoder-llm", "int4"): Rule("weight-only", LINEARS, _KEEP_TRANSFORMER,
                                  why="INT4 block-wise weight-only (MatMulNBits): decode is memory-bound",
                                  start={"lm_head": ("int8-weight", _LM_HEAD_8BIT)}),
    ("transformer-encoder", "int4"): Rule("weight-only", LINEARS, _KEEP_TRANSFORMER, why="INT4 block-wise weight-only on the Linear layers"),
    ("cnn", "int8"): Rule("static", frozenset({"conv", "depthwise_conv", "linear"}), _KEEP_CNN,
                          why="static QDQ, per-channel weights, calibrated per-tensor activations"),
    ("diffusion", "int8"): Rule("static", LINEARS | {"conv", "linear"},
                                {**_KEEP_CNN, "timestep_embedding": "timestep embedding stays float",
                                 "embedding": _KEEP_TRANSFORMER["embedding"]},
                                why="attention/FFN Linears and resnet convs static INT8"),
    # ORT quantizes LSTM dynamically (DynamicQuantizeLSTM: int8 weights, float state and gates); it has
    # no integer GRU or RNN, so those cells stay float. A conv front-end's convs are INT8 too (ConvInteger;
    # the first conv, over the raw signal, stays float as in a CNN): without them a Conv + GRU VAD whose only
    # Linear is its head had nothing to quantize and was refused. Dynamic also reaches convs inside an If on
    # the sample rate, as VADs export (static QDQ does not reach If bodies).
    ("speech-recurrent", "int8"): Rule("dynamic", LINEARS | {"linear", "recurrent_cell", "conv", "depthwise_conv"},
                                       {"head": _KEEP_TRANSFORMER["head"], "first_conv": _KEEP_CNN["first_conv"]},
                                       keep_ops=frozenset({"GRU", "RNN"}),
                                       keep_ops_why="ORT has no integer GRU/RNN kernel (only LSTM is quantized dynamically)",
                                       why="convs after the first, projections and LSTM weights INT8; the recurrent "
                                           "state and gates float"),
    ("mlp", "int8"): Rule("dynamic", frozenset({"linear"}), {"head": _KEEP_TRANSFORMER["head"]},
                          why="Linear layers dynamic INT8"),
}

# The Hexagon HTP (QNN EP) runs integer QDQ graphs; float nodes run in FP16. So the NPU plan is
# full-integer (every op quantized through ORT's QNN config), and the ladder keeps a sensitive
# group on the NPU as long as it can: 16-bit activations first, FP16 last (never the CPU).
# Transformers start at A16W8 (the NPU transformer recipe, research quant-prune §1.10, §6.2):
# LayerNorm, Softmax and the residual stream do not survive 8-bit activations.
_ALL_ROLES = LINEARS | {"embedding", "lm_head", "head", "conv", "first_conv", "depthwise_conv", "linear",
                        "timestep_embedding"}
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
    ("transformer-encoder", "fp16"): Rule("float16", _FP16_ROLES, {}, keep_ops=_FP16_OVERFLOW_OPS,
                                          why="everything FP16 except decomposed-norm statistics and Pow"),
    ("decoder-llm", "fp16"): Rule("float16", _FP16_ROLES, {}, keep_ops=_FP16_OVERFLOW_OPS,
                                  why="everything FP16 except decomposed-norm statistics and Pow"),
    ("cnn", "fp16"): Rule("float16", _FP16_ROLES, {}, why="everything FP16 (BatchNorm folds into the convs)"),
    ("mlp", "fp16"): Rule("float16", _FP16_ROLES, {}, why="everything FP16"),
    ("speech-recurrent", "fp16"): Rule("float16", _FP16_ROLES,
                                       {"recurrent_cell": "recurrent state accumulates over the time steps: kept FP32"},
                                       keep_ops=_FP16_OVERFLOW_OPS, why="projections FP16, the recurrence FP32"),
    ("diffusion", "fp16"): Rule("float16", _FP16_ROLES,
                                {"timestep_embedding": "sin/cos of timesteps up to 1000 lose their phase in FP16"},
                                keep_ops=_FP16_OVERFLOW_OPS, why="UNet FP16, the timestep embedding FP32"),
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
    ("transformer-encoder", "int8"): (Rule("nncf", LINEARS, _KEEP_TRANSFORMER,
                                           why="NNCF transformer INT8: Linear layers, activations calibrated"),
                                      "transformer", "mixed"),
    ("decoder-llm", "int8"): (Rule("nncf", LINEARS, _KEEP_TRANSFORMER,
                                   why="NNCF transformer INT8 on the Linear layers; lm_head, embeddings float"),
                              "transformer", "mixed"),
    ("cnn", "int8"): (Rule("nncf", frozenset({"conv", "depthwise_conv", "linear"}),
                           {**_KEEP_CNN, "recurrent_cell": "NNCF does not quantize recurrent cells"},
                           why="NNCF INT8: convs and inner Linear layers, symmetric (performance preset)"),
                      None, "performance"),
    ("mlp", "int8"): (Rule("nncf", frozenset({"linear"}), {"head": _KEEP_TRANSFORMER["head"]},
                           why="NNCF INT8 on the Linear layers"), None, "performance"),
    ("speech-recurrent", "int8"): (Rule("nncf", LINEARS | {"linear"},
                                        {"recurrent_cell": "NNCF does not quantize recurrent cells",
                                         "head": _KEEP_TRANSFORMER["head"]},
                                        why="NNCF INT8 on the projections; recurrence float"), None, "mixed"),
    ("diffusion", "int8"): (Rule("nncf", LINEARS | {"conv", "linear"},
                                 {**_KEEP_CNN, "timestep_embedding": "timestep embedding stays float",
                                  "embedding": _KEEP_TRANSFORMER["embedding"]},
                                 why="NNCF INT8 on attention/FFN Linears and convs"), "transformer", "mixed"),
    # INT4 weight compression (NNCF `compress_weights`, symmetric, block-wise): decode is memory-bound
    # (research §2.4). Embeddings stay float; the LM head gets 8-bit weights, as on ORT (_LM_HEAD_8BIT): float,
    # it was 65 MB of the ~85 MB a llama-40m decode step read.
    ("decoder-llm", "int4"): (Rule("nncf-weights", LINEARS, _KEEP_TRANSFORMER,
                                   why="NNCF INT4 weight compression (symmetric, block-wise) of the Linear layers; "
                                       "activations float",
                                   start={"lm_head": ("int8-weight", _LM_HEAD_8BIT_NNCF)}), None, ""),
    ("transformer-encoder", "int4"): (Rule("nncf-weights", LINEARS, _KEEP_TRANSFORMER,
                                           why="NNCF INT4 weight compression of the Linear layers"), None, ""),
}

# TensorRT (strongly typed networks; TensorRT 11 has no precision flags and no calibrators): FP16 is the
# same FP16 graph as on ORT's CUDA EP; INT8 and FP8 are explicit symmetric Q/DQ placed by NVIDIA Model
# Optimizer where TensorRT fuses them, on the roles below, with the remainder cast to FP16 in the same
# pass. Q/DQ on attention BMMs stays ModelOpt's default (on). A group the loop moves up runs in FP16.
_TRT_CNN = Rule("modelopt", frozenset({"conv", "depthwise_conv", "linear"}), _KEEP_CNN,
                why="ModelOpt Q/DQ on convs and inner Linear layers (TensorRT's conv + residual-add fusion); "
                    "the rest FP16")
# The FFN's output Linear reads the activation's output (GELU: one-sided, with outliers; SwiGLU: outliers):
# with TensorRT's symmetric per-tensor INT8 activations it costs most of the error. MiniLM, Q/DQ graph on
# ORT's CPU EP: mean cosine 0.867 with every Linear INT8, 0.988 with the FFN output Linear FP16.
_TRT_TRANSFORMER = Rule("modelopt", LINEARS - {"ffn_out"},
                        {**_KEEP_TRANSFORMER, "ffn_out": "FFN output Linear: its input is the activation's output "
                         "(one-sided GELU, outliers), which symmetric INT8 activations resolve poorly; kept FP16"},
                        keep_ops=_FP16_OVERFLOW_OPS,
                        why="ModelOpt Q/DQ on the attention and FFN-input Linear layers; the FFN output Linear, "
                            "embeddings, heads, norms and softmax FP16, decomposed-norm statistics FP32")
TRT_QDQ_RULES: dict[tuple[str, str], Rule] = {
    **{(family, p): rule for p in ("int8", "fp8") for family, rule in (
        ("cnn", _TRT_CNN), ("transformer-encoder", _TRT_TRANSFORMER), ("decoder-llm", _TRT_TRANSFORMER),
        ("mlp", Rule("modelopt", frozenset({"linear"}), {"head": _KEEP_TRANSFORMER["head"]},
                     why="ModelOpt Q/DQ on the Linear layers; the rest FP16")),
        ("diffusion", Rule("modelopt", LINEARS | {"conv", "linear"},
                           {**_KEEP_CNN, "timestep_embedding": "timestep embedding stays float",
                            "embedding": _KEEP_TRANSFORMER["embedding"]}, keep_ops=_FP16_OVERFLOW_OPS,
                           why="ModelOpt Q/DQ on attention/FFN Linears and convs")),
    )},
}

# ExecuTorch's XNNPACK delegate at INT8, quantized on the torch program by PT2E with XNNPACK's quantizer (its
# patterns: conv and Linear, with their ReLU, and the adds, muls, concats and pools between quantized ops). CNNs
# are static (calibrated per-tensor activations: the QS8 kernels, convs and pools run integer end to end), like
# the CPU rule; transformers are dynamic on their Linear layers alone (QD8: activations quantized at run time),
# which keeps LayerNorm, softmax and the residual stream float as the CPU rule does. XNNPACK's quantizer has no
# recurrent-cell pattern.
XNNPACK_RULES: dict[tuple[str, str], Rule] = {
    ("cnn", "int8"): Rule("pt2e-xnnpack", frozenset({"conv", "depthwise_conv", "linear"}),
                          {**_KEEP_CNN, "recurrent_cell": "XNNPACK's quantizer has no recurrent-cell pattern"},
                          why="static INT8 (XNNPACK QS8): per-channel weights, calibrated per-tensor activations"),
    ("mlp", "int8"): Rule("pt2e-xnnpack", frozenset({"linear"}), {"head": _KEEP_TRANSFORMER["head"]},
                          why="static INT8 (XNNPACK QS8) on the Linear layers"),
    ("transformer-encoder", "int8"): Rule("pt2e-xnnpack-dynamic", LINEARS, _KEEP_TRANSFORMER,
                                          why="dynamic INT8 (XNNPACK QD8) on the six Linear layers per block: "
                                              "per-channel weights, activations quantized at run time"),
}

_BF16_ROLES = LINEARS | frozenset({"conv", "depthwise_conv", "first_conv", "linear", "head", "lm_head"})
_KEEP_BF16 = {"embedding": "embeddings: a table lookup, no GEMM to run in BF16",
              "norm": "LayerNorm/RMSNorm: no GEMM; statistics stay FP32",
              "recurrent_cell": "recurrent cells: the cast is defined for convs and Linear layers only"}

# AOTInductor on x86 CPUs at INT8, quantized on the torch program by PT2E with Inductor's x86 quantizer, whose
# patterns Inductor lowers to oneDNN's integer convolutions and Linear layers. The same split as XNNPACK's: CNNs
# and MLPs static (calibrated activations), transformers dynamic on their Linear layers (LayerNorm, softmax and the
# residual stream float, as the CPU rule keeps them). The recipe has no recurrent-cell pattern.
X86_INDUCTOR_RULES: dict[tuple[str, str], Rule] = {
    ("cnn", "int8"): Rule("pt2e-x86-inductor", frozenset({"conv", "depthwise_conv", "linear"}),
                          {**_KEEP_CNN, "recurrent_cell": "Inductor's x86 quantizer has no recurrent-cell pattern"},
                          why="static INT8 (oneDNN qconv/qlinear): per-channel weights, calibrated per-tensor "
                              "activations"),
    ("mlp", "int8"): Rule("pt2e-x86-inductor", frozenset({"linear"}), {"head": _KEEP_TRANSFORMER["head"]},
                          why="static INT8 (oneDNN qlinear) on the Linear layers"),
    ("transformer-encoder", "int8"): Rule("pt2e-x86-inductor-dynamic", LINEARS, _KEEP_TRANSFORMER,
                                          why="dynamic INT8 (oneDNN qlinear) on the six Linear layers per block: "
                                              "per-channel weights, activations quantized at run time"),
    # BF16 (program-bf16): every convolution and Linear layer computes in BF16, as autocast would; embeddings (a
    # lookup) and norms (FP32 statistics) are no GEMM and stay FP32, as does everything between the planned ops
    **{(family, "bf16"): Rule("program-bf16", _BF16_ROLES, _KEEP_BF16,
                              why="BF16 convs and Linear layers on oneDNN's BF16 kernels, FP32 elsewhere")
       for family in ("cnn", "mlp", "transformer-encoder")},
}

# AOTInductor on NVIDIA GPUs at BF16: the same casts around every convolution and Linear layer, run on the tensor
# cores by cuBLAS/cuDNN (or Inductor's Triton GEMMs); BF16 keeps FP32's exponent range, so nothing overflows that
# FP16 would (no decomposed-norm or Pow exceptions as in gpu-float). The method reads `device` from the rule.
GPU_INDUCTOR_RULES: dict[tuple[str, str], Rule] = {
    (family, "bf16"): Rule("program-bf16", _BF16_ROLES, _KEEP_BF16, options={"device": "cuda"},
                           why="BF16 convs and Linear layers on the GPU's tensor cores, FP32 elsewhere")
    for family in ("cnn", "mlp", "transformer-encoder")}

RULE_SETS: dict[str, dict[tuple[str, str], Rule]] = {
    "cpu-integer": CPU_RULES,
    "npu-integer": {key: replace(rule, options={"activation_type": act}) for key, (rule, act) in NPU_RULES.items()},
    "gpu-float": GPU_FLOAT_RULES,
    "ov-integer": {key: replace(rule, options={"model_type": model_type, "preset": preset})
                   for key, (rule, model_type, preset) in OV_RULES.items()},
    "gpu-qdq": {**GPU_FLOAT_RULES, **TRT_QDQ_RULES},
    "xnnpack-integer": XNNPACK_RULES,
    "x86-inductor": X86_INDUCTOR_RULES,
    "gpu-inductor": GPU_INDUCTOR_RULES,
}


@dataclass(frozen=True)
class InstructionSet:
    """The CPU the INT8 model will run on, as far as the rules care: its architecture and extensions,
    and where that came from (the profile's device spec, or the build host)."""

    arch: str
    flags: frozenset[str]
    origin: str

    @property
    def vnni(self) -> bool:
        return bool(self.flags & {"avx512_vnni", "avx_vnni", "amx_int8"})


def host_isa(why: str = "the profile names no device") -> InstructionSet:
    import platform

    from tapeout.core.host import cpu_info

    machine = platform.machine().lower()
    arch = "arm64" if machine in ("arm64", "aarch64") else "x86_64" if machine in ("x86_64", "amd64") else machine
    return InstructionSet(arch, cpu_info()[1], f"the build host's ({why})")


def isa_for(device) -> InstructionSet:
    """The device spec's CPU instruction set when the profile names a device that lists one, else the host's."""
    if device is None:
        return host_isa()
    if device.cpu_isa is None:
        return host_isa(f"device spec {device.name} lists no CPU instruction set")
    return InstructionSet(device.cpu_isa.arch, frozenset(device.cpu_isa.flags), f"device spec {device.name}")


def static_formats(isa: InstructionSet) -> tuple[str, bool, str]:
    """(activation type, reduce_range, why) of ORT static QDQ INT8 on this instruction set.

    x86's INT8 dot products multiply unsigned by signed bytes (vpmaddubsw on AVX2, vpdpbusd on VNNI), so
    U8S8 is native. Without VNNI the u8×s8 pair sums saturate int16 unless weights use 7 bits. With
    VNNI, S8S8 QDQ MatMuls ran 4× slower than U8S8 (MiniLM on an AMD EPYC with AVX512-VNNI: 0.49× vs
    1.79× FP32) and convs alike (2.16× vs 2.11×), so U8S8 with full 8-bit weights. arm64's sdot/smmla
    multiply signed by signed: S8S8, ORT's default (not measured here: no arm64 machine)."""
    if isa.arch == "arm64":
        return "int8", False, "arm64: S8S8 (signed dot products; ORT's default)"
    if isa.vnni:
        return "uint8", False, "x86 with VNNI: U8S8, 8-bit weights (S8S8 QDQ MatMuls measured 4× slower)"
    return "uint8", True, "x86 without VNNI: U8S8 with 7-bit weights (reduce_range), so u8×s8 pair sums cannot saturate"


def weight_only_compute(isa: InstructionSet) -> tuple[int | None, str]:
    """ONNX Runtime's MatMulNBits accuracy_level on this CPU, and why. Level 4 quantizes the activations to int8
    per block and runs integer dot products (MLAS has those kernels for x86-64 AVX2 and up and for arm64); without
    it the weights are unpacked to float on every call. On an Intel Xeon (AVX-512 VNNI + AMX, 2 threads),
    one 512 × 32 000 matmul: 4-bit 0.235 ms at level 4 vs 0.625 ms without,
    8-bit 0.385 ms vs 52 ms (FP32: 1.25 ms). Not measured on an AVX2-only or arm64 CPU."""
    if isa.arch == "arm64":
        return 4, "arm64: int8 compute (accuracy_level 4), MLAS's NEON kernels (not measured here)"
    if isa.arch == "x86_64" and "avx2" in isa.flags:
        return 4, "x86-64 with AVX2: int8 compute (accuracy_level 4): activations to int8 per block, integer dot products"
    return None, (f"{isa.arch} without AVX2: float compute (MatMulNBits unpacks the weights each call; 8-bit weights "
                  "then run far slower than FP32)")


def rule_for(family: str, target: str, caps: Capabilities, precision: str) -> Rule:
    table = RULE_SETS.get(caps.rules or "")
    if table is None:
        raise BadInput(f"target '{target}' has no {precision} rules", fix="use precision = \"fp32\" with this target")
    rule = table.get((family, precision))
    if rule is None:
        known = sorted({f for f, p in table if p == precision})
        raise BadInput(f"no {precision} rule for a {family} model on {target}",
                       fix=f"{precision} is defined there for: {', '.join(known) or 'no family'}; "
                           f"use another precision ({', '.join(caps.precisions)})")
    return rule


def choose_method(rule: Rule, target: str, precision: str, settings: QuantizationSettings):
    """The method that applies this rule: the rule's own, or the one [quantization] method names where it stands in
    for the rule's; its int4 algorithm checked."""
    from tapeout.quantize import methods

    own = methods.get(rule.method)
    asked = settings.method
    if asked in ("auto", rule.method):
        method = own
    elif own.fixed_why:
        raise BadInput(f"[quantization] method = \"{asked}\" is not available on target '{target}': "
                       f"{own.fixed_why.format(precision=precision)}", fix="set method = \"auto\"")
    elif precision == "int4":  # int4 is the rule's weight compression, whatever method the profile names
        method = own
    else:
        method = methods.get(asked)
        if precision not in method.precisions:  # a weight-only method asked for an int8 profile, say
            needed = " or ".join(f'"{p}"' for p in sorted(method.precisions))
            raise BadInput(f"[quantization] method = \"{asked}\" needs precision = {needed} (the profile says "
                           f"{precision})", fix=f"set precision = {needed.split(' or ')[0]}, or method = \"auto\"")
        if rule.method not in method.stands_in_for:
            raise BadInput(f"[quantization] method = \"{asked}\" is not available on target '{target}': the rule's "
                           f"method is {rule.method}, and {asked} does not stand in for it", fix="set method = \"auto\"")
    if precision == "int4" and settings.int4_algorithm not in method.algorithms:
        # NNCF's GPTQ fails on transposed (torch Linear) weights ("Transpose is not supported", nncf 3.4);
        # ORT's MatMulNBits quantizer has no AWQ
        raise BadInput(f"int4_algorithm = \"{settings.int4_algorithm}\" is not available on target '{target}'",
                       fix=f"use one of: {', '.join(method.algorithms)}")
    return method


def _check_names(settings: QuantizationSettings, analysis: Analysis, rule: Rule, target: str, precision: str,
                 ladder: tuple[str, ...], method) -> None:
    """`keep_float` and `overrides` checked against this model and ladder, so that a typo is one line, not a group
    left as the rule has it without a word: every name is a fusion group or node (or, for an override, a role) of the
    model, every override's rung is on the ladder, and a quantized rung goes only to a role the rule's method
    quantizes (an embedding's Gather, say, is no MatMul a weight-only quantizer rewrites)."""
    fix = "see the group and node names and the roles with `tapeout analyze --groups`"
    names = {g.name for g in analysis.groups} | {n for g in analysis.groups for n in g.nodes}
    unknown = sorted(set(settings.keep_float) - names)
    if unknown:
        raise BadInput(f"[quantization] keep_float: '{unknown[0]}' is no fusion group or node of this model", fix=fix)
    roles = {g.role for g in analysis.groups}
    for key, rung in settings.overrides.items():
        matched = [g for g in analysis.groups if key in (g.name, g.role) or key in g.nodes]
        if not matched:
            raise BadInput(f"[quantization] overrides: '{key}' is no fusion group, node or role of this model "
                           f"(roles: {', '.join(sorted(roles))})", fix=fix)
        if rung not in ladder:
            raise BadInput(f"[quantization] overrides: {key} = \"{rung}\" is not on {target}'s {precision} ladder "
                           f"({', '.join(ladder)})", fix=f"use one of: {', '.join(ladder)}")
        if not _writes(method, rung):
            usable = [r for r in ladder if _writes(method, r)]
            raise BadInput(f"[quantization] overrides: {key} = \"{rung}\": the {method.name} method does not write "
                           f"{rung}", fix=f"use one of: {', '.join(usable)}")
        refused = sorted({g.role for g in matched if g.role not in rule.quantize and g.role not in rule.start})
        if rung != FLOAT and refused:
            quantized = ", ".join(sorted(rule.quantize | set(rule.start)))
            raise BadInput(f"[quantization] overrides: {key} = \"{rung}\": the {analysis.family} rule at {precision} "
                           f"on {target} does not quantize role '{refused[0]}' "
                           f"({rule.keep.get(refused[0], 'no rule for it')})",
                           fix=f"override only groups of the roles it quantizes ({quantized}), or keep it float")


def _writes(method, rung: str) -> bool:
    """Whether `method` can put a group at `rung` (float always)."""
    return rung == FLOAT or method.rungs is None or rung in method.rungs


def _override_of(group, overrides: Mapping[str, str]) -> tuple[str, str] | None:
    """The override that applies to `group`, most specific key first: its name, one of its nodes, its role."""
    for key in (group.name, *group.nodes, group.role):
        if key in overrides:
            return key, overrides[key]
    return None


def first_plan(analysis: Analysis, target: str, caps: Capabilities, precision: str,
               settings: QuantizationSettings, isa: InstructionSet | None = None) -> Plan:
    """The rule table's plan for this model on this target, finished by the rule's quantization method; settings
    override what the user set. `isa`: the CPU the model runs on (CPU rules only); default: the build host's."""
    family = analysis.family
    rule = rule_for(family, target, caps, precision)
    method = choose_method(rule, target, precision, settings)
    # the rungs an override may name: the ladder, and those under it the target offers
    ladder = (*caps.below.get(precision, ()), *caps.precisions[precision])
    _check_names(settings, analysis, rule, target, precision, ladder, method)
    keep = set(settings.keep_float)
    groups = []
    for g in analysis.groups:
        chosen = _override_of(g, settings.overrides)
        if g.name in keep or keep & set(g.nodes):
            groups.append(GroupPlan(g.name, g.role, g.weighted, FLOAT, "kept float by [quantization] keep_float"))
        elif not method.reaches_bodies and any(analysis.body_of(n) for n in g.weighted):
            groups.append(GroupPlan(g.name, g.role, g.weighted, FLOAT,
                                    f"inside the body of {analysis.body_of(g.weighted[0])}: the {method.name} quantizer "
                                    "does not reach into If/Loop/Scan bodies (dynamic INT8 does)"))
        elif rule.keep_ops_why and {analysis.op_type(n) for n in g.weighted} & rule.keep_ops:
            groups.append(GroupPlan(g.name, g.role, g.weighted, FLOAT, rule.keep_ops_why))
        elif chosen is not None:
            key, rung = chosen
            groups.append(GroupPlan(g.name, g.role, g.weighted, rung, f"[quantization] overrides: {key} = \"{rung}\""))
        elif g.role in rule.start and rule.start[g.role][0] in ladder and _writes(method, rule.start[g.role][0]):
            rung, why = rule.start[g.role]
            groups.append(GroupPlan(g.name, g.role, g.weighted, rung, f"rule {family}/{target}/{precision}: {why}"))
        elif g.role in rule.quantize and g.role not in rule.keep:  # a rule's keep wins (FP16 recurrent cells)
            groups.append(GroupPlan(g.name, g.role, g.weighted, precision, f"rule {family}/{target}/{precision}: {rule.why}"))
        else:
            why = rule.keep.get(g.role, f"role '{g.role}' is not quantized by the {family} rule")
            groups.append(GroupPlan(g.name, g.role, g.weighted, FLOAT, why))
    # a rung under the precision stays on the plan's ladder only where a group is there: the ladder starts at the
    # precision itself otherwise (a method reads plan.ladder[0] as the precision it quantizes to)
    ladder = tuple(r for r in ladder if r in caps.precisions[precision] or any(g.precision == r for g in groups))
    draft = Plan(method=method.name, family=family, target=target, ladder=ladder,
                 groups=tuple(groups))
    return method.plan(draft, rule, analysis, settings, isa or host_isa())
