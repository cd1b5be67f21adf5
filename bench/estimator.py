"""The estimator scored for what it is for: bounds that hold, and estimates for a CPU class not at hand.

    python bench/estimator.py [--out DIR] [--skip-build] [--models a,b,...] [--profiles p,q,...] [--threads N]
                              [--save-class]

Builds every (model, profile) pair that runs here, each with its per-op profile: the three samples, the toy model
zoo of tests/zoo_models.py and the same kinds at working sizes (bench/estimator_models.py), at FP32 and INT8 on
ONNX Runtime's CPU EP and on OpenVINO's CPU device, and the samples' loops as deployed (tiny-lm's generate,
speech-vad's stream) at cpu-fp32. Then three tables:

1. bounds: every build's measured p50 (a loop's TTFT and TPOT) beside its uncalibrated roofline lower bound. The
   bound must hold: no measured figure under it.
2. held out within this host's class: per (device, target), each model predicted by the calibration fitted on the
   other models' builds; the error against the measured p50.
3. across classes: each CPU class calibration shipped in profiles/devices/calibration (cpu-<vendor>-<tier>, made by
   `--save-class` on a host of that class) prices this host's builds at this host's roof; for this host's own class,
   the held-out fit of table 2 stands in (never a fit that saw the model). Scored as a silicon choice rests on it:
   per model, whether the fastest profile is predicted, and per pair of profiles the predicted speed ratio against
   the measured one (within ±15 %).

`--save-class` writes this host's calibrations (all models) as its class's files into profiles/devices/calibration.
`lscpu` flags are printed with the figures: they decide the class and the INT8 kernels.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# zoo_models and test_model_zoo from tests/; bench/ (this script's own folder, first on the path) out: its kernels.py
# shadows the `kernels` package transformers imports
sys.path[:] = [str(REPO / "tests")] + [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
_spec = importlib.util.spec_from_file_location("estimator_models", REPO / "bench" / "estimator_models.py")
MEDIUM = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(MEDIUM)
MEDIUM = MEDIUM.CASES

SAMPLES = ("digits-cnn", "minilm", "tiny-lm")
ZOO = ("resnet", "vit", "distilbert", "gpt2", "whisper", "unet", "lstm", "cnn-lstm")
PROFILES = ("cpu-fp32", "cpu-int8", "openvino-cpu", "openvino-cpu-int8")
LOOPS = {"tiny-lm": "generate", "speech-vad": "stream"}  # built at cpu-fp32, as deployed
# every build keeps its per-op profile; the INT8 builds skip the sensitivity loop (the rules' plan is enough to time)
OVERRIDE = 'extends = "{base}"\n[quantization]\nsensitivity = false\n[check]\nop_profile = true\n'
SHIPPED = REPO / "profiles" / "devices" / "calibration"


def _profile_file(folder: Path, base: str, threads: int | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"bench-{base}.toml"
    text = OVERRIDE.format(base=base)
    if base in ("cpu-fp32", "openvino-cpu"):
        text = text.replace("[quantization]\nsensitivity = false\n", "")
    if threads is not None:
        text += f"[options]\nthreads = {threads}\n"
    path.write_text(text)
    return path


def _project(root: Path, name: str) -> Path:
    """The sample's folder, or a project written for a zoo model (`zoo_models.write_project`)."""
    if name in SAMPLES:
        folder = REPO / "samples" / name
        return folder / "forward.toml" if (folder / "forward.toml").is_file() else folder  # one call, as estimated
    import zoo_models

    project = root / "projects" / name
    if (project / "tapeout.toml").is_file():
        return project
    project.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(zoo_models.__file__), project / "zoo_models.py")
    if name in MEDIUM:
        builder, inputs, outputs = MEDIUM[name]
        shutil.copy(REPO / "bench" / "estimator_models.py", project / "estimator_models.py")
        source = f"estimator_models.py:{builder}"
    else:
        from test_model_zoo import CASES

        source, inputs, outputs = CASES[name][:3]
        if source == "hf":
            zoo_models.save_hf(name, project / "hf")
    zoo_models.write_project(project, source, inputs, outputs)
    return project


