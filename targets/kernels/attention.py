"""Short-sequence attention, softmax(q·kᵀ·scale + mask)·v, for the shapes encoders run at (MiniLM, BERT, the
Whisper encoder: up to a few thousand positions, head_dim up to 128, batch 1–32): one program per (batch, head,
block of queries), keys streamed in blocks with an online softmax, so the score matrix never reaches memory.
The mask is additive (a boolean one is turned into 0/−inf first) and broadcasts over batch, heads and queries
through stride 0."""

from __future__ import annotations

from typing import ClassVar

import triton.language as tl

from tapeout.targets.kernels.base import Case, Config, Kernel, Match, concrete, itemsize, same_shape, torch_dtype

MAX_HEAD_DIM = 128


def _attention(
    q_ptr,
    k_ptr,
    v_ptr,
    mask_ptr,
    out_ptr,
    heads,
    seq_q,
    seq_k,
    head_dim,
    scale,
    sqb,
    sqh,
    sqs,
    sqd,
    skb,
    skh,
    sks,
    skd,
    svb,
    svh,
    svs,
    svd,
    smb,
    smh,
    smq,
    smk,
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    bh = tl.program_id(1).to(tl.int64)
    b = bh // heads
    h = bh % heads
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_in = rows < seq_q
    dim_in = dims < head_dim
    q = tl.load(
        q_ptr + b * sqb + h * sqh + rows[:, None] * sqs + dims[None, :] * sqd,
        mask=row_in[:, None] & dim_in[None, :],
        other=0.0,
    )
    best = tl.full([BLOCK_M], -1.0e30, tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, seq_k, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_in = cols < seq_k
        k = tl.load(
            k_ptr + b * skb + h * skh + cols[None, :] * sks + dims[:, None] * skd,
            mask=col_in[None, :] & dim_in[:, None],
            other=0.0,
        )
        scores = tl.dot(q, k, input_precision="ieee") * scale
        if HAS_MASK:
            scores += tl.load(
                mask_ptr + b * smb + h * smh + rows[:, None] * smq + cols[None, :] * smk,
                mask=row_in[:, None] & col_in[None, :],
                other=0.0,
            ).to(tl.float32)
        keep = col_in[None, :]
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        scores = tl.where(keep, scores, -1.0e30)
        new_best = tl.maximum(best, tl.max(scores, axis=1))
        weights = tl.exp(scores - new_best[:, None])
        weights = tl.where(keep, weights, 0.0)
        shrink = tl.exp(best - new_best)
        total = total * shrink + tl.sum(weights, axis=1)
        v = tl.load(
            v_ptr + b * svb + h * svh + cols[:, None] * svs + dims[None, :] * svd,
            mask=col_in[:, None] & dim_in[None, :],
            other=0.0,
        )
        acc = acc * shrink[:, None] + tl.dot(weights.to(v.dtype), v, input_precision="ieee")
        best = new_best
    out = acc / total[:, None]
    tl.store(
        out_ptr + bh * seq_q * head_dim + rows[:, None] * head_dim + dims[None, :],
        out.to(q.dtype),
        mask=row_in[:, None] & dim_in[None, :],
    )


class ShortAttention(Kernel):
    name = "attention"
    summary = "short-sequence attention (online softmax; additive or boolean mask, causal), batch 1–32"
    replaces = "aten.scaled_dot_product_attention (no dropout, same heads for q, k and v)"
    op_schema = "tapeout::attention"
    op_signature = "(Tensor q, Tensor k, Tensor v, Tensor? mask, bool causal, float scale, str config) -> Tensor"
    source = _attention
    shrinkable = ("batch", "heads", "seq")
    # seen with Triton 3.9: its interpreter's tl.dot on two bfloat16 tiles is off by 1e10 (numpy has no bfloat16)
    interpreter_limits: ClassVar[dict[str, str]] = {
        "bfloat16": "Triton's interpreter computes tl.dot on bfloat16 wrongly: verified on a GPU only"
    }

    def cases(self):
        return [
            Case.of("MiniLM batch 1", batch=1, heads=12, seq=128, dim=32),
            Case.of("MiniLM batch 32", batch=32, heads=12, seq=128, dim=32),
            Case.of("Whisper-tiny encoder", batch=1, heads=6, seq=1500, dim=64),
            Case.of("llama-40m prefill (seq 256)", batch=1, heads=8, seq=256, dim=64),
            Case.of("edge: seq 77, head_dim 40, causal", batch=2, heads=3, seq=77, dim=40, causal=1),
            Case.of("edge: one position", batch=1, heads=2, seq=1, dim=16),
        ]

    def configs(self, case):
        return [
            Config.of(num_warps=4, BLOCK_M=64, BLOCK_N=64),
            Config.of(num_warps=4, BLOCK_M=32, BLOCK_N=64),
            Config.of(num_warps=8, BLOCK_M=128, BLOCK_N=64),
            Config.of(num_warps=2, BLOCK_M=16, BLOCK_N=32),
        ]

    def inputs(self, case, dtype, generator, device):
        import torch

        t = torch_dtype(dtype)
        b, h, s, d = case["batch"], case["heads"], case["seq"], case["dim"]
        # q, k, v as an encoder makes them: one [b, s, h·d] projection each, viewed per head
        q, k, v = (torch.randn(b, s, h, d, generator=generator).to(device, t).transpose(1, 2) for _ in range(3))
        # the padding mask an encoder passes: [b, 1, 1, s], 0 for a token, a large negative for padding
        mask = torch.zeros(b, 1, 1, s)
        for row in range(b):
            mask[row, ..., s - row % max(s // 2, 1) :] = torch.finfo(torch.float32).min if row else 0.0
        causal = bool(dict(case.dims).get("causal", 0))
        return {
            "q": q,
            "k": k,
            "v": v,
            "mask": None if causal else mask.to(device, t),
            "causal": causal,
            "scale": d**-0.5,
        }

    def outputs(self, case, dtype, inputs, device):
        import torch

        return {"out": torch.empty(inputs["q"].shape, dtype=inputs["q"].dtype, device=device)}

    def eager(self, q, k, v, mask, causal, scale):
        import torch.nn.functional as F

        return {"out": F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)}

    def run(self, inputs, outputs, config):
        import triton

        q, k, v, mask = inputs["q"], inputs["k"], inputs["v"], inputs["mask"]
        b, h, s, d = q.shape
        if d > MAX_HEAD_DIM:
            raise ValueError(f"{self.name}: head_dim {d} is over {MAX_HEAD_DIM}")
        if mask is not None and mask.dtype.is_floating_point is False:
            import torch

            mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
        strides = mask.expand(b, h, s, k.shape[2]).stride() if mask is not None else (0, 0, 0, 0)
        block_d = max(16, triton.next_power_of_2(d))
        grid = (-(-s // config["BLOCK_M"]), b * h)
        self.launcher(q)[grid](
            q,
            k,
            v,
            mask if mask is not None else q,
            outputs["out"],
            h,
            s,
            k.shape[2],
            d,
            float(inputs["scale"]),
            *q.stride(),
            *k.stride(),
            *v.stride(),
            *strides,
            HAS_MASK=mask is not None,
            CAUSAL=bool(inputs["causal"]),
            BLOCK_D=block_d,
            **config.launch(),
        )

    def traffic(self, case, dtype):
        b, h, s, d = case["batch"], case["heads"], case["seq"], case["dim"]
        return (4 * b * h * s * d + b * s * s) * itemsize(dtype), 4.0 * b * h * s * s * d

    def call(self, q, k, v, mask, causal, scale, config):
        import torch

        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        config = self.config_named(config, None)
        self.run({"q": q, "k": k, "v": v, "mask": mask, "causal": causal, "scale": scale}, {"out": out}, config)
        return out

    def match(self, node):
        import torch

        aten = torch.ops.aten
        if node.op == "call_function" and node.target == aten.matmul.default:
            return self._match_eager(node, aten)
        if node.op != "call_function" or node.target != aten.scaled_dot_product_attention.default:
            return None
        args = list(node.args) + [None] * 4
        q, k, v, mask = args[:4]
        dropout = node.kwargs.get("dropout_p", args[4] if len(node.args) > 4 else 0.0)
        causal = node.kwargs.get("is_causal", args[5] if len(node.args) > 5 else False)
        scale = node.kwargs.get("scale", args[6] if len(node.args) > 6 else None)
        mask = node.kwargs.get("attn_mask", mask)
        vals = [getattr(t, "meta", {}).get("val") for t in (q, k, v)]
        if dropout or node.kwargs.get("enable_gqa") or any(t is None or t.dim() != 4 for t in vals):
            return None
        if (
            not same_shape(vals[0].shape[1:2], vals[1].shape[1:2])
            or not same_shape(vals[1].shape, vals[2].shape)
            or concrete(vals[0].shape[-1]) > MAX_HEAD_DIM
        ):
            return None
        if mask is not None and getattr(mask, "meta", {}).get("val") is None:
            return None
        b, h, s, d = (concrete(x) for x in vals[0].shape)
        return Match(
            self.name,
            [node],
            (q, k, v, mask, bool(causal), float(scale if scale is not None else d**-0.5)),
            Case.of(batch=b, heads=h, seq=s, dim=d),
            str(vals[0].dtype).removeprefix("torch."),
        )

    def _match_eager(self, out, aten):
        """The attention transformers' eager path writes (BERT, Llama, …): matmul(q, kᵀ) · scale + mask →
        softmax(−1) [→ to(dtype)] [→ dropout(p=0 or eval)] → matmul(·, v); kᵀ a transpose of k's last two dims."""
        chain = [out]
        probs, v = out.args
        probs = _through(probs, chain, aten)
        if _target(probs) != aten.softmax.int or len(probs.args) < 2 or probs.args[1] not in (-1, 3):
            return None
        chain.append(probs)
        scores, mask = probs.args[0], None
        if _target(scores) == aten.add.Tensor and _only_user(scores, probs):
            scores, mask = scores.args
            chain.append(probs.args[0])
        scale = None
        if (
            _target(scores) in (aten.mul.Tensor, aten.div.Tensor)
            and isinstance(scores.args[1], float)
            and _only_user(scores, chain[-1])
        ):
            scale = scores.args[1] if _target(scores) == aten.mul.Tensor else 1 / scores.args[1]
            chain.append(scores)
            scores = scores.args[0]
        if _target(scores) != aten.matmul.default or not _only_user(scores, chain[-1]):
            return None
        chain.append(scores)
        q, kt = scores.args
        if _target(kt) != aten.transpose.int or sorted(a % 4 for a in kt.args[1:3]) != [2, 3]:
            return None
        chain.append(kt)
        k = kt.args[0]
        vals = [getattr(t, "meta", {}).get("val") for t in (q, k, v, out)]
        if any(t is None or t.dim() != 4 for t in vals) or not same_shape(vals[0].shape, vals[1].shape, vals[2].shape):
            return None
        if concrete(vals[0].shape[-1]) > MAX_HEAD_DIM or (
            mask is not None and getattr(mask, "meta", {}).get("val") is None
        ):
            return None
        b, h, s, d = (concrete(x) for x in vals[0].shape)
        return Match(
            self.name,
            chain[::-1],
            (q, k, v, mask, False, float(scale if scale is not None else 1.0)),
            Case.of(batch=b, heads=h, seq=s, dim=d),
            str(vals[0].dtype).removeprefix("torch."),
        )


def _target(node):
    return getattr(node, "target", None)


def _only_user(node, user) -> bool:
    """`user` is the one consumer of `node` (torch.export's dtype assertions aside)."""
    return [u for u in node.users if "_assert_tensor_metadata" not in str(u.target)] == [user]


def _through(node, chain: list, aten):
    """Past a dropout that drops nothing (p = 0 or eval) and the cast after a softmax, collecting them in `chain`."""
    while True:
        idle_dropout = _target(node) == aten.dropout.default and (node.args[1] == 0.0 or node.args[2] is False)
        # softmax computed in float32 and cast back: the kernel does the same
        cast_back = _target(node) == aten.to.dtype and _target(node.args[0]) == aten.softmax.int
        if (idle_dropout or cast_back) and _only_user(node, chain[-1]):
            chain.append(node)
            node = node.args[0]
        else:
            return node
