"""Rotary position embedding applied to a query or key projection's output, x·cos + rotate_half(x)·sin (the
Llama/Qwen/Phi form, halves rotated), in one pass: the unfused chain makes the two halves, negates, concatenates
and multiplies, five tensors the size of x. x is [batch, heads, seq, head_dim] with any strides; cos and sin
broadcast over it (stride 0 where they do)."""

from __future__ import annotations

import triton.language as tl

from tapeout.targets.kernels.base import Case, Config, Kernel, Match, concrete, itemsize, same_shape, torch_dtype


def _rotary(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    rows,
    heads,
    seq,
    half,
    sxb,
    sxh,
    sxs,
    sxd,
    scb,
    sch,
    scs,
    scd,
    ssb,
    ssh,
    sss,
    ssd,
    HALF: tl.constexpr,
    ROWS: tl.constexpr,
):
    # ROWS (batch, head, position) rows a program: one row of 32 pairs a program left an H200 at 0.66x Inductor's
    # code on a 4096-row prefill (docs/kernels.md)
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    s = (r % seq)[:, None]
    h = ((r // seq) % heads)[:, None]
    b = (r // (seq * heads))[:, None]
    d = tl.arange(0, HALF)[None, :]
    inside = (r < rows)[:, None] & (d < half)
    xp = x_ptr + b * sxb + h * sxh + s * sxs
    cp = cos_ptr + b * scb + h * sch + s * scs
    sp = sin_ptr + b * ssb + h * ssh + s * sss
    x1 = tl.load(xp + d * sxd, mask=inside, other=0.0)
    x2 = tl.load(xp + (d + half) * sxd, mask=inside, other=0.0).to(tl.float32)
    c1 = tl.load(cp + d * scd, mask=inside, other=0.0).to(tl.float32)
    c2 = tl.load(cp + (d + half) * scd, mask=inside, other=0.0).to(tl.float32)
    s1 = tl.load(sp + d * ssd, mask=inside, other=0.0).to(tl.float32)
    s2 = tl.load(sp + (d + half) * ssd, mask=inside, other=0.0).to(tl.float32)
    o = out_ptr + r[:, None] * 2 * half
    tl.store(o + d, (x1.to(tl.float32) * c1 - x2 * s1).to(x1.dtype), mask=inside)
    tl.store(o + half + d, (x2 * c2 + x1.to(tl.float32) * s2).to(x1.dtype), mask=inside)


class Rotary(Kernel):
    name = "rotary"
    summary = "rotary embedding on a Q or K projection's output (halves rotated), cos/sin broadcast"
    replaces = "x·cos + cat(−x[…, d/2:], x[…, :d/2])·sin (HF's apply_rotary_pos_emb)"
    op_schema = "tapeout::rotary"
    op_signature = "(Tensor x, Tensor cos, Tensor sin, str config) -> Tensor"
    source = _rotary
    shrinkable = ("heads", "seq", "batch")

    def cases(self):
        return [
            Case.of("Llama-style prefill (seq 128)", batch=1, heads=32, seq=128, dim=64),
            Case.of("Llama-style decode step", batch=1, heads=32, seq=1, dim=64),
            Case.of("llama-40m prefill: q", batch=1, heads=8, seq=256, dim=64),
            Case.of("llama-40m prefill: k (GQA, 4 heads)", batch=1, heads=4, seq=256, dim=64),
            Case.of("edge: batch 3, head_dim 24 (half not a power of two)", batch=3, heads=2, seq=5, dim=24),
        ]

    def configs(self, case):
        return [
            Config.of(num_warps=4, ROWS=16),
            Config.of(num_warps=4, ROWS=32),
            Config.of(num_warps=8, ROWS=64),
            Config.of(num_warps=2, ROWS=4),
            Config.of(num_warps=1, ROWS=1),
        ]

    def inputs(self, case, dtype, generator, device):
        import torch

        t = torch_dtype(dtype)
        b, h, s, d = case["batch"], case["heads"], case["seq"], case["dim"]
        # x as HF makes it: a [b, s, h, d] projection viewed as [b, h, s, d] (not contiguous)
        x = torch.randn(b, s, h, d, generator=generator).to(device, t).transpose(1, 2)
        angle = torch.rand(b, 1, s, d // 2, generator=generator) * 6.3
        angle = torch.cat([angle, angle], dim=-1)
        return {"x": x, "cos": angle.cos().to(device, t), "sin": angle.sin().to(device, t)}

    def outputs(self, case, dtype, inputs, device):
        import torch

        return {"out": torch.empty(inputs["x"].shape, dtype=inputs["x"].dtype, device=device)}

    def eager(self, x, cos, sin):
        import torch

        half = x.shape[-1] // 2
        return {"out": x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin}

    def run(self, inputs, outputs, config):
        import triton

        x = inputs["x"]
        b, h, s, d = x.shape
        cos, sin = (inputs[n].expand(x.shape) for n in ("cos", "sin"))
        rows = b * h * s
        self.launcher(x)[(triton.cdiv(rows, config["ROWS"]),)](
            x,
            cos,
            sin,
            outputs["out"],
            rows,
            h,
            s,
            d // 2,
            *x.stride(),
            *cos.stride(),
            *sin.stride(),
            HALF=triton.next_power_of_2(max(d // 2, 1)),
            **config.launch(),
        )

    def traffic(self, case, dtype):
        elems = case["batch"] * case["heads"] * case["seq"] * case["dim"]
        table = case["batch"] * case["seq"] * case["dim"]
        return (2 * elems + 2 * table) * itemsize(dtype), 3.0 * elems

    def call(self, x, cos, sin, config):
        import torch

        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        self.run({"x": x, "cos": cos, "sin": sin}, {"out": out}, self.config_named(config, None))
        return out

    def match(self, node):
        """add(mul(x, cos), mul(cat([neg(slice(x, -1, d/2, end)), slice(x, -1, 0, d/2)], -1), sin)), either order."""
        import torch

        aten = torch.ops.aten
        if node.op != "call_function" or node.target != aten.add.Tensor or len(node.args) != 2:
            return None
        for plain, turned in (node.args, node.args[::-1]):
            found = _rotation(plain, turned, aten)
            if found:
                x, cos, sin, chain = found
                val = node.meta.get("val")
                if val is None or val.dim() != 4 or not same_shape(val.shape, x.meta["val"].shape):
                    return None
                b, h, s, d = (concrete(v) for v in val.shape)
                return Match(
                    self.name,
                    [*chain, node],
                    (x, cos, sin),
                    Case.of(batch=b, heads=h, seq=s, dim=d),
                    str(val.dtype).removeprefix("torch."),
                )
        return None


def _rotation(plain, turned, aten):
    """(x, cos, sin, the chain's nodes) when `plain` is x·cos and `turned` is rotate_half(x)·sin, else None."""
    if getattr(plain, "target", None) != aten.mul.Tensor or getattr(turned, "target", None) != aten.mul.Tensor:
        return None
    x, cos = plain.args
    cat, sin = turned.args
    if getattr(cat, "target", None) != aten.cat.default:
        cat, sin = sin, cat
    if getattr(cat, "target", None) != aten.cat.default or len(cat.args[0]) != 2:
        return None
    if cat.args[1:] and cat.args[1] not in (-1, 3):
        return None
    neg, low = cat.args[0]
    if getattr(neg, "target", None) != aten.neg.default:
        return None
    high = neg.args[0]
    if getattr(x, "meta", {}).get("val") is None:
        x, cos = cos, x
    xval = getattr(x, "meta", {}).get("val")
    if xval is None or xval.dim() != 4:
        return None
    half = concrete(xval.shape[-1]) // 2
    if _slice_of(high, x, half, None, aten) and _slice_of(low, x, 0, half, aten):
        return x, cos, sin, [high, neg, low, cat, plain, turned]
    if _slice_of(high, cos, half, None, aten) and _slice_of(low, cos, 0, half, aten):
        return cos, x, sin, [high, neg, low, cat, plain, turned]
    return None


def _slice_of(node, source, start, end, aten) -> bool:
    if getattr(node, "target", None) != aten.slice.Tensor or node.args[0] is not source:
        return False
    args = list(node.args) + [None] * 4
    dim, lo, hi = args[1], args[2], args[3]
    return dim in (-1, 3) and (lo or 0) == start and ((end is None and (hi is None or hi >= 2 * start)) or hi == end)
