"""PyTorch-native targets against the ONNX ones, on this CPU: ExecuTorch (XNNPACK) and AOTInductor beside ONNX
Runtime and OpenVINO, from the same sample.

    python bench/torch_targets.py [--samples minilm digits-cnn] [--profiles …] [--skip-build] [--blocks 8] [--runs 40]

For each sample, `tapeout build` for cpu-fp32, cpu-int8, openvino-cpu-int8, executorch-xnnpack-fp32,
executorch-xnnpack-int8, aoti-cpu-fp32, aoti-cpu-int8 and aoti-cpu-bf16 (2 threads each, the profile's other settings), then, in this one process, each build's artifact
through its own target's session (the code `tapeout check` runs) against the cpu-fp32 artifact: blocks of
--runs runs alternating A B A B, --blocks blocks, the figure the median of the per-block ratios ORT FP32 time /
its time, with their range, and its median ms per run. Quality: the sample's own metric through the same session
(MiniLM: mean cosine to the FP32 torch embeddings and top-1 neighbour agreement over its held-out sentences;
digits-cnn: top-1). "Why" is each build's own record: the executorch build's delegation (ops left to ExecuTorch's
portable kernels) and its heaviest XNNPACK kernels from ETDump, AOTInductor's vector ISA, the ORT/OpenVINO
builds' heaviest op types from their profiles. An AOTInductor build gets a second row: its instrumented package
(artifact/profiling/, a RecordFunction around each kernel) in A/B blocks against the shipped package, which is what
shipping the instrumentation would cost.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantization import cpu_line, load_sample, neighbours  # the same folder: the shared helpers

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "builds" / "torch-targets"
PROFILES = (
    "cpu-fp32",
    "cpu-int8",
    "openvino-cpu-int8",
    "executorch-xnnpack-fp32",
    "executorch-xnnpack-int8",
    "aoti-cpu-fp32",
    "aoti-cpu-int8",
    "aoti-cpu-bf16",
)


def build(sample: str, profile: str, skip: bool) -> Path:
    out = OUT / f"{sample}-{profile}"
    if skip and (out / "report.json").is_file():
        return out
    spec = OUT / f"{profile}.toml"
    spec.write_text(f'extends = "{profile}"\n[options]\nthreads = 2\n[check]\nrepeats = 2\niterations = 100\n')
    print(f"building {sample} for {profile} …", file=sys.stderr, flush=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tapeout",
            "build",
            str(REPO / "samples" / sample),
            "--profile",
            str(spec),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode not in (0, 1):
        print(f"  failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}", file=sys.stderr)
    return out


def open_session(folder: Path, profiling: bool = False):
    """The build's artifact through its target's own session, read through the verified reader (manifest hashes).
    `profiling`: an AOTInductor build's instrumented package (artifact/profiling/), which only its op profile loads."""
    from tapeout import targets
    from tapeout.builds.reader import open_build
    from tapeout.core.artifact import Artifact
    from tapeout.targets.aoti import AotiSession
    from tapeout.targets.base import PROFILING_DIR

    opened = open_build(folder)
    target = targets.create(opened.profile.target, opened.profile.options)
    artifact = Artifact(opened.profile.target, opened.artifact(), opened.manifest.artifact.main_file)
    if profiling:
        return AotiSession(
            artifact, target.options.threads, package=artifact.directory / PROFILING_DIR / artifact.main_file
        )
    return target.session(artifact)


def blocks_against(base, other, feeds: dict, blocks: int, runs: int) -> tuple[float, float, float, float]:
    """Median (min, max) of per-block base/other time ratios, and other's median ms per run. A block lasts at least
    ~50 ms of the base's time: shorter blocks time the scheduler."""
    calls = [s.bind(feeds) for s in (base, other)]
    for call in calls:
        for _ in range(10):
            call()
    start = time.perf_counter()
    for _ in range(10):
        calls[0]()
    runs = max(runs, int(0.05 / max((time.perf_counter() - start) / 10, 1e-7)))
    ratios, per_run = [], []
    for _ in range(blocks):
        times = []
        for call in calls:
            start = time.perf_counter()
            for _ in range(runs):
                call()
            times.append(time.perf_counter() - start)
        ratios.append(times[0] / times[1])
        per_run.append(times[1] / runs * 1e3)
    return float(np.median(ratios)), min(ratios), max(ratios), float(np.median(per_run))


