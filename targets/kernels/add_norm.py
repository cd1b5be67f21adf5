"""Residual add + LayerNorm / RMSNorm in one pass: h = x + residual is written once (the residual stream goes on)
and normalised from registers, where the unfused chain writes h, reads it back for the statistics and again to
normalise. One program per row; the row must fit one block (hidden sizes up to 16 K)."""

from __future__ import annotations

import triton
import triton.language as tl

from tapeout.targets.kernels.base import Case, Config, Kernel, Match, concrete, itemsize, same_shape, torch_dtype

MAX_WIDTH = 16384


def _add_norm(
    x_ptr,
    res_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    sum_ptr,
    width,
    eps,
    RMS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < width
    x = tl.load(x_ptr + row * width + cols, mask=inside, other=0.0)
    h = x.to(tl.float32) + tl.load(res_ptr + row * width + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(sum_ptr + row * width + cols, h.to(x.dtype), mask=inside)
    centred = h if RMS else tl.where(inside, h - tl.sum(h, axis=0) / width, 0.0)
    var = tl.sum(centred * centred, axis=0) / width
    y = centred * tl.math.rsqrt(var + eps) * tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * width + cols, y.to(x.dtype), mask=inside)


class _AddNorm(Kernel):
    source = _add_norm
    shrinkable = ("rows",)
    rms: bool

    def cases(self) -> list[Case]:
        return [
            Case.of("MiniLM batch 1 (seq 128)", rows=128, width=384),
            Case.of("MiniLM batch 32 (seq 128)", rows=4096, width=384),
            Case.of("Whisper-tiny encoder (1500 frames)", rows=1500, width=384),
            Case.of("Llama-style decode step", rows=1, width=2048),
            Case.of("llama-40m prefill (seq 256)", rows=256, width=512),
            Case.of("edge: width not a power of two", rows=3, width=200),
            Case.of("edge: one element", rows=2, width=1),
        ]

    def configs(self, case: Case) -> list[Config]:
        return [Config.of(num_warps=w) for w in (4, 1, 2, 8, 16) if w * 32 <= max(32, _block(case["width"]))]

    def inputs(self, case, dtype, generator, device):
        import torch

        shape, t = (case["rows"], case["width"]), torch_dtype(dtype)
        draw = {
            "x": torch.randn(shape, generator=generator).to(device, t),
            "residual": torch.randn(shape, generator=generator).to(device, t),
            "weight": (1 + 0.1 * torch.randn(case["width"], generator=generator)).to(device, t),
            "eps": 1e-5,
        }
        if not self.rms:
            draw["bias"] = (0.1 * torch.randn(case["width"], generator=generator)).to(device, t)
        return draw

    def outputs(self, case, dtype, inputs, device):
        import torch

        return {"out": torch.empty_like(inputs["x"]), "sum": torch.empty_like(inputs["x"])}

    def eager(self, x, residual, weight, eps, bias=None):
        import torch.nn.functional as F

        h = x + residual
        if self.rms:
            return {"out": F.rms_norm(h, (h.shape[-1],), weight, eps), "sum": h}
        return {"out": F.layer_norm(h, (h.shape[-1],), weight, bias, eps), "sum": h}

    def run(self, inputs, outputs, config):
        x = inputs["x"]
        width = x.shape[-1]
        if width > MAX_WIDTH:
            raise ValueError(f"{self.name}: a row of {width} does not fit one block (at most {MAX_WIDTH})")
        bias = inputs.get("bias", x)
        self.launcher(x)[(x.numel() // width,)](
            x,
            inputs["residual"],
            inputs["weight"],
            bias,
            outputs["out"],
            outputs["sum"],
            width,
            inputs["eps"],
            RMS=self.rms,
            HAS_BIAS="bias" in inputs,
            BLOCK=_block(width),
            **config.launch(),
        )

    def traffic(self, case, dtype):
        elems, size = case["rows"] * case["width"], itemsize(dtype)
        return 4 * elems * size + (1 if self.rms else 2) * case["width"] * size, 8.0 * elems

    def call(self, x, residual, weight, bias, eps, config):
        import torch

        out, total = torch.empty_like(x), torch.empty_like(x)
        inputs = {"x": x.contiguous(), "residual": residual.contiguous(), "weight": weight, "eps": eps}
        if bias is not None:
            inputs["bias"] = bias
        self.run(inputs, {"out": out, "sum": total}, self.config_named(config, Case.of(rows=1, width=x.shape[-1])))
        return out, total

    def match(self, node):
        import torch

        aten = torch.ops.aten
        if self.rms and getattr(node, "target", None) == aten.mul.Tensor:
            return self._match_decomposed(node, aten)
        norm = aten.rms_norm.default if self.rms else aten.layer_norm.default
        if node.op != "call_function" or node.target != norm:
            return None
        args = list(node.args) + [None] * 5
        added, shape, weight = args[0], args[1], args[2]
        bias, eps = (None, args[3]) if self.rms else (args[3], args[4])
        if not (
            hasattr(added, "target")
            and added.target == aten.add.Tensor
            and len(added.args) == 2
            and len(added.kwargs) == 0
            and weight is not None
            and len(shape) == 1
        ):
            return None
        a, b = added.args
        vals = [getattr(v, "meta", {}).get("val") for v in (a, b, added)]
        if any(v is None for v in vals) or not same_shape(vals[0].shape, vals[1].shape, vals[2].shape):
            return None  # a broadcast add is not a residual
        if eps is None:
            eps = 1e-5 if not self.rms else _default_rms_eps(vals[2].dtype)
        width = concrete(vals[2].shape[-1])
        rows = concrete(vals[2].numel()) // width if width else 0
        return Match(
            self.name,
            [added, node],
            (a, b, weight, bias, float(eps)),
            Case.of(rows=rows, width=width),
            str(vals[2].dtype).removeprefix("torch."),
        )

    def _match_decomposed(self, node, aten):
        found = _decomposed_rms(node, aten)
        if found is None:
            return None
        h, weight, eps, chain = found
        if getattr(h, "target", None) != aten.add.Tensor or len(h.args) != 2:
            return None
        a, b = h.args
        vals = [getattr(v, "meta", {}).get("val") for v in (a, b, h, node)]
        if (
            any(v is None for v in vals)
            or not same_shape(*(v.shape for v in vals))
            or not (vals[0].dtype == vals[1].dtype == vals[3].dtype)
        ):
            return None  # a broadcast add is not a residual; a norm that changes dtype is not this kernel's
        width = concrete(vals[2].shape[-1])
        return Match(
            self.name,
            [h, *chain],
            (a, b, weight, None, float(eps)),
            Case.of(rows=concrete(vals[2].numel()) // max(width, 1), width=width),
            str(vals[2].dtype).removeprefix("torch."),
        )

    def rewrite(self, graph, match, op):
        import operator

        added, norm = match.nodes[0], match.nodes[-1]
        with graph.inserting_before(norm):
            fused = graph.call_function(op, match.args)
            out = graph.call_function(operator.getitem, (fused, 0))
            total = graph.call_function(operator.getitem, (fused, 1))
        fused.meta["val"] = (norm.meta["val"], added.meta["val"])
        out.meta["val"], total.meta["val"] = norm.meta["val"], added.meta["val"]
        norm.replace_all_uses_with(out)
        added.replace_all_uses_with(total)
        return [(norm, out), (added, total)]


def _decomposed_rms(node, aten):
    """weight · to(x·rsqrt(mean(x², −1, keepdim) + eps)) with x = to(h, float32), as Llama/Qwen/Gemma's RMSNorm
    module writes it: (h, weight, eps, the chain's nodes) or None."""

    def target(n):
        return getattr(n, "target", None)

    weight, scaled = node.args
    if target(scaled) != aten.to.dtype:
        weight, scaled = scaled, weight
    chain = [node]
    if target(scaled) == aten.to.dtype:
        chain.append(scaled)
        scaled = scaled.args[0]
    if target(scaled) != aten.mul.Tensor or getattr(weight, "op", None) != "placeholder":
        return None
    x, root = scaled.args
    if target(root) != aten.rsqrt.default:
        x, root = root, x
    if target(root) != aten.rsqrt.default or target(root.args[0]) != aten.add.Tensor:
        return None
    mean, eps = root.args[0].args
    if (
        target(mean) != aten.mean.dim
        or not isinstance(eps, float)
        or list(mean.args[1]) not in ([-1],)
        or not (len(mean.args) > 2 and mean.args[2])
    ):
        return None
    square = mean.args[0]
    if target(square) != aten.pow.Tensor_Scalar or square.args[0] is not x or square.args[1] != 2:
        return None
    h = x.args[0] if target(x) == aten.to.dtype else x
    chain += [scaled, root, root.args[0], mean, square] + ([x] if x is not h else [])
    return h, weight, eps, chain[::-1]


def _default_rms_eps(dtype) -> float:
    import torch

    return float(torch.finfo(dtype).eps)


def _block(width: int) -> int:
    return triton.next_power_of_2(max(width, 1))


class AddLayerNorm(_AddNorm):
    name = "add-layernorm"
    summary = "residual add + LayerNorm, the sum written once and normalised in registers"
    replaces = "aten.add → aten.layer_norm (last dim)"
    op_schema = "tapeout::add_layernorm"
    op_signature = "(Tensor x, Tensor residual, Tensor weight, Tensor? bias, float eps, str config) -> (Tensor, Tensor)"
    rms = False


class AddRmsNorm(_AddNorm):
    name = "add-rmsnorm"
    summary = "residual add + RMSNorm, the sum written once and normalised in registers"
    replaces = "aten.add → aten.rms_norm (last dim)"
    op_schema = "tapeout::add_rmsnorm"
    op_signature = "(Tensor x, Tensor residual, Tensor weight, Tensor? bias, float eps, str config) -> (Tensor, Tensor)"
    rms = True
