"""The fused Triton kernels on an NVIDIA GPU: each at the sample models' shapes beside eager PyTorch,
torch.compile (Inductor, default and max-autotune) and, for the decode GEMVs, ONNX Runtime's MatMulNBits on the
CUDA EP; time, achieved bandwidth and the fraction of the device spec's roof.

    python bench/kernels.py [--calls 100] [--dtype float16] [KERNEL ...]

Each kernel is verified on this GPU first (`tapeout kernels verify`); a kernel that fails is not timed. Timing is
the harness's (toolkit/measurement/kernel_harness.py): CUDA events around the call alone, a warm-up, inputs rotated
over a pool, L2 flushed before each call where the working set would fit it, p50 and p90 over the calls. The
tuned configs and times go to the device's kernel timings file, which the substitution pass decides from.
Exits 4 without a CUDA GPU. The model-level rows the issue names (MiniLM batch 1 through aoti + kernels) need
the aoti target's CUDA path and are printed as owed.
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
    weights = [numpy_helper.from_array(inputs["weight"].numpy(), "B"),
               numpy_helper.from_array(inputs["scales"].reshape(-1).numpy(), "scales")]
    names = ["A", "B", "scales"]
    if inputs["zero_points"] is not None:
        weights.append(numpy_helper.from_array(inputs["zero_points"].reshape(-1).numpy(), "zp"))
        names.append("zp")
    node = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", K=k, N=n, bits=kernel.bits,
                            block_size=inputs["group"])
    graph = helper.make_graph([node], "gemv", [helper.make_tensor_value_info("A", elem, [m, k])],
                              [helper.make_tensor_value_info("Y", elem, [m, n])], initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kernels", nargs="*")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--dtype", default="float16")
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
    print(f"# {where['name']} (sm{where['capability'][0]}{where['capability'][1]}, L2 {where['l2_bytes'] >> 20} MiB); "
          f"torch {torch.__version__}, triton {triton.__version__}; roof from "
          f"{spec.name if spec else 'no device spec names this GPU'}; host {platform.processor() or platform.machine()}")
    print("| kernel | case | dtype | kernel p50 (p90) ms | eager ms | Inductor ms | max-autotune ms | best other / kernel "
          "| GB/s | roof | MatMulNBits (CUDA EP) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    failed = 0
    for name in args.kernels or registry.names():
        kernel = registry.get(name)
        checks = harness.verify(kernel, "cuda", (args.dtype,))
        if any(c.ok is False for c in checks):
            bad = next(c for c in checks if c.ok is False)
            print(f"| {name} | — | {args.dtype} | FAILED verification on this GPU: {bad.case}: {bad.problem} |||||||||")
            failed += 1
            continue
        for row in harness.bench(kernel, args.dtype, args.calls, max_autotune=True, spec=spec, retune=True):
            others = [t for t in (row.eager_ms, row.inductor_ms, row.max_autotune_ms) if t]
            ort_row = "—"
            if name.startswith("gemv"):
                case = next(c for c in kernel.bench_cases() if c.key == row.case)
                ort_row = matmulnbits_ms(kernel, case, args.dtype, args.calls)
            print(f"| {name} | {row.case} ({row.label}) | {row.dtype} | {row.kernel_ms:.4f} ({row.kernel_p90_ms:.4f}) | "
                  f"{row.eager_ms:.4f} | {row.inductor_ms or float('nan'):.4f} | {row.max_autotune_ms or float('nan'):.4f} | "
                  f"{min(others) / row.kernel_ms:.2f}× | {row.achieved_gbs:.0f} | "
                  f"{f'{row.roof_fraction:.0%}' if row.roof_fraction else '—'} | {ort_row} |")
    print("\nowed: MiniLM batch 1 through aoti + kernels against ort-cuda and torch.compile, and the tiny-lm decode TPOT "
          "against the HBM roof, need the aoti target's CUDA path (issue 31), which is not built yet.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
