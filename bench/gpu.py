"""NVIDIA GPU figures: tapeout's ort-cuda builds beside torch on the same GPU, in one process.

    python bench/gpu.py [--skip-build] [--blocks 10] [--runs 40] [--samples minilm digits-cnn tiny-lm]

Per case (MiniLM at batch 1 and 32, seq 128; digits-cnn; tiny-lm at 128 bytes): `tapeout build`
with cuda-fp32 and cuda-fp16 makes the artifacts; then this process times, in interleaved blocks
(A B C D E, A B C D E, ...), every variant on the same inputs:

  tapeout cuda-fp32 / cuda-fp16   the build's artifact through tapeout's own session: IOBinding,
                                  inputs and outputs resident on the GPU, a device sync per run
  torch eager FP32 / FP16         the sample's torch module (FP16: .half()), a device sync per run
  torch.compile FP16              torch.compile of the FP16 module (default mode), a sync per run

  tapeout tensorrt-fp16 / -int8   where TensorRT is installed, batch-1 cases: the build's ONNX, its engine
                                  built here (build time printed) and run through tapeout's TensorRT session
                                  (device buffers, a stream sync per run)

p50/p90 over all timed runs; energy per inference from NVML's total-energy counter over each block
(median of the blocks; the counter updates every few ms to 100 ms, so blocks last ≥ 0.5 s); output
cosine against torch eager FP32 on the same inputs. Exits 4 without a CUDA GPU, the CUDA EP
(onnxruntime-gpu) and torch with CUDA; without TensorRT it says so and prints the other rows.
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
CASES = (("minilm", 1), ("minilm", 32), ("digits-cnn", 1), ("tiny-lm", 1))
PROFILE = """extends = "{base}"
[check]
iterations = 100
repeats = 1
energy_window_s = 1.0
op_profile = false
"""


def _require_gpu():
    from tapeout import targets

    torch = cuda_torch("run it on an NVIDIA GPU with the device-side install from the README")
    probe = targets.target_class("ort-cuda").probe()
    if not probe.available:
        fail(f"ort-cuda is not available: {probe.reason} — {probe.install_hint}")
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        fail(f"NVML is not usable ({exc}): pip install nvidia-ml-py")
    return torch, pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())


def build(sample: str, precision: str, skip: bool, base: str = "cuda") -> Path:
    out = OUT / f"{sample}-{base}-{precision}"
    if skip and (out / "manifest.json").is_file():
        return out
    OUT.mkdir(parents=True, exist_ok=True)
    profile = OUT / f"bench-{base}-{precision}.toml"
    profile.write_text(PROFILE.format(base=f"{base}-{precision}"))
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "tapeout", "build", str(_project(sample)), "--profile",
                             str(profile), "--out", str(out), "--json"], capture_output=True, text=True)
    if result.returncode not in (0, 1):
        fail(f"build {sample} {precision} exited {result.returncode}: {result.stderr.strip().splitlines()[-1:]}")
    print(f"built {sample} {base}-{precision} in {time.perf_counter() - started:.0f} s (exit {result.returncode})",
          file=sys.stderr)
    return out


def _inputs(sample: str, batch: int) -> dict[str, np.ndarray]:
    from tapeout.core.config import load_project
    from tapeout.core.inputs import sample_inputs

    project = load_project(_project(sample))
    samples, _ = sample_inputs(project, batch)
    while len(samples) < batch:  # fewer real samples than the batch: repeat them
        samples += samples[: batch - len(samples)]
    return {name: np.concatenate([s[name] for s in samples], axis=0) for name in samples[0]}


def _torch_variants(torch, sample: str, feeds: dict[str, np.ndarray]) -> dict:
    from tapeout.core.config import load_project
    from tapeout.exporters import sources

    project = load_project(_project(sample))
    names = [s.name for s in project.inputs]
    module = sources.load(project.model.source, project.root, names, project.model.outputs).module.eval().cuda()
    half = copy.deepcopy(module).half()
    compiled = torch.compile(half)

    def tensors(dtype):
        moved = [torch.from_numpy(np.ascontiguousarray(feeds[n])).cuda() for n in names]
        return [t.to(dtype) if t.is_floating_point() else t for t in moved]  # token ids stay int64

    def runner(model, args):
        def call():
            with torch.inference_mode():
                result = model(*args)
            torch.cuda.synchronize()
            return result
        return call

    return {"torch eager FP32": runner(module, tensors(torch.float32)), "torch eager FP16": runner(half, tensors(torch.float16)),
            "torch.compile FP16": runner(compiled, tensors(torch.float16))}


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


def _trt_variant(build_dir: Path, feeds: dict[str, np.ndarray]):
    """The tensorrt build's engine, built (or reused) here, run through tapeout's session; and its build time."""
    from tapeout import targets
    from tapeout.core.artifact import Artifact

    manifest = json.loads((build_dir / "manifest.json").read_text())
    target = targets.create("tensorrt", manifest["options_resolved"])
    artifact = Artifact("tensorrt", build_dir / "artifact", manifest["artifact"]["main_file"])
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
    return {name: {"p50": float(np.percentile(t, 50)), "p90": float(np.percentile(t, 90)), "runs": len(t),
                   "mj": float(np.median(energy[name]))} for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-build", action="store_true", help="reuse bench/builds/gpu/* where complete")
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--runs", type=int, default=40, help="runs per block (a block also lasts at least 0.5 s)")
    parser.add_argument("--samples", nargs="+", choices=sorted({s for s, _ in CASES}), help="only these samples' cases")
    args = parser.parse_args()
    torch, nvml, handle = _require_gpu()
    import onnxruntime as ort

    from tapeout.core.parity import cosine

    print(f"GPU {nvml.nvmlDeviceGetName(handle)} · driver {nvml.nvmlSystemGetDriverVersion()} · torch {torch.__version__} "
          f"(CUDA {torch.version.cuda}) · onnxruntime-gpu {ort.__version__} · CPU {platform.processor() or platform.machine()}")
    from tapeout import targets

    no_trt = targets.why_not_here("tensorrt")
    if no_trt:
        print(f"TensorRT rows: not measured, TensorRT is not usable here ({no_trt})")
    print("| case | variant | p50 ms | p90 ms | p50 vs torch eager FP16 | mJ / inference | cosine vs FP32 |")
    print("|---|---|---|---|---|---|---|")
    engines = []
    for sample, batch in [(s, b) for s, b in CASES if not args.samples or s in args.samples]:
        builds = {p: build(sample, p, args.skip_build) for p in ("fp32", "fp16")}
        feeds = _inputs(sample, batch)
        variants = _torch_variants(torch, sample, feeds)
        outputs = {}
        for precision, build_dir in builds.items():
            call, run = _ort_variant(build_dir, feeds)
            variants[f"tapeout cuda-{precision}"] = call
            outputs[f"tapeout cuda-{precision}"] = run()
        if not no_trt and batch == 1:  # the shipped profiles' engines are built for [dims] batch = 1
            for precision in ("fp16", "int8"):
                call, run, engine = _trt_variant(build(sample, precision, args.skip_build, base="tensorrt"), feeds)
                variants[f"tapeout tensorrt-{precision}"] = call
                outputs[f"tapeout tensorrt-{precision}"] = run()
                engines.append(f"{sample} tensorrt-{precision}: engine {engine.action} in {engine.seconds:.1f} s "
                               f"({engine.summary.get('precisions')})")
        for name in [n for n in variants if n.startswith("torch")]:
            outputs[name] = _first_output(variants[name]())
        reference = outputs["torch eager FP32"]
        results = _time(variants, args.blocks, args.runs, nvml, handle)
        base = results["torch eager FP16"]["p50"]
        for name, r in results.items():
            print(f"| {sample} batch {batch} | {name} | {r['p50']:.4f} | {r['p90']:.4f} | {base / r['p50']:.2f}× | "
                  f"{r['mj']:.4g} | {cosine(outputs[name], reference):.6f} |")
    for line in engines:
        print(line)


if __name__ == "__main__":
    main()
