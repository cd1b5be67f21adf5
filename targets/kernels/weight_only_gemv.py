"""Weight-only INT4/INT8 matrix-vector product for decode, y = x·dequant(W)ᵀ, on the layout tapeout's INT4 plans
produce (ONNX Runtime's MatMulNBits): W is [N, K/G, G·bits/8] bytes, block-wise along K (block G), two 4-bit
values a byte low nibble first; scales [N, K/G]; zero points absent (symmetric: 8, or 128 for 8-bit) or
[N, ⌈K/G/2⌉] bytes (4-bit, packed the same way) / [N, K/G] (8-bit). Memory-bound at decode: the weights are
read once, in their packed form, and dequantized in registers."""

from __future__ import annotations

import triton.language as tl

from tapeout.targets.kernels.base import Case, Config, Kernel, itemsize, torch_dtype


def _gemv(
    x_ptr,
    w_ptr,
    scale_ptr,
    zp_ptr,
    out_ptr,
    n,
    k,
    blocks,
    zp_cols,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    HAS_ZP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_KB: tl.constexpr,
):
    # One program: BLOCK_N outputs of one row of x, over a row's packed bytes BLOCK_KB at a time, whatever the group
    # (each byte's group is q // width). A tile of many groups keeps many loads in flight per program, and a small
    # BLOCK_N gives a decode GEMV (m = 1) enough programs for the GPU: one group per iteration and 8-64 programs
    # left an H200 at 1-7 % of its bandwidth (docs/kernels.md).
    m = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < n
    acc = tl.zeros([BLOCK_N], tl.float32)
    per_byte: tl.constexpr = 8 // BITS
    width: tl.constexpr = GROUP // per_byte  # bytes per block
    row_bytes = blocks * width
    for start in range(0, row_bytes, BLOCK_KB):
        q = start + tl.arange(0, BLOCK_KB)
        both = col_in[:, None] & (q < row_bytes)[None, :]
        raw = tl.load(w_ptr + cols[:, None] * row_bytes + q[None, :], mask=both, other=0).to(tl.int32)
        group = q // width
        scale = tl.load(scale_ptr + cols[:, None] * blocks + group[None, :], mask=both, other=0.0).to(tl.float32)
        if HAS_ZP:
            if BITS == 4:
                zbyte = tl.load(zp_ptr + cols[:, None] * zp_cols + group[None, :] // 2, mask=both, other=0).to(tl.int32)
                zero = ((zbyte >> ((group[None, :] % 2) * 4)) & 15).to(tl.float32)
            else:
                zero = tl.load(zp_ptr + cols[:, None] * zp_cols + group[None, :], mask=both, other=0).to(tl.float32)
        else:
            zero = tl.full([BLOCK_N, BLOCK_KB], 2 ** (BITS - 1), tl.float32)
        if BITS == 4:
            k_even = 2 * q  # byte q holds positions 2q (low nibble) and 2q + 1
            x_even = tl.load(x_ptr + m * k + k_even, mask=k_even < k, other=0.0).to(tl.float32)
            x_odd = tl.load(x_ptr + m * k + k_even + 1, mask=k_even + 1 < k, other=0.0).to(tl.float32)
            low = (raw & 15).to(tl.float32) - zero
            high = (raw >> 4).to(tl.float32) - zero
            acc += tl.sum((low * x_even[None, :] + high * x_odd[None, :]) * scale, axis=1)
        else:
            xs = tl.load(x_ptr + m * k + q, mask=q < k, other=0.0).to(tl.float32)
            acc += tl.sum((raw.to(tl.float32) - zero) * xs[None, :] * scale, axis=1)
    tl.store(out_ptr + m * n + cols, acc.to(out_ptr.dtype.element_ty), mask=col_in)


class _Gemv(Kernel):
    source = _gemv
    shrinkable = ("n", "m")
    bits: int
    dtypes = ("float32", "float16", "bfloat16")

    def cases(self):
        return [
            Case.of("Llama-style decode: q/o projection", m=1, n=2048, k=2048, group=32),
            Case.of("Llama-style decode: MLP up", m=1, n=5632, k=2048, group=32),
            Case.of("Llama-style decode: MLP down", m=1, n=2048, k=5632, group=128),
            Case.of("tiny-lm decode", m=1, n=256, k=256, group=32),
            Case.of("edge: K not a multiple of the block, zero points, 3 rows", m=3, n=45, k=100, group=32, zp=1),
            Case.of("edge: one output", m=1, n=1, k=64, group=64, zp=1),
        ]

    def work(self, case):
        return case["m"] * case["n"] * case["k"]

    def configs(self, case):
        # small BLOCK_N with wide byte tiles first (a decode GEMV's shape); the last is the first kernel's shape of
        # work, one 16-byte group of 64 outputs per iteration
        return [
            Config.of(num_warps=4, BLOCK_N=16, BLOCK_KB=256),
            Config.of(num_warps=4, BLOCK_N=8, BLOCK_KB=512),
            Config.of(num_warps=4, BLOCK_N=32, BLOCK_KB=128),
            Config.of(num_warps=8, BLOCK_N=16, BLOCK_KB=512),
            Config.of(num_warps=2, BLOCK_N=4, BLOCK_KB=512),
            Config.of(num_warps=4, BLOCK_N=64, BLOCK_KB=16),
        ]

    def inputs(self, case, dtype, generator, device):
        import torch

        m, n, k, g = case["m"], case["n"], case["k"], case["group"]
        blocks = -(-k // g)
        levels = 1 << self.bits
        values = torch.randint(0, levels, (n, blocks * g), generator=generator, dtype=torch.int32)
        if self.bits == 4:
            packed = (values[:, 0::2] | (values[:, 1::2] << 4)).to(torch.uint8).reshape(n, blocks, g // 2)
        else:
            packed = values.to(torch.uint8).reshape(n, blocks, g)
        zp = None
        if dict(case.dims).get("zp"):
            zeros = torch.randint(0, levels, (n, blocks), generator=generator, dtype=torch.int32)
            if self.bits == 4:
                zeros = torch.nn.functional.pad(zeros, (0, blocks % 2))
                zp = (zeros[:, 0::2] | (zeros[:, 1::2] << 4)).to(torch.uint8)
            else:
                zp = zeros.to(torch.uint8)
        scales = torch.rand(n, blocks, generator=generator) * 0.02 + 0.001
        return {
            "x": torch.randn(m, k, generator=generator).to(device, torch_dtype(dtype)),
            "weight": packed.to(device),
            "scales": scales.to(device, torch_dtype(dtype)),
            "zero_points": None if zp is None else zp.to(device),
            "k": k,
            "group": g,
        }

    def outputs(self, case, dtype, inputs, device):
        import torch

        return {"out": torch.empty(case["m"], case["n"], dtype=inputs["x"].dtype, device=device)}

    def dequantize(self, weight, scales, zero_points, k, group):
        """W as float32 [N, K] at the scales' precision (what the eager chain multiplies by)."""
        import torch

        n, blocks = weight.shape[0], weight.shape[1]
        raw = weight.to(torch.int32)
        if self.bits == 4:
            values = torch.stack([raw & 15, raw >> 4], dim=-1).reshape(n, blocks, group)
        else:
            values = raw.reshape(n, blocks, group)
        if zero_points is None:
            zeros = torch.full((n, blocks), 1 << (self.bits - 1), device=weight.device)
        elif self.bits == 4:
            z = zero_points.to(torch.int32)
            zeros = torch.stack([z & 15, z >> 4], dim=-1).reshape(n, -1)[:, :blocks]
        else:
            zeros = zero_points.to(torch.int32)
        w = (values.float() - zeros[..., None].float()) * scales.float()[..., None]
        return w.reshape(n, blocks * group)[:, :k]

    def eager(self, x, weight, scales, zero_points, k, group):
        return {"out": x @ self.dequantize(weight, scales, zero_points, k, group).to(x.dtype).T}

    def run(self, inputs, outputs, config):
        x, weight, zp = inputs["x"], inputs["weight"], inputs["zero_points"]
        m, n = outputs["out"].shape
        self.launcher(x)[(m, -(-n // config["BLOCK_N"]))](
            x.contiguous(),
            weight,
            inputs["scales"],
            zp if zp is not None else weight,
            outputs["out"],
            n,
            inputs["k"],
            weight.shape[1],
            zp.shape[1] if zp is not None else 0,
            BITS=self.bits,
            GROUP=inputs["group"],
            HAS_ZP=zp is not None,
            **config.launch(),
        )

    def traffic(self, case, dtype):
        m, n, k, g = case["m"], case["n"], case["k"], case["group"]
        blocks = -(-k // g)
        weights = n * blocks * g * self.bits / 8 + n * blocks * itemsize(dtype)
        return weights + (m * k + m * n) * itemsize(dtype), 2.0 * m * n * k


class GemvInt4(_Gemv):
    name = "gemv-int4"
    summary = "weight-only INT4 matrix-vector product for decode (MatMulNBits layout, block-wise scales)"
    replaces = "nothing in a torch.export program yet (no tapeout path makes weight-only INT4 programs); timed against ONNX Runtime's MatMulNBits"
    op_schema = "tapeout::gemv_int4"
    bits = 4


class GemvInt8(_Gemv):
    name = "gemv-int8"
    summary = "weight-only INT8 matrix-vector product for decode (MatMulNBits layout, block-wise scales)"
    replaces = "nothing in a torch.export program yet; timed against ONNX Runtime's MatMulNBits (bits = 8)"
    op_schema = "tapeout::gemv_int8"
    bits = 8
