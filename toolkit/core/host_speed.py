"""This host's own speed, sampled: copy bandwidth, the FP32 (and INT8) matrix-multiply rates and an FP32
convolution's. The estimator prices the host's CPU with them (`estimation.roofline`), and every measurement records
them beside its timings (`host_state`), so that a diff can tell a machine that moved from a build that did.
"""

from __future__ import annotations

import time

import numpy as np


def matmul_rates(n: int, runs: int) -> list[float]:
    """FP32 FLOP/s of each of `runs` n x n matrix multiplies on this host's cores (numpy's BLAS), after
    one warm-up."""
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    b = a.copy()
    a @ b
    rates = []
    for _ in range(runs):
        start = time.perf_counter()
        a @ b
        rates.append(2 * n**3 / (time.perf_counter() - start))
    return rates


def ort_matmul_rates(n: int, runs: int, int8: bool = False) -> list[float]:
    """FP32 FLOP/s of each of `runs` n x n matrix multiplies in ONNX Runtime's CPU EP on all this host's cores
    (MLAS: the GEMM the CPU targets run), after one warm-up. numpy's BLAS may run narrower kernels than the CPU
    has: on a 2-core AMD EPYC (Zen 4) OpenBLAS reached 127 GFLOP/s on one thread where ONNX Runtime ran MiniLM at
    164 on one thread, so a roof from numpy alone was beaten by the kernels it bounds. `int8`: the rate of its
    MatMulInteger with uint8 activations and int8 weights instead (what a dynamic INT8 plan runs; on a CPU with AMX
    MLAS runs it on the tiles: 1,398 GOP/s on one thread of an Intel Xeon with amx_int8, 9.3 times its FP32)."""
    graph, feeds = matmul_graph(n, int8)
    return _ort_rates(graph, feeds, 2 * n**3, runs)


def matmul_graph(n: int, int8: bool = False):
    """(an n x n MatMul graph, its feeds): FP32, or with `int8` MatMulInteger of uint8 activations and int8 weights."""
    from onnx import TensorProto, helper

    kinds = (TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32) if int8 else (TensorProto.FLOAT,) * 3
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger" if int8 else "MatMul", ["a", "b"], ["c"])],
        "matmul",
        [helper.make_tensor_value_info(x, kind, [n, n]) for x, kind in zip("ab", kinds[:2], strict=True)],
        [helper.make_tensor_value_info("c", kinds[2], [n, n])],
    )
    rng = np.random.default_rng(0)
    if int8:
        feeds = {"a": rng.integers(0, 256, (n, n), dtype=np.uint8), "b": rng.integers(-128, 128, (n, n), dtype=np.int8)}
    else:
        a = rng.random((n, n), dtype=np.float32)
        feeds = {"a": a, "b": a.copy()}
    return graph, feeds


def ort_session(graph, threads: int = 0):
    """ONNX Runtime's CPU session of a one-graph model (`threads` intra-op threads; 0: one per core)."""
    import onnxruntime as ort
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what every onnxruntime this supports reads
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = options.inter_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def ort_conv_rates(runs: int) -> list[float]:
    """FP32 FLOP/s of each of `runs` 3×3 convolutions (64 → 64 channels over 56×56, ResNet's first stage) in ONNX
    Runtime's CPU EP on all this host's cores, after one warm-up: MLAS's direct convolution in its blocked NCHWc
    layout, whose register tiling can beat its own GEMM. On one thread of an Intel Xeon (AVX-512) a CNN's 3×3
    convolutions ran 203 GFLOP/s where its 1536² multiply ran 151, so a roof from the multiply alone floored every
    convolution's prediction ~20 % above its time."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((64, 64, 3, 3)).astype(np.float32) * 0.05, "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 56, 56])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 56, 56])],
        [weight],
    )
    feeds = {"x": rng.standard_normal((1, 64, 56, 56)).astype(np.float32)}
    return _ort_rates(graph, feeds, 2 * 64 * 64 * 9 * 56 * 56, runs)


def _ort_rates(graph, feeds: dict[str, np.ndarray], work: float, runs: int) -> list[float]:
    """`work` (FLOPs or integer ops) per second of each of `runs` runs of the one-graph model in ONNX Runtime's CPU EP
    on all this host's cores, after one warm-up."""
    session = ort_session(graph)
    session.run(None, feeds)
    rates = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        rates.append(work / (time.perf_counter() - start))
    return rates


def copy_rates(mib: float, copies: int, repeat: int = 1) -> list[float]:
    """Copy bandwidth (read + write bytes per second) of each of `copies` timings of `repeat` copies of a
    `mib` array into one already written (its pages mapped: a fresh one pays page faults on the first copy)."""
    src = np.ones(int(mib * 2**20) // 8)
    dst = np.zeros_like(src)
    rates = []
    for _ in range(copies):
        start = time.perf_counter()
        for _ in range(repeat):
            np.copyto(dst, src)
        rates.append(2 * src.nbytes * repeat / (time.perf_counter() - start))
    return rates


def read_rates(mib: float, reads: int) -> list[float]:
    """Read bandwidth (bytes per second) of each of `reads` sums, on one thread, over an array of `mib` already
    written: what one core streams from memory when the array is past its caches (a decode step's weights)."""
    data = np.ones(int(mib * 2**20) // 8)
    rates = []
    for _ in range(reads):
        start = time.perf_counter()
        data.sum()
        rates.append(data.nbytes / (time.perf_counter() - start))
    return rates


def host_state(samples: int = 5) -> dict[str, float | list[float]]:
    """The machine's own speed right now (~0.3 s), taken beside a measurement, as a median and the range
    of `samples` short samples (bandwidth: each the best of 6 copies): on a shared host the copy
    bandwidth swung 24.6-33.4 GB/s within seconds, and a diff of two measurements should say when the
    machine itself moved beyond that."""
    copies = copy_rates(64, 6 * samples)
    bandwidth = [max(copies[i : i + 6]) / 1e9 for i in range(0, len(copies), 6)]
    flops = [r / 1e9 for r in matmul_rates(1024, samples)]
    return {
        "bandwidth_gbs": float(np.median(bandwidth)),
        "bandwidth_gbs_range": [min(bandwidth), max(bandwidth)],
        "fp32_gflops": float(np.median(flops)),
        "fp32_gflops_range": [min(flops), max(flops)],
    }
