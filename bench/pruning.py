"""Pruning benchmark: per sample, FP32, pruned, quantized, and pruned + quantized, side by side.

    python bench/pruning.py [--samples digits-cnn minilm tiny-lm] [--ratio R] [--skip-build] [--blocks 8] [--runs 40]
    python bench/pruning.py --frontier [--samples minilm] [--skip-build]

Every variant is a `tapeout build` on ONNX Runtime's CPU EP (2 intra-op threads at timing):
  FP32               cpu-fp32
  pruned             cpu-fp32 with the sample's [pruning] below (built-in distillation)
  quantized          cpu-int8 (cpu-int4 for tiny-lm)
  pruned + quantized the same [pruning], then cpu-int8's precision step
Speed: each artifact against the FP32 export in this one process, A B A B blocks (bench/quantization.py's
method): the median of the per-block FP32/model time ratios with their range. Quality: the sample's
metric on the artifact. Size: the artifact's bytes. Build time: the wall time of `tapeout build`,
recovery included.

--frontier answers "how much must go for pruning to pay on top of quantization": per sample, the quantized
build pruned by each structure of FRONTIER, with no recovery (distill_steps = 0: speed does not depend on
the weights' values) and no sensitivity loop, timed against the FP32 export and against the quantized
build alone, in rounds so that every variant meets the same machine. Quality is not scored there: it is
the table above's job, with recovery.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _project(sample: str) -> Path:
    """The sample's project as one forward call: tiny-lm's own tapeout.toml is a generate workload (bench/generate.py
    measures that); forward.toml is the same model as one call over 128 bytes, what this benchmark compares."""
    folder = REPO / "samples" / sample
    return folder / "forward.toml" if (folder / "forward.toml").is_file() else folder


OUT = REPO / "bench" / "builds" / "pruning"
sys.path.insert(0, str(Path(__file__).parent))
import quantization as qbench  # noqa: E402  (the timing, quality and size helpers)

PRUNING = {
    "digits-cnn": 'what = ["channels"]\nratio = 0.5\ndistill_steps = 300\ndistill_max_s = 900',
    "minilm": 'what = ["mlp"]\nratio = 0.25\ndata = "text.py:recovery"\ndistill_steps = 1400\ndistill_lr = 1e-4\ndistill_max_s = 480',
    "tiny-lm": 'what = ["mlp"]\nratio = 0.25\ndistill_steps = 300\ndistill_max_s = 900',
}
# --frontier: structures to time, cheapest first (names as the table prints them)
FRONTIER = {
    "FFN −25 %": 'what = ["mlp"]\nratio = 0.25',
    "FFN −50 %": 'what = ["mlp"]\nratio = 0.5',
    "FFN −75 %": 'what = ["mlp"]\nratio = 0.75',
    "heads −50 %, FFN −50 %": 'what = ["heads", "mlp"]\nratio = 0.5',
    "depth −1/3 (blocks)": 'what = ["depth"]\nratio = 0.34',
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
    path.write_text(
        f'extends = "{base}"\n'
        + (f"[pruning]\n{pruning(sample, ratio)}\n" if pruned else "")
        + f"[budgets]\n{budget}\n[check]\niterations = 100\nrepeats = 1\n"
    )
    return path


def tapeout_build(sample: str, profile_path: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tapeout",
            "build",
            str(_project(sample)),
            "--profile",
            str(profile_path),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )


def build(sample: str, base: str, pruned: bool, skip: bool, ratio: float | None) -> tuple[Path, float | None]:
    out = OUT / f"{sample}-{base}{tag(pruned, ratio)}"
    if skip and (out / "report.json").is_file():
        return out, None
    started = time.perf_counter()
    result = tapeout_build(sample, profile(sample, base, pruned, ratio), out)
    if result.returncode not in (0, 1):
        sys.exit(
            f"bench/pruning.py: build {out.name} exited {result.returncode}: {result.stderr.strip().splitlines()[-1:]}"
        )
    return out, time.perf_counter() - started


def run(sample: str, skip: bool, blocks: int, runs: int, ratio: float | None) -> None:
    import json

    metric = qbench.load_sample(sample)
    variants = {
        "FP32": ("cpu-fp32", False),
        "pruned": ("cpu-fp32", True),
        "quantized": (LOW[sample], False),
        "pruned + quantized": (LOW[sample], True),
    }
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
        print(
            f"| {name} | {ratio:.2f}× ({lo:.2f}–{hi:.2f}) | {ms:.3f} | {quality} | {flops} | "
            f"{qbench.size_mb(artifact):.2f} | {seconds:.0f} | {report['exit_code']} |"
            if seconds is not None
            else f"| {name} | {ratio:.2f}× ({lo:.2f}–{hi:.2f}) | {ms:.3f} | {quality} | {flops} | "
            f"{qbench.size_mb(artifact):.2f} | (reused) | {report['exit_code']} |"
        )


def frontier(sample: str, skip: bool, blocks: int, runs: int, rounds: int = 3) -> None:
    """Speed only: the quantized build pruned by each FRONTIER structure, no recovery."""
    import json

    if sample == "digits-cnn":  # FRONTIER's structures are a transformer's
        print(f"\n**{sample}**: no frontier (its structures are a transformer's: heads, FFN width, blocks)")
        return

    import numpy as np

    qbench.load_sample(sample)  # the sample's text helpers, which calibration() reads
    low = LOW[sample]
    quantized, _ = build(sample, low, False, skip, None)
    fp32_dir, _ = build(sample, "cpu-fp32", False, skip, None)
    variants = {"quantized alone": quantized}
    refused: dict[str, str] = {}  # structure -> the build's one-line error (the model cannot be pruned so)
    for name, body in FRONTIER.items():
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        out = OUT / f"{sample}-{low}-frontier-{slug}"
        path = OUT / f"{out.name}.toml"
        path.write_text(
            f'extends = "{low}"\n[quantization]\nsensitivity = false\n[pruning]\n{body}\n'
            "distill_steps = 0\n[check]\niterations = 30\nrepeats = 1\n"
        )
        if not (skip and (out / "report.json").is_file()):
            result = tapeout_build(sample, path, out)
            if result.returncode not in (0, 1):  # 1: the accuracy budget fails without recovery, as expected
                refused[name] = (result.stderr.strip().splitlines() or ["no output"])[-1]
                continue
        variants[name] = out
    fp32 = qbench.session(fp32_dir / "export" / "model.onnx")
    feeds = qbench.calibration(sample)[0]
    sessions, flops = {}, {}
    for name, out in variants.items():
        report = json.loads((out / "report.json").read_text())
        sessions[name] = qbench.session(out / "artifact" / report["artifact"]["main_file"])
        flops[name] = f"−{report['pruning']['flops_reduction']:.0%}" if report.get("pruning") else "—"
    timed: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in sessions}
    for _ in range(rounds):  # every variant in every round: a slow spell of the machine hits them all
        for name, sess in sessions.items():
            timed[name].append(qbench.speed(fp32, sess, feeds, blocks, runs))
    base = float(np.median([t[0] for t in timed["quantized alone"]]))
    print(f"\n**{sample}**: speed frontier of pruning on top of {low} (no recovery; quality not scored)\n")
    print(f"| pruned by | FLOPs | speed vs ORT FP32 | speed vs {low} alone | ms / run |")
    print("|---|---|---|---|---|")
    for name, rows in timed.items():
        speed = float(np.median([r[0] for r in rows]))
        print(
            f"| {name} | {flops[name]} | {speed:.2f}× ({min(r[1] for r in rows):.2f}–{max(r[2] for r in rows):.2f})"
            f" | {speed / base:.2f}× | {float(np.median([r[3] for r in rows])):.2f} |"
        )
    for name, why in refused.items():
        print(f"| {name} | — | not built: {why} | — | — |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", nargs="+", default=["digits-cnn", "minilm", "tiny-lm"], choices=list(PRUNING))
    parser.add_argument(
        "--ratio", type=float, help="prune by this share instead of each sample's own (builds named -pruned-R)"
    )
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument(
        "--frontier",
        action="store_true",
        help="time the quantized build pruned by several "
        "structures, without recovery, against FP32 and the quantized build alone",
    )
    args = parser.parse_args()
    print(qbench.cpu_line())
    for sample in args.samples:
        if args.frontier:
            frontier(sample, args.skip_build, args.blocks, args.runs)
        else:
            run(sample, args.skip_build, args.blocks, args.runs, args.ratio)


if __name__ == "__main__":
    main()
