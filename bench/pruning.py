"""Pruning benchmark: per sample, FP32, pruned, quantized, and pruned + quantized, side by side.

    python bench/pruning.py [--samples digits-cnn minilm tiny-lm] [--ratio R] [--skip-build] [--blocks 8] [--runs 40]

Every variant is a `tapeout build` on ONNX Runtime's CPU EP (2 intra-op threads at timing):
  FP32               cpu-fp32
  pruned             cpu-fp32 with the sample's [pruning] below (built-in distillation)
  quantized          cpu-int8 (cpu-int4 for tiny-lm)
  pruned + quantized the same [pruning], then cpu-int8's precision step
Speed: each artifact against the FP32 export in this one process, A B A B blocks (bench/quantization.py's
method): the median of the per-block FP32/model time ratios with their range. Quality: the sample's
metric on the artifact. Size: the artifact's bytes. Build time: the wall time of `tapeout build`,
recovery included.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "builds" / "pruning"
sys.path.insert(0, str(Path(__file__).parent))
import quantization as qbench  # noqa: E402  (the timing, quality and size helpers)

PRUNING = {
    "digits-cnn": 'what = ["channels"]\nratio = 0.5\ndistill_steps = 300\ndistill_max_s = 900',
    "minilm": 'what = ["mlp"]\nratio = 0.25\ndata = "text.py:recovery"\ndistill_steps = 1400\ndistill_lr = 1e-4\ndistill_max_s = 480',
    "tiny-lm": 'what = ["mlp"]\nratio = 0.25\ndistill_steps = 300\ndistill_max_s = 900',
}
LOW = {"digits-cnn": "cpu-int8", "minilm": "cpu-int8", "tiny-lm": "cpu-int4"}


def pruning(sample: str, ratio: float | None) -> str:
    """The sample's [pruning] body, its ratio replaced where --ratio gives one."""
    return PRUNING[sample] if ratio is None else re.sub(r"ratio = [0-9.]+", f"ratio = {ratio}", PRUNING[sample])


def tag(pruned: bool, ratio: float | None) -> str:
    return ("-pruned" + (f"-{ratio}" if ratio is not None else "")) if pruned else ""


def profile(sample: str, base: str, pruned: bool, ratio: float | None) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{sample}-{base}{tag(pruned, ratio)}.toml"
    budget = "accuracy_max_rel_drop = 0.05" if sample == "tiny-lm" else "accuracy_max_drop = 0.01"
    path.write_text(f'extends = "{base}"\n' + (f"[pruning]\n{pruning(sample, ratio)}\n" if pruned else "")
                    + f"[budgets]\n{budget}\n[check]\niterations = 100\nrepeats = 1\n")
    return path


def build(sample: str, base: str, pruned: bool, skip: bool, ratio: float | None) -> tuple[Path, float | None]:
    out = OUT / f"{sample}-{base}{tag(pruned, ratio)}"
    if skip and (out / "report.json").is_file():
        return out, None
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "tapeout", "build", str(REPO / "samples" / sample), "--profile",
                             str(profile(sample, base, pruned, ratio)), "--out", str(out)], capture_output=True, text=True)
    if result.returncode not in (0, 1):
        sys.exit(f"bench/pruning.py: build {out.name} exited {result.returncode}: {result.stderr.strip().splitlines()[-1:]}")
    return out, time.perf_counter() - started


def run(sample: str, skip: bool, blocks: int, runs: int, ratio: float | None) -> None:
    import json

    metric = qbench.load_sample(sample)
    variants = {"FP32": ("cpu-fp32", False), "pruned": ("cpu-fp32", True), "quantized": (LOW[sample], False),
                "pruned + quantized": (LOW[sample], True)}
    builds = {name: build(sample, base, pruned, skip, ratio) for name, (base, pruned) in variants.items()}
    fp32 = qbench.session(builds["FP32"][0] / "export" / "model.onnx")
    feeds = qbench.calibration(sample)[0]
    print(f"\n**{sample}**" + (f" (pruning ratio {ratio})" if ratio is not None else "") + "\n")
    print("| variant | speed vs ORT FP32 | ms / run | quality | FLOPs | size MB | build s | exit |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (out, seconds) in builds.items():
        report = json.loads((out / "report.json").read_text())
        artifact = out / "artifact" / report["artifact"]["main_file"]
        sess = qbench.session(artifact)
        ratio, lo, hi, ms = qbench.speed(fp32, sess, feeds, blocks, runs)
        quality = ", ".join(f"{k} {v}" for k, v in qbench.quality(sample, metric, qbench.predictor(sess)).items())
        pruning = report.get("pruning")
        flops = f"−{pruning['flops_reduction']:.0%}" if pruning else "—"
        print(f"| {name} | {ratio:.2f}× ({lo:.2f}–{hi:.2f}) | {ms:.3f} | {quality} | {flops} | "
              f"{qbench.size_mb(artifact):.2f} | {seconds:.0f} | {report['exit_code']} |" if seconds is not None else
              f"| {name} | {ratio:.2f}× ({lo:.2f}–{hi:.2f}) | {ms:.3f} | {quality} | {flops} | "
              f"{qbench.size_mb(artifact):.2f} | (reused) | {report['exit_code']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", nargs="+", default=["digits-cnn", "minilm", "tiny-lm"], choices=list(PRUNING))
    parser.add_argument("--ratio", type=float, help="prune by this share instead of each sample's own (builds "
                        "named -pruned-R)")
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    print(qbench.cpu_line())
    for sample in args.samples:
        run(sample, args.skip_build, args.blocks, args.runs, args.ratio)


if __name__ == "__main__":
    main()