def _build(project: Path, profile: Path, build_dir: Path, label: str, skip: bool) -> bool:
    if skip and (build_dir / "report.json").is_file():
        return True
    start = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "tapeout", "build", str(project), "-p", str(profile), "-o", str(build_dir)],
        capture_output=True,
        text=True,
    )
    last = (run.stdout.strip().splitlines() or [""])[-1]
    print(f"  built {label}: exit {run.returncode} in {time.perf_counter() - start:.0f} s  {last}", flush=True)
    if run.returncode not in (0, 1, 3):
        print(run.stderr[-2000:], flush=True)
    return (build_dir / "report.json").is_file()


def build_all(out: Path, models: list[str], profiles: list[str], skip: bool, threads: int | None) -> list[Path]:
    dirs = []
    for model, profile in itertools.product(models, profiles):
        build_dir = out / "builds" / model / profile
        if _build(_project(out, model), _profile_file(out, profile, threads), build_dir, f"{model} × {profile}", skip):
            dirs.append(build_dir)
    return dirs


def bounds_table(dirs: list[Path], loops: list[Path]) -> None:
    rows = []
    for d in dirs:
        report = json.loads((d / "report.json").read_text())
        est, q = report.get("estimate"), report["measurement"]["latency_ms"]["quantiles"]["p50"]["point"]
        if est:
            rows.append((d.parent.name, d.name, "p50", q, est["lower_bound_ms"]))
    for d in loops:
        report = json.loads((d / "report.json").read_text())
        gen = (report.get("estimate") or {}).get("generation")
        for m in (gen or {}).get("measured") or []:
            if m["measured_ms"]:
                rows.append((d.parent.name, d.name, m["what"], m["measured_ms"], m["estimated_ms"]))
        chunk = ((report.get("workload") or {}).get("chunk_ms") or {}).get("quantiles", {}).get("p50")
        if chunk and report.get("estimate"):
            rows.append((d.parent.name, d.name, "chunk p50", chunk["point"], report["estimate"]["lower_bound_ms"]))
    print("\n1. bounds: the measured figure beside its uncalibrated roofline lower bound (must be ≥ 1x)")
    print(f"{'model':<14} {'profile':<18} {'figure':<11} {'measured ms':>12} {'bound ms':>11} {'measured/bound':>15}")
    for model, profile, what, measured, bound in sorted(rows):
        flag = "  ✗ UNDER THE BOUND" if measured < bound else ""
        print(f"{model:<14} {profile:<18} {what:<11} {measured:>12.4g} {bound:>11.4g} {measured / bound:>15.2f}{flag}")
    ratios = [m / b for *_, m, b in rows if b]
    under = sum(r < 1 for r in ratios)
    print(
        f"{under}/{len(rows)} under their bound; measured/bound min {min(ratios):.2f}, median "
        f"{statistics.median(ratios):.1f}, max {max(ratios):.0f}"
    )


def held_out_table(cals) -> dict[str, float]:
    """Each calibration's held-out predictions; returns the predicted ms by build dir."""
    print("\n2. held out within this host's class: each model predicted by the fit on the others")
    print(f"{'model':<14} {'precision':<9} {'target':<11} {'measured p50 ms':>16} {'held-out ms':>12} {'error':>8}")
    by_dir, errors = {}, []
    for cal in cals:
        for h in sorted(cal.held_out, key=lambda h: (h["model"], h["precision"])):
            by_dir[str(h["source"])] = h["predicted_ms"]
            errors.append(h["error"])
            flag = "" if abs(h["error"]) <= 0.15 else "  ✗"
            print(
                f"{h['model']:<14} {h['precision']:<9} {cal.target:<11} {h['measured_ms']:>16.4g} "
                f"{h['predicted_ms']:>12.4g} {h['error']:>+8.1%}{flag}"
            )
        hit, n = cal.within()
        print(f"  {cal.device} × {cal.target}: {hit}/{n} within ±15 %")
    if errors:
        print(f"median |error| {statistics.median(map(abs, errors)):.0%}")
    return by_dir


