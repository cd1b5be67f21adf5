"""The fused Triton kernels on an NVIDIA GPU: each at the sample models' shapes beside eager PyTorch,
torch.compile (Inductor, default and max-autotune) and, for the decode GEMVs, ONNX Runtime's MatMulNBits on the
CUDA EP; time, achieved bandwidth and the fraction of the device spec's roof.

    python bench/kernels.py [--calls 100] [--dtype float16] [KERNEL ...]

Each kernel is verified on this GPU first (`tapeout kernels verify`); a kernel that fails is not timed. Timing is
the harness's (toolkit/measurement/kernel_harness.py): CUDA events around the call alone, a warm-up, inputs rotated
over a pool, L2 flushed before each call where the working set would fit it, the GPU spinning until the host has
enqueued the call (device time; the Python launch's host time is its own column), p50 and p90 over the calls. The
tuned configs and times go to the device's kernel timings file, which the substitution pass decides from.
Exits 4 without a CUDA GPU.

Model level (`--model minilm`, the default): all-MiniLM-L6-v2's architecture (random weights: time does not depend
on them) at batch 1, sequence 128, in the bench's dtype, exported with torch.export; the substitution pass decides
from the timings just saved; then eager PyTorch, torch.compile of the model, the substituted program run eagerly
and torch.compile of the substituted program, each timed over the same inputs without an L2 flush (a model's steady
state, as `tapeout check` on ort-cuda measures), with the largest difference from eager's output. MiniLM through an
`aoti-cuda` package with the kernels substituted is bench/gpu.py's (`--samples minilm`): the build runs the pass.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

from cuda_host import cuda_torch, fail


def matmulnbits_ms(kernel, case, dtype: str, calls: int) -> str:
    """ONNX Runtime's MatMulNBits on the CUDA EP for the same packed weights, p50 ms (or why not)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime not installed"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return "not measured: onnxruntime-gpu (the CUDA EP) not installed"
    import numpy as np
    import torch
    from onnx import TensorProto, helper, numpy_helper

    inputs = kernel.inputs(case, dtype, torch.Generator().manual_seed(0), "cpu")
    elem = {"float16": TensorProto.FLOAT16, "float32": TensorProto.FLOAT}.get(dtype)
    if elem is None:
        return f"not measured: MatMulNBits takes float16 or float32, not {dtype}"
    m, n, k = case["m"], case["n"], case["k"]
    weights = [
        numpy_helper.from_array(inputs["weight"].numpy(), "B"),
        numpy_helper.from_array(inputs["scales"].reshape(-1).numpy(), "scales"),
    ]
    names = ["A", "B", "scales"]
    if inputs["zero_points"] is not None:
        weights.append(numpy_helper.from_array(inputs["zero_points"].reshape(-1).numpy(), "zp"))
        names.append("zp")
    node = helper.make_node(
        "MatMulNBits", names, ["Y"], domain="com.microsoft", K=k, N=n, bits=kernel.bits, block_size=inputs["group"]
    )
    graph = helper.make_graph(
        [node],
        "gemv",
        [helper.make_tensor_value_info("A", elem, [m, k])],
        [helper.make_tensor_value_info("Y", elem, [m, n])],
        initializer=weights,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    binding = session.io_binding()
    x = ort.OrtValue.ortvalue_from_numpy(inputs["x"].numpy(), "cuda", 0)
    binding.bind_ortvalue_input("A", x)
    binding.bind_output("Y", "cuda")
    for _ in range(10):
        session.run_with_iobinding(binding)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        session.run_with_iobinding(binding)  # synchronous: returns when the GPU is done
        times.append((time.perf_counter() - start) * 1e3)
    return f"{float(np.median(times)):.4f} ms (host-timed, includes ORT's launch)"


def minilm_rows(dtype: str, calls: int, device_key: str) -> None:
    """MiniLM batch 1: eager, torch.compile, the substituted program eager and compiled; p50 (p90) ms."""
    import numpy as np
    import torch
    from transformers import BertConfig, BertModel

    from tapeout.measurement import kernel_harness as harness
    from tapeout.targets.kernels import substitute, timings

    config = BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    model = BertModel(config, add_pooling_layer=False).eval().to("cuda", getattr(torch, dtype))

    def draw(seed):
        g = torch.Generator().manual_seed(seed)
        mask = torch.ones(1, 128, dtype=torch.int64)
        mask[0, 100:] = 0
        return tuple(
            t.cuda()
            for t in (torch.randint(0, 30522, (1, 128), generator=g), mask, torch.zeros(1, 128, dtype=torch.int64))
        )

    pool = [draw(i) for i in range(harness.POOL)]
    rows = []

    def timed(label, fn, note=""):
        try:
            with torch.no_grad():
                out = fn(*pool[0])
                times = harness.time_calls(lambda p: fn(*p), pool, calls, device_only=False)
        except Exception as exc:  # a path that does not run here is a row saying why, not the end of the bench
            rows.append((label, None, None, f"did not run: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"))
            return None
        out = out[0] if isinstance(out, (tuple, list)) else getattr(out, "last_hidden_state", out)
        rows.append((label, float(np.median(times)), float(np.percentile(times, 90)), note))
        return out

    start = time.perf_counter()
    want = timed("eager PyTorch", model)
    torch._dynamo.reset()
    timed("torch.compile (Inductor, default)", torch.compile(model))
    with torch.no_grad():
        program = torch.export.export(model, pool[0])
        replaced, decisions = substitute.substitute(program, timings.load(device_key), device_key)
    kept = [d for d in decisions if not d.substituted]
    what = f"{replaced} of {len(decisions)} chains substituted"
    if kept:
        what += f"; kept, e.g. {kept[0].kernel} at {kept[0].case}: {kept[0].reason}"
    module = program.module()
    got = timed("exported, kernels substituted, eager", module, what)
    torch._dynamo.reset()
    timed("exported, kernels substituted, torch.compile", torch.compile(module))
    diff = f"{float((got.float() - want.float()).abs().max()):.3g}" if got is not None and want is not None else "—"
    print(
        f"\n# MiniLM (all-MiniLM-L6-v2 architecture, random weights) batch 1, sequence 128 (28 padded), {dtype}; "
        f"{calls} calls over {len(pool)} input sets, no L2 flush; {time.perf_counter() - start:.0f} s with compiles"
    )
    print("| path | p50 ms | p90 ms | note |\n|---|---|---|---|")
    for label, p50, p90, note in rows:
        print(f"| {label} | {p50:.4f} | {p90:.4f} | {note} |" if p50 is not None else f"| {label} | — | — | {note} |")
    print(
        f"max |substituted − eager| on the output: {diff}; ort-cuda's MiniLM batch 1 (issue 32): 1.37 ms p50 on "
        "an H100; the issue's goal ≤ 0.5 ms there",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kernels", nargs="*")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument(
        "--max-autotune-cases",
        type=int,
        default=None,
        metavar="N",
        help="compile max-autotune for each kernel's first N cases only (default: all; each is a "
        "compile of tens of seconds)",
    )
    parser.add_argument(
        "--model",
        choices=("minilm", "none"),
        default="minilm",
        help="the model-level rows after the kernels (default minilm)",
    )
    parser.add_argument("--model-only", action="store_true", help="only the model-level rows, from saved timings")
    args = parser.parse_args()
    torch = cuda_torch("run it on the GPU machine; `tapeout kernels verify` checks the kernels here")
    try:
        import triton
    except ImportError:
        fail('triton is not installed (pip install "tapeout[kernels]")')
    from tapeout.core.config import device_matching
    from tapeout.measurement import kernel_harness as harness
    from tapeout.targets import kernels as registry

    where = harness.gpu()
    spec = device_matching(where["name"])
    print(
        f"# {where['name']} (sm{where['capability'][0]}{where['capability'][1]}, L2 {where['l2_bytes'] >> 20} MiB); "
        f"torch {torch.__version__}, triton {triton.__version__}; roof from "
        f"{spec.name if spec else 'no device spec names this GPU'}; host {platform.processor() or platform.machine()}"
    )
    print(
        "| kernel | case | dtype | kernel p50 (p90) ms | eager ms | Inductor ms | max-autotune ms | best other / kernel "
        "| GB/s | roof | host launch µs | MatMulNBits (CUDA EP) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    failed = 0
    for name in [] if args.model_only else args.kernels or registry.names():
        kernel = registry.get(name)
        checks = harness.verify(kernel, "cuda", (args.dtype,))
        if any(c.ok is False for c in checks):
            bad = next(c for c in checks if c.ok is False)
            print(f"| {name} | — | {args.dtype} | FAILED verification on this GPU: {bad.case}: {bad.problem} |||||||||")
            failed += 1
            continue
        cases = kernel.bench_cases()
        tuned = len(cases) if args.max_autotune_cases is None else args.max_autotune_cases
        found = []
        for part, autotune in ((cases[:tuned], True), (cases[tuned:], False)):
            if part:  # (bench() given no cases times them all)
                found += harness.bench(
                    kernel, args.dtype, args.calls, part, max_autotune=autotune, spec=spec, retune=True
                )
        for row in found:
            others = [t for t in (row.eager_ms, row.inductor_ms, row.max_autotune_ms) if t]
            ort_row = "—"
            if name.startswith("gemv"):
                case = next(c for c in kernel.bench_cases() if c.key == row.case)
                ort_row = matmulnbits_ms(kernel, case, args.dtype, args.calls)
            inductor = f"{row.inductor_ms:.4f}" if row.inductor_ms else "—"
            autotuned = f"{row.max_autotune_ms:.4f}" if row.max_autotune_ms else "not compiled (--max-autotune-cases)"
            print(
                f"| {name} | {row.case} ({row.label}) | {row.dtype} | {row.kernel_ms:.4f} ({row.kernel_p90_ms:.4f}) | "
                f"{row.eager_ms:.4f} | {inductor} | {autotuned} | {min(others) / row.kernel_ms:.2f}× | "
                f"{row.achieved_gbs:.0f} | {f'{row.roof_fraction:.0%}' if row.roof_fraction else '—'} | "
                f"{row.launch_us:.0f} | {ort_row} |" + "".join(f" {n}" for n in row.notes),
                flush=True,
            )
    sys.stdout.flush()
    if args.model == "minilm":
        minilm_rows(args.dtype, args.calls, where["key"])
    print("\nMiniLM batch 1 through an aoti-cuda package with these timings substituted: bench/gpu.py --samples minilm")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
