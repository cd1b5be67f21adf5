"""Spine figures for both samples, side by side with a plain ONNX Runtime timing loop; and the wall time of
the spine's two commands.

    python bench/spine.py [--skip-build]
    python bench/spine.py --wall [--rounds 5] [--against OTHER_PYTHON]

For each sample: `tapeout build --profile cpu-fp32`, then three alternating rounds of a naive
baseline on the same exported FP32 model (one InferenceSession with ORT's defaults, 20 warm-up
runs, 300 timed runs, in this process) and `tapeout check` on the build (fresh processes,
order-statistic bounds). Alternating spreads machine drift over both sides: on a shared VM the
drift can exceed the within-run bounds. The two should agree; a gap beyond the rounds' range
means the harness or the artifact costs something.

--wall times `tapeout build samples/digits-cnn --profile cpu-fp32` and `tapeout check` on its build dir, as a
user runs them (fresh `python -m tapeout` processes, the profile's own timing settings), `--rounds` times.
With `--against OTHER_PYTHON` (the interpreter of another tapeout installation, an earlier version say) the
two are alternated round by round in this one run, so drift of the machine hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
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
        feeds = {k[len("input.") :]: data[k][0] for k in data.files if k.startswith("input.")}
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


def _seconds(command: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode not in (0, 1):  # a budget verdict is a result; anything else is the bench failing
        sys.exit(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - started


def wall(rounds: int, against: str | None) -> None:
    import tempfile

    pythons = {"this tapeout": sys.executable, **({f"{against}": against} if against else {})}
    times: dict[str, dict[str, list[float]]] = {name: {"build": [], "check": []} for name in pythons}
    with tempfile.TemporaryDirectory(prefix="tapeout-spine-") as tmp:
        for r in range(rounds):
            for i, (name, python) in enumerate(pythons.items()):
                out = Path(tmp) / f"{i}-{r}"
                times[name]["build"].append(
                    _seconds(
                        [
                            python,
                            "-m",
                            "tapeout",
                            "build",
                            str(REPO / "samples" / "digits-cnn"),
                            "--profile",
                            "cpu-fp32",
                            "--out",
                            str(out),
                            "--json",
                        ]
                    )
                )
                times[name]["check"].append(_seconds([python, "-m", "tapeout", "check", str(out), "--json"]))
                print(
                    f"round {r + 1}/{rounds} {name}: build {times[name]['build'][-1]:.2f} s, check "
                    f"{times[name]['check'][-1]:.2f} s",
                    file=sys.stderr,
                )
    print("| tapeout | build s, median (range) | check s, median (range) |")
    print("|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {_spread(t['build'])} | {_spread(t['check'])} |")
    from tapeout.core.host import host_fingerprint

    host = host_fingerprint()
    print(
        f"\nmachine: {host['cpu']}, {host['physical_cores']} physical cores, flags {' '.join(host['cpu_flags'])}; "
        f"`tapeout build samples/digits-cnn --profile cpu-fp32` and `tapeout check` on it, fresh processes, "
        f"{rounds} rounds alternated; Python's bytecode cache "
        f"{'off (PYTHONDONTWRITEBYTECODE)' if os.environ.get('PYTHONDONTWRITEBYTECODE') else 'on'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-build", action="store_true", help="reuse samples/*/build/cpu-fp32")
    parser.add_argument("--wall", action="store_true", help="time the build and check commands instead")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", help="another tapeout installation's python, alternated with this one")
    args = parser.parse_args()
    if args.wall:
        wall(args.rounds, args.against)
        return
    rows = []
    for sample in SAMPLES:
        build = REPO / "samples" / sample / "build" / "cpu-fp32"
        if not args.skip_build:
            started = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tapeout",
                    "build",
                    str(REPO / "samples" / sample),
                    "--profile",
                    "cpu-fp32",
                    "--json",
                ],
                check=True,
                capture_output=True,
            )
            print(f"built {sample} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        plain, checked = [], []
        for _ in range(ROUNDS):  # alternate, so that drift of the machine hits both sides alike
            plain.append(naive_ort(build / "export" / "model.onnx", build / "golden.npz"))
            check = subprocess.run(
                [sys.executable, "-m", "tapeout", "check", str(build), "--json"],
                check=True,
                capture_output=True,
                text=True,
            )
            checked.append(json.loads(check.stdout))
        report = checked[-1]
        m = report["measurement"]
        q = m["latency_ms"]["quantiles"]
        tp50 = [c["measurement"]["latency_ms"]["quantiles"]["p50"]["point"] for c in checked]
        tp90 = [c["measurement"]["latency_ms"]["quantiles"]["p90"]["point"] for c in checked]
        rows.append(
            [
                sample,
                f"{q['p50']['point']:.3f} [{q['p50']['lower']:.3f}, {q['p50']['upper']:.3f}]",
                f"{q['p90']['point']:.3f} [{q['p90']['lower']:.3f}, {q['p90']['upper']:.3f}]",
                _spread(tp50),
                _spread([p["p50"] for p in plain]),
                _spread(tp90),
                _spread([p["p90"] for p in plain]),
                f"{m['cold_start_ms']['median']:.1f} (max {m['cold_start_ms']['max']:.1f})",
                f"{m['memory_mb']['peak_rss']:.0f}",
                f"{report['artifact']['bytes'] / 2**20:.2f}",
            ]
        )
    header = [
        "sample",
        "last check p50 ms [95% bounds]",
        "last check p90 ms [95% bounds]",
        f"check p50, median (range) of {ROUNDS}",
        f"plain ORT p50, median (range) of {ROUNDS}",
        "check p90",
        "plain ORT p90",
        "cold start ms (fresh process)",
        "peak RSS MB",
        "artifact MB",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    host = report["host"]
    print(
        f"\nmachine: {host['cpu']}, {host['physical_cores']} physical cores, flags {' '.join(host['cpu_flags'])}; "
        f"onnxruntime {report['target']['version']}; tapeout: {m['latency_ms']['count']} runs in "
        f"{m['latency_ms']['repeats']} fresh processes per check; plain ORT: 300 runs in one process, ORT defaults; "
        f"{ROUNDS} alternating rounds"
    )


if __name__ == "__main__":
    main()
