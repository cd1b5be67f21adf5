"""NVIDIA GPU figures: tapeout's GPU builds (ort-cuda, aoti-cuda, tensorrt) beside torch on the same GPU, in one process.

    python bench/gpu.py [--skip-build] [--blocks 10] [--runs 40] [--samples minilm digits-cnn tiny-lm]
                        [--batches 1 32] [--precisions fp32 bf16] [--max-autotune]

Per case (MiniLM at batch 1 and 32, seq 128; digits-cnn; tiny-lm at 128 bytes): `tapeout build` makes the
artifacts; then this process times, in interleaved blocks (A B C D E, A B C D E, ...), every variant on the same
inputs:

  tapeout cuda-fp32 / cuda-fp16   where the CUDA EP is installed (onnxruntime-gpu): the build's artifact through
                                  tapeout's own session: IOBinding, inputs and outputs resident on the GPU, a sync per run
  tapeout aoti-cuda-fp32 / -bf16  the build's AOTInductor package, compiled on this GPU by the build, through
                                  tapeout's session: inputs resident on the GPU, a device sync per run
  torch eager FP32 / FP16 / BF16  the sample's torch module (.half() / .bfloat16()), a device sync per run
  torch.compile FP16              torch.compile of the FP16 module (default mode), a sync per run
  torch.compile max-autotune FP16 with --max-autotune: mode "max-autotune" (Inductor benchmarks GEMM configs while
                                  compiling, and replays CUDA graphs: each call copies its inputs into the graph's)

  tapeout tensorrt-fp16 / -int8   where TensorRT is installed, batch-1 cases: the build's ONNX, its engine
                                  built here (build time printed) and run through tapeout's TensorRT session
                                  (device buffers, a stream sync per run)

p50/p90 over all timed runs; energy per inference from NVML's total-energy counter over each block
(median of the blocks; the counter updates every few ms to 100 ms, so blocks last ≥ 0.5 s); output
cosine against torch eager FP32 on the same inputs. Compile and build times are printed after the table. Exits 4
without a CUDA GPU and torch with CUDA; a missing runtime (the CUDA EP, TensorRT) is said and its rows left out.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from cuda_host import cuda_torch, fail

REPO = Path(__file__).resolve().parents[1]


def _project(sample: str) -> Path:
    """The sample's project as one forward call: tiny-lm's own tapeout.toml is a generate workload (bench/generate.py
    measures that); forward.toml is the same model as one call over 128 bytes, what this benchmark compares."""
    folder = REPO / "samples" / sample
    return folder / "forward.toml" if (folder / "forward.toml").is_file() else folder


OUT = REPO / "bench" / "builds" / "gpu"
BUILD_SECONDS: dict[str, float] = {}
COMPILE_SECONDS: dict[str, float] = {}
PRECISIONS = (
    "fp32",
    "fp16",
    "bf16",
    "int8",
)  # of the tapeout builds: ort-cuda fp32/fp16, aoti-cuda fp32/bf16, TensorRT fp16/int8
CASES = (("minilm", 1), ("minilm", 32), ("digits-cnn", 1), ("tiny-lm", 1))
PROFILE = """extends = "{base}"
[check]
iterations = 100
repeats = 1
energy_window_s = 1.0
op_profile = false
"""


def _require_gpu():

    torch = cuda_torch("run it on an NVIDIA GPU with the device-side install from the README")
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        fail(f"NVML is not usable ({exc}): pip install nvidia-ml-py")
    return torch, pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())


def build(sample: str, precision: str, skip: bool, base: str = "cuda") -> Path:
    """`tapeout build` of the sample for profile `{base}-{precision}`; its time is recorded in BUILD_SECONDS."""
    out = OUT / f"{sample}-{base}-{precision}"
    if skip and (out / "manifest.json").is_file():
        return out
    OUT.mkdir(parents=True, exist_ok=True)
    profile = OUT / f"bench-{base}-{precision}.toml"
    profile.write_text(PROFILE.format(base=f"{base}-{precision}"))
    started = time.perf_counter()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tapeout",
            "build",
            str(_project(sample)),
            "--profile",
            str(profile),
            "--out",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode not in (0, 1):
        fail(f"build {sample} {precision} exited {result.returncode}: {result.stderr.strip().splitlines()[-1:]}")
    BUILD_SECONDS[f"{sample} {base}-{precision}"] = time.perf_counter() - started
    print(
        f"built {sample} {base}-{precision} in {time.perf_counter() - started:.0f} s (exit {result.returncode})",
        file=sys.stderr,
    )
    return out


def _inputs(sample: str, batch: int) -> dict[str, np.ndarray]:
    from tapeout.core.config import load_project
    from tapeout.core.inputs import sample_inputs

    project = load_project(_project(sample))
    samples, _ = sample_inputs(project, batch)
    while len(samples) < batch:  # fewer real samples than the batch: repeat them
        samples += samples[: batch - len(samples)]
    return {name: np.concatenate([s[name] for s in samples], axis=0) for name in samples[0]}


def _torch_variants(torch, sample: str, feeds: dict[str, np.ndarray], max_autotune: bool) -> dict:
    from tapeout.core.config import load_project
    from tapeout.exporters import sources

    project = load_project(_project(sample))
    names = [s.name for s in project.inputs]
    module = sources.load(project.model.source, project.root, names, project.model.outputs).module.eval().cuda()
    half, bf16 = copy.deepcopy(module).half(), copy.deepcopy(module).bfloat16()

    def tensors(dtype):
        moved = [torch.from_numpy(np.ascontiguousarray(feeds[n])).cuda() for n in names]
        return [t.to(dtype) if t.is_floating_point() else t for t in moved]  # token ids stay int64

    def runner(model, args, label=None):
        def call():
            with torch.inference_mode():
                result = model(*args)
            torch.cuda.synchronize()
            return result

        if label:  # the first call compiles: timed apart, so the table's warm-up is not the compile
            started = time.perf_counter()
            call()
            COMPILE_SECONDS[f"{sample} {label}"] = time.perf_counter() - started
        return call

    variants = {
        "torch eager FP32": runner(module, tensors(torch.float32)),
        "torch eager FP16": runner(half, tensors(torch.float16)),
        "torch eager BF16": runner(bf16, tensors(torch.bfloat16)),
        "torch.compile FP16": runner(torch.compile(half), tensors(torch.float16), "torch.compile FP16"),
    }
    if max_autotune:
        variants["torch.compile max-autotune FP16"] = runner(
            torch.compile(copy.deepcopy(half), mode="max-autotune"),
            tensors(torch.float16),
            "torch.compile max-autotune FP16",
        )
    return variants


def _first_output(result) -> np.ndarray:
    if isinstance(result, dict):
        result = next(iter(result.values()))
    elif isinstance(result, tuple | list):
        result = result[0]
    if hasattr(result, "detach"):
        return result.detach().float().cpu().numpy()
    return np.asarray(result, dtype=np.float32)


def _ort_variant(build_dir: Path, feeds: dict[str, np.ndarray]):
    from tapeout import targets
    from tapeout.core.artifact import Artifact

    manifest = json.loads((build_dir / "manifest.json").read_text())
    target = targets.create("ort-cuda", manifest["options_resolved"])
    session = target.session(Artifact("ort-cuda", build_dir / "artifact", manifest["artifact"]["main_file"]))
    bound = session.bind(feeds)

    def call():
        bound()
        session.synchronize()

    return call, lambda: next(iter(session.run(feeds).values()))


def _engine_variant(target_name: str, build_dir: Path, feeds: dict[str, np.ndarray]):
    """A device-compiled build (tensorrt, aoti-cuda) through tapeout's session: its engine or package built here
    (or reused from the build), device buffers, a device sync per run; and the engine record (its build time)."""
    from tapeout import targets
    from tapeout.core.artifact import Artifact

    manifest = json.loads((build_dir / "manifest.json").read_text())
    target = targets.create(target_name, manifest["options_resolved"])
    artifact = Artifact(target_name, build_dir / "artifact", manifest["artifact"]["main_file"])
    engine = target.build_engine(artifact, lambda line: print(line, file=sys.stderr))
    session = target.session(artifact)
    bound = session.bind(feeds)

    def call():
        bound()
        session.synchronize()

    return call, lambda: next(iter(session.run(feeds).values())), engine


def _time(variants: dict, blocks: int, runs: int, nvml, handle) -> dict:
    for call in variants.values():  # warm-up: cuDNN autotuning, torch.compile, allocator growth
        for _ in range(20):
            call()
    times = {name: [] for name in variants}
    energy = {name: [] for name in variants}
    for _ in range(blocks):
        for name, call in variants.items():
            count, e0, start = 0, nvml.nvmlDeviceGetTotalEnergyConsumption(handle), time.perf_counter()
            while count < runs or time.perf_counter() - start < 0.5:
                t0 = time.perf_counter_ns()
                call()
                times[name].append((time.perf_counter_ns() - t0) / 1e6)
                count += 1
            energy[name].append((nvml.nvmlDeviceGetTotalEnergyConsumption(handle) - e0) / count)  # mJ
    return {
        name: {
            "p50": float(np.percentile(t, 50)),
            "p90": float(np.percentile(t, 90)),
            "runs": len(t),
            "mj": float(np.median(energy[name])),
        }
        for name, t in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-build", action="store_true", help="reuse bench/builds/gpu/* where complete")
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--runs", type=int, default=40, help="runs per block (a block also lasts at least 0.5 s)")
    parser.add_argument("--samples", nargs="+", choices=sorted({s for s, _ in CASES}), help="only these samples' cases")
    parser.add_argument("--batches", nargs="+", type=int, help="only the cases at these batch sizes")
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=PRECISIONS,
        default=PRECISIONS,
        help="only tapeout builds at these precisions (each aoti-cuda build compiles on the GPU: ~2 min)",
    )
    parser.add_argument(
        "--max-autotune",
        action="store_true",
        help="add torch.compile mode max-autotune (tens of seconds to minutes of compile per case)",
    )
    args = parser.parse_args()
    torch, nvml, handle = _require_gpu()
    import triton

    from tapeout import targets
    from tapeout.core.parity import cosine

    no_ort, no_aoti, no_trt = (targets.why_not_here(t) for t in ("ort-cuda", "aoti-cuda", "tensorrt"))
    import onnxruntime as ort

    print(
        f"GPU {nvml.nvmlDeviceGetName(handle)} · driver {nvml.nvmlSystemGetDriverVersion()} · torch {torch.__version__} "
        f"(CUDA {torch.version.cuda}) · Triton {triton.__version__} · onnxruntime {ort.__version__} · "
        f"CPU {platform.processor() or platform.machine()}"
    )
    for name, why in (("ort-cuda", no_ort), ("aoti-cuda", no_aoti), ("TensorRT", no_trt)):
        if why:
            print(f"{name} rows: not measured, {name} is not usable here ({why})")
    print("| case | variant | p50 ms | p90 ms | p50 vs torch eager FP16 | mJ / inference | cosine vs FP32 |")
    print("|---|---|---|---|---|---|---|")
    engines = []
    cases = [
        (s, b) for s, b in CASES if (not args.samples or s in args.samples) and (not args.batches or b in args.batches)
    ]
    for sample, batch in cases:
        feeds = _inputs(sample, batch)
        variants = _torch_variants(torch, sample, feeds, args.max_autotune)
        outputs = {}
        if not no_ort:
            for precision in [p for p in ("fp32", "fp16") if p in args.precisions]:
                call, run = _ort_variant(build(sample, precision, args.skip_build), feeds)
                variants[f"tapeout cuda-{precision}"] = call
                outputs[f"tapeout cuda-{precision}"] = run()
        if not no_aoti:  # the package is dynamic in the batch: one build serves both MiniLM cases
            for precision in [p for p in ("fp32", "bf16") if p in args.precisions]:
                built = build(sample, precision, args.skip_build or batch > 1, base="aoti-cuda")
                call, run, engine = _engine_variant("aoti-cuda", built, feeds)
                variants[f"tapeout aoti-cuda-{precision}"] = call
                outputs[f"tapeout aoti-cuda-{precision}"] = run()
                if batch == 1:
                    engines.append(
                        f"{sample} aoti-cuda-{precision}: package {engine.action} "
                        f"({engine.summary.get('build_seconds', 0):.1f} s to compile; "
                        f"{engine.summary.get('triton_kernels')} Triton kernels, "
                        f"{engine.summary.get('library_calls')} library calls)"
                    )
        if not no_trt and batch == 1:  # the shipped profiles' engines are built for [dims] batch = 1
            for precision in [p for p in ("fp16", "int8") if p in args.precisions]:
                call, run, engine = _engine_variant(
                    "tensorrt", build(sample, precision, args.skip_build, base="tensorrt"), feeds
                )
                variants[f"tapeout tensorrt-{precision}"] = call
                outputs[f"tapeout tensorrt-{precision}"] = run()
                engines.append(
                    f"{sample} tensorrt-{precision}: engine {engine.action} in {engine.seconds:.1f} s "
                    f"({engine.summary.get('precisions')})"
                )
        for name in [n for n in variants if n.startswith("torch")]:
            outputs[name] = _first_output(variants[name]())
        reference = outputs["torch eager FP32"]
        results = _time(variants, args.blocks, args.runs, nvml, handle)
        base = results["torch eager FP16"]["p50"]
        for name, r in results.items():
            print(
                f"| {sample} batch {batch} | {name} | {r['p50']:.4f} | {r['p90']:.4f} | {base / r['p50']:.2f}× | "
                f"{r['mj']:.4g} | {cosine(outputs[name], reference):.6f} |",
                flush=True,
            )
    for line in engines:
        print(line)
    for what, seconds in {**BUILD_SECONDS, **COMPILE_SECONDS}.items():
        print(f"{what}: {seconds:.1f} s ({'tapeout build' if what in BUILD_SECONDS else 'first call, compiling'})")


if __name__ == "__main__":
    main()
