"""Spine figures for both samples, side by side with a plain ONNX Runtime timing loop.

    python bench/spine.py [--skip-build]

For each sample: `tapeout build --profile cpu-fp32`, then three alternating rounds of a naive
baseline on the same exported FP32 model (one InferenceSession with ORT's defaults, 20 warm-up
runs, 300 timed runs, in this process) and `tapeout check` on the build (fresh processes,
order-statistic bounds). Alternating spreads machine drift over both sides: on a shared VM the
drift can exceed the within-run bounds. The two should agree; a gap beyond the rounds' range
means the harness or the artifact costs something.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SAMPLES = ("digits-cnn", "minilm")
ROUNDS = 3


def _spread(values: list[float]) -> str:
    return f"{float(np.median(values)):.3f} ({min(values):.3f}–{max(values):.3f})"


def naive_ort(model: Path, golden: Path) -> dict:
    import onnxruntime as ort

    with np.load(golden) as data:
        feeds = {k[len("input."):]: data[k][0] for k in data.files if k.startswith("input.")}
    start = time.perf_counter()
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    sess.run(None, feeds)
    cold = (time.perf_counter() - start) * 1e3
    for _ in range(20):
        sess.run(None, feeds)
    times = []
    for _ in range(300):
        t0 = time.perf_counter_ns()
        sess.run(None, feeds)
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return {"p50": float(np.median(times)), "p90": float(np.quantile(times, 0.9)), "cold": cold}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-build", action="store_true", help="reuse samples/*/build/cpu-fp32")
    args = parser.parse_args()
    rows = []
    for sample in SAMPLES:
        build = REPO / "samples" / sample / "build" / "cpu-fp32"
        if not args.skip_build:
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "tapeout", "build", str(REPO / "samples" / sample),
                            "--profile", "cpu-fp32", "--json"], check=True, capture_output=True)
            print(f"built {sample} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        plain, checked = [], []
        for _ in range(ROUNDS):  # alternate, so that drift of the machine hits both sides alike
            plain.append(naive_ort(build / "export" / "model.onnx", build / "golden.npz"))
            check = subprocess.run([sys.executable, "-m", "tapeout", "check", str(build), "--json"],
                                   check=True, capture_output=True, text=True)
            checked.append(json.loads(check.stdout))
        report = checked[-1]
        m = report["measurement"]
        q = m["latency_ms"]["quantiles"]
        tp50 = [c["measurement"]["latency_ms"]["quantiles"]["p50"]["point"] for c in checked]
        tp90 = [c["measurement"]["latency_ms"]["quantiles"]["p90"]["point"] for c in checked]
        rows.append([
            sample,
            f"{q['p50']['point']:.3f} [{q['p50']['lower']:.3f}, {q['p50']['upper']:.3f}]",
            f"{q['p90']['point']:.3f} [{q['p90']['lower']:.3f}, {q['p90']['upper']:.3f}]",
            _spread(tp50), _spread([p["p50"] for p in plain]),
            _spread(tp90), _spread([p["p90"] for p in plain]),
            f"{m['cold_start_ms']['median']:.1f} (max {m['cold_start_ms']['max']:.1f})",
            f"{m['memory_mb']['peak_rss']:.0f}", f"{report['artifact']['bytes'] / 2**20:.2f}",
        ])
    header = ["sample", "last check p50 ms [95% bounds]", "last check p90 ms [95% bounds]",
              f"check p50, median (range) of {ROUNDS}", f"plain ORT p50, median (range) of {ROUNDS}",
              "check p90", "plain ORT p90", "cold start ms (fresh process)", "peak RSS MB", "artifact MB"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    host = report["host"]
    print(f"\nmachine: {host['cpu']}, {host['physical_cores']} physical cores, flags {' '.join(host['cpu_flags'])}; "
          f"onnxruntime {report['target']['version']}; tapeout: {m['latency_ms']['count']} runs in "
          f"{m['latency_ms']['repeats']} fresh processes per check; plain ORT: 300 runs in one process, ORT defaults; "
          f"{ROUNDS} alternating rounds")


if __name__ == "__main__":
    main()