def cross_class_table(dirs: list[Path], here: str, held_out: dict[str, float]) -> None:
    """Per calibration class: the ranking of each model's profiles and the ratios between them, predicted against
    measured on this host's builds."""
    from tapeout.builds.reader import open_build
    from tapeout.estimation import estimate, fit

    measured = {
        str(d): json.loads((d / "report.json").read_text())["measurement"]["latency_ms"]["quantiles"]["p50"]["point"]
        for d in dirs
    }
    classes = sorted({p.name.split("--")[0] for p in SHIPPED.glob("cpu-*--*.json")} | {here})
    print(
        f"\n3. across classes: calibrated on class A (rows), estimated on this host ({here}); per model, the fastest "
        "profile predicted, and each pair of profiles' speed ratio within ±15 %"
    )
    print(
        f"{'calibrated on':<18} {'estimated on':<16} {'fastest right':>14} {'ratios ±15 %':>13} {'median ratio error':>19}"
    )
    for cls in classes:
        predicted: dict[str, float] = {}
        if cls == here:
            predicted = {d: held_out[d] for d in measured if d in held_out}
        else:
            for d in dirs:
                build = open_build(d)
                path = SHIPPED / fit.file_name(cls, build.report.target.name)
                if path.is_file():
                    est = estimate.for_build(build, cal=(fit.load(path), path))
                    if est.quantile_ms("p50"):
                        predicted[str(d)] = est.quantile_ms("p50")[0]
        by_model: dict[str, list[str]] = {}
        for d in predicted:
            by_model.setdefault(Path(d).parent.name, []).append(d)
        right = models = 0
        ratio_errors = []
        for builds in by_model.values():
            if len(builds) < 2:
                continue
            models += 1
            right += min(builds, key=predicted.get) == min(builds, key=measured.get)
            for a, b in itertools.combinations(builds, 2):
                ratio_errors.append((predicted[a] / predicted[b]) / (measured[a] / measured[b]) - 1)
        hit = sum(abs(e) <= 0.15 for e in ratio_errors)
        median = f"{statistics.median(map(abs, ratio_errors)):.0%}" if ratio_errors else "—"
        print(f"{cls:<18} {here:<16} {f'{right}/{models}':>14} {f'{hit}/{len(ratio_errors)}':>13} {median:>19}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/tapeout-bench-estimator"))
    parser.add_argument("--skip-build", action="store_true", help="reuse builds already in --out")
    parser.add_argument("--models", default=",".join(SAMPLES + ZOO + tuple(MEDIUM)))
    parser.add_argument("--profiles", default=",".join(PROFILES))
    parser.add_argument("--threads", type=int, help="inference threads for every build (default: one per core)")
    parser.add_argument(
        "--save-class",
        action="store_true",
        help="save this host's calibrations as its CPU class's, in profiles/devices/calibration",
    )
    args = parser.parse_args()

    import os

    from tapeout.builds.reader import open_build
    from tapeout.core.host import host_fingerprint, now
    from tapeout.estimation import estimate, fit, roofline

    os.environ["TAPEOUT_CALIBRATION"] = str(args.out / "calibration")  # this run's probes, no user calibration
    os.environ["TAPEOUT_SHIPPED_CALIBRATION"] = ""  # builds' own estimates: the bound alone
    host = host_fingerprint()
    here = roofline.cpu_class(host)
    print(
        f"host: {host['cpu']} ({here}), {host['cpu_affinity']} cores, flags {' '.join(host['cpu_flags'])}; "
        f"inference threads: {args.threads or 'one per core'}"
    )
    start = time.perf_counter()
    dirs = build_all(args.out, args.models.split(","), args.profiles.split(","), args.skip_build, args.threads)
    loops = []
    for name, kind in LOOPS.items():
        build_dir = args.out / "builds" / f"{name}-{kind}" / "cpu-fp32"
        if _build(
            REPO / "samples" / name,
            _profile_file(args.out, "cpu-fp32", args.threads),
            build_dir,
            f"{name} ({kind}) × cpu-fp32",
            args.skip_build,
        ):
            loops.append(build_dir)
    print(f"{len(dirs) + len(loops)} builds in {time.perf_counter() - start:.0f} s")
    bounds_table(dirs, loops)
    found = []
    for d in dirs:
        got = estimate.measured_record(open_build(d))
        if isinstance(got, str):
            print(f"  skipped: {got}")
        else:
            found.append(got)
    cals = fit.make(found, now(), "bench")
    held_out = held_out_table(cals)
    os.environ.pop("TAPEOUT_SHIPPED_CALIBRATION")
    cross_class_table(dirs, here, held_out)
    if args.save_class:
        for _, meta in found:
            meta["device"] = here + meta["device"][len(roofline.host_name(host)) :]
        for cal in fit.make(found, now(), "bench"):
            print(f"saved {fit.save(cal, SHIPPED)}: {cal.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