def quality(sample: str, metric, predict) -> str:
    if sample == "minilm":
        text = sys.modules["text"]
        reference = np.load(REPO / "samples/minilm/data/reference.npy").astype(np.float64)[text.CALIBRATION :]
        emb = metric.embed(predict, text.held_out())
        cos = (emb * reference).sum(1) / (np.linalg.norm(emb, axis=1) * np.linalg.norm(reference, axis=1))
        return f"cosine {cos.mean():.4f}, neighbours {(neighbours(emb) == neighbours(reference)).mean():.3f}"
    return f"top-1 {metric.top1(predict):.4f}"


def why(report: dict) -> str:
    meta = report["artifact"]["meta"] or {}
    placement = report.get("placement") or {}
    ops = ((report.get("measurement") or {}).get("op_profile") or {}).get("op_types") or []
    top = sorted(ops, key=lambda o: -o.get("share", 0))[:3]
    heaviest = "heaviest: " + ", ".join(f"{o['op_type']} {o.get('share', 0):.0%}" for o in top) if top else ""
    if meta.get("delegate") == "XNNPACK":
        off = ", ".join(
            f"{o['op_type'].removeprefix('aten_').removesuffix('_default')} ×{o['node'].split()[0]}"
            for o in placement.get("off", [])[:6]
        )
        return "; ".join(
            x
            for x in (
                f"{placement.get('on_accelerator')}/{placement.get('total_nodes')} ops in XNNPACK",
                f"portable kernels: {off}" if off else "",
                heaviest,
            )
            if x
        )
    if "vec_isa" in meta:
        integer = ", ".join(f"{kind} ×{n}" for kind, n in (meta.get("integer_kernels") or {}).items() if n)
        return "; ".join(
            x
            for x in (
                f"Inductor C++ kernels for {meta['vec_isa'] or 'scalar'}",
                f"oneDNN {integer}" if integer else "",
                heaviest,
            )
            if x
        )
    return heaviest


def run(sample: str, profiles: list[str], skip: bool, blocks: int, runs: int) -> list[list[str]]:
    import json

    folders = {p: build(sample, p, skip) for p in dict.fromkeys(["cpu-fp32", *profiles])}
    metric = load_sample(sample)
    with np.load(folders["cpu-fp32"] / "golden.npz") as data:
        feeds = {k[len("input.") :]: data[k][0] for k in data.files if k.startswith("input.")}
    base = open_session(folders["cpu-fp32"])
    rows = []
    for profile, folder in folders.items():
        if not (folder / "report.json").is_file():
            rows.append([sample, profile, "build failed", "", "", "", ""])
            continue
        report = json.loads((folder / "report.json").read_text())
        session = open_session(folder)
        ratio, low, high, ms = blocks_against(base, session, feeds, blocks, runs)
        size = report["artifact"]["bytes"] / 2**20
        rows.append(
            [
                sample,
                profile,
                f"{ms:.3f}",
                f"{ratio:.2f}× [{low:.2f}, {high:.2f}]",
                f"{size:.1f}",
                quality(sample, metric, session.run),
                why(report),
            ]
        )
        if (folder / "artifact" / "profiling").is_dir():  # what instrumenting every kernel call would cost if shipped
            ratio, low, high, ms = blocks_against(session, open_session(folder, profiling=True), feeds, blocks, runs)
            rows.append(
                [
                    sample,
                    f"{profile}, its profiling/ package",
                    f"{ms:.3f}",
                    f"{ratio:.2f}× [{low:.2f}, {high:.2f}] of the shipped",
                    "—",
                    "",
                    "a RecordFunction around each kernel: loaded for the op profile only",
                ]
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", nargs="+", default=["minilm", "digits-cnn"])
    parser.add_argument(
        "--profiles",
        nargs="+",
        default=PROFILES,
        choices=PROFILES,
        help="which builds (cpu-fp32, the base, is always built)",
    )
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows = [
        row for sample in args.samples for row in run(sample, args.profiles, args.skip_build, args.blocks, args.runs)
    ]
    print(cpu_line())
    print(f"2 threads per runtime; {args.blocks} blocks, A/B against the cpu-fp32 artifact in this process\n")
    header = ["sample", "build", "ms/run", "speed vs ORT FP32", "artifact MB", "quality", "why (the build's record)"]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for line in (header, ["-" * w for w in widths], *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)))


if __name__ == "__main__":
    main()
