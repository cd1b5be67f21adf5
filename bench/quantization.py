"""Quantization benchmark: what a user would do with ONNX Runtime's tools today, and tapeout's build.

    python bench/quantization.py [--samples minilm digits-cnn tiny-lm] [--skip-build] [--blocks 8] [--runs 40]

For each sample, from the same verified FP32 export (`tapeout build`'s export/model.onnx):
  - ORT `quantize_dynamic` with its defaults, and with per_channel=True;
  - ORT `quantize_static` (QDQ, per-channel, its default op list, MinMax) on the sample's calibration data;
  - for tiny-lm, ORT's MatMulNBits quantizer with its defaults (4 bits, block 128, asymmetric, every MatMul);
  - tapeout's artifact from `tapeout build --profile cpu-int8` (cpu-int4 for tiny-lm);
  - OpenVINO (CPU device, 2 inference threads, f32 for what is float): the FP32 export, NNCF with its
    defaults (`nncf.quantize(model, dataset)`; for tiny-lm `nncf.compress_weights(model,
    mode=INT4_SYM)`: group 128, ratio 1, embedding and LM head INT8), and tapeout's
    `openvino-cpu-int8` artifact (`openvino-cpu-int4` for tiny-lm).
Speed: every model against the FP32 export in this one process, same session settings (2 intra-op
threads, all graph optimizations), blocks of --runs runs alternating A B A B, --blocks blocks; the
figure is the median of the per-block ratios FP32 time / model time, with their range.
Quality: the sample's own metric (mean cosine vs the FP32 torch embeddings, top-1 on held-out
digits, per-byte perplexity on held-out text); for MiniLM also top-1 neighbour agreement: for each
of the 300 sentences, is its nearest other sentence (cosine of the mean-pooled embeddings) the same
as with the FP32 reference embeddings.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def _project(sample: str) -> Path:
    """The sample's project as one forward call: tiny-lm's own tapeout.toml is a generate workload (bench/generate.py
    measures that); forward.toml is the same model as one call over 128 bytes, what this benchmark compares."""
    folder = REPO / "samples" / sample
    return folder / "forward.toml" if (folder / "forward.toml").is_file() else folder


PROFILES = {"minilm": "cpu-int8", "digits-cnn": "cpu-int8", "tiny-lm": "cpu-int4"}
OV_PROFILES = {"minilm": "openvino-cpu-int8", "digits-cnn": "openvino-cpu-int8", "tiny-lm": "openvino-cpu-int4"}
OUT = REPO / "bench" / "builds"


def session(path: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


class OpenVinoModel:
    """An OpenVINO CPU compiled model behind the two methods of an ORT session the timing loop uses."""

    def __init__(self, model, threads: int = 2):
        import openvino as ov

        core = ov.Core()
        source = core.read_model(str(model)) if isinstance(model, Path) else model
        self.compiled = core.compile_model(
            source,
            "CPU",
            {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": str(threads), "INFERENCE_PRECISION_HINT": "f32"},
        )
        self.request = self.compiled.create_infer_request()
        self.names = [o.get_any_name() for o in self.compiled.outputs]

    def run(self, _names, feeds):
        results = self.request.infer(feeds)
        return [np.array(results[o]) for o in self.compiled.outputs]

    def get_outputs(self):
        return [type("Output", (), {"name": n})() for n in self.names]


def nncf_defaults(fp32: Path, sample: str, work: Path) -> tuple[Path | None, str]:
    """What a user gets from NNCF's defaults, saved as OpenVINO IR, or why it fails: `nncf.quantize(model, dataset)`
    with no model type or preset; for the decoder, `nncf.compress_weights` in INT4 (its default mode is INT8)."""
    import nncf
    import openvino as ov

    model = ov.Core().read_model(str(fp32))
    try:
        if sample == "tiny-lm":
            result = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT4_SYM)
        else:
            result = nncf.quantize(model, nncf.Dataset(calibration(sample)))
    except Exception as exc:
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}"
    ov.save_model(result, str(work / "nncf_defaults.xml"), compress_to_fp16=False)
    return work / "nncf_defaults.xml", ""


def cpu_line() -> str:
    """The CPU's name and the flags INT8 and BF16 speed depend on: figures compare within one run only."""
    import os

    from tapeout.core.host import cpu_info

    name, flags = cpu_info()
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
    return f"CPU: {name or 'unknown'}, {os.cpu_count()} logical; flags " + " ".join(f for f in wanted if f in flags)


def predictor(sess):
    names = [o.name for o in sess.get_outputs()]
    return lambda feeds: dict(zip(names, sess.run(names, feeds), strict=True))


def speed(fp32, model, feeds: dict, blocks: int, runs: int) -> tuple[float, float, float, float]:
    """Median (min, max) of per-block FP32/model time ratios, and the model's median ms per run.

    A block lasts at least ~50 ms of FP32 time (more runs for tiny models): shorter blocks time the
    scheduler, not the model."""
    for s in (fp32, model):
        for _ in range(10):
            s.run(None, feeds)
    start = time.perf_counter()
    for _ in range(10):
        fp32.run(None, feeds)
    runs = max(runs, int(0.05 / max((time.perf_counter() - start) / 10, 1e-7)))
    ratios, per_run = [], []
    for _ in range(blocks):
        times = []
        for s in (fp32, model):
            start = time.perf_counter()
            for _ in range(runs):
                s.run(None, feeds)
            times.append(time.perf_counter() - start)
        ratios.append(times[0] / times[1])
        per_run.append(times[1] / runs * 1e3)
    return float(np.median(ratios)), min(ratios), max(ratios), float(np.median(per_run))


def load_sample(sample: str):
    """The sample's metric module (and text helpers) imported fresh: samples reuse module names."""
    import importlib

    for name in ("metric", "text", "model"):
        sys.modules.pop(name, None)
    folder = _project(sample)
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("metric")
    finally:
        sys.path.remove(str(folder))


def calibration(sample: str) -> list[dict]:
    if sample == "digits-cnn":
        with np.load(_project(sample) / "data" / "calibration.npz") as data:
            return [{"image": x} for x in data["image"]]
    text = sys.modules["text"]
    return list(text.calibration())


def baselines(sample: str, fp32: Path, work: Path) -> dict[str, Path]:
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static

    models = {}
    if sample == "tiny-lm":
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        q = MatMulNBitsQuantizer(onnx.load(str(fp32)))  # defaults: 4 bits, block 128, asymmetric, all MatMuls
        q.process()
        q.model.save_model_to_file(str(work / "nbits_default.onnx"))
        models["ORT MatMulNBits, defaults (4-bit, block 128)"] = work / "nbits_default.onnx"
    quantize_dynamic(fp32, work / "dyn.onnx")
    models["ORT `quantize_dynamic`, defaults"] = work / "dyn.onnx"
    quantize_dynamic(fp32, work / "dyn_pc.onnx", per_channel=True)
    models["ORT `quantize_dynamic`, per-channel"] = work / "dyn_pc.onnx"
    samples = calibration(sample)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    quantize_static(fp32, work / "static.onnx", Reader(), quant_format=QuantFormat.QDQ, per_channel=True)
    models["ORT `quantize_static` QDQ, per-channel"] = work / "static.onnx"
    return models


def neighbours(emb: np.ndarray) -> np.ndarray:
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    sim = unit @ unit.T
    np.fill_diagonal(sim, -np.inf)
    return sim.argmax(1)


def quality(sample: str, metric, predict) -> dict:
    if sample == "minilm":
        text = sys.modules["text"]  # the held-out sentences, as the sample's metric scores them
        reference = np.load(REPO / "samples/minilm/data/reference.npy").astype(np.float64)[text.CALIBRATION :]
        emb = metric.embed(predict, text.held_out())
        cos = (emb * reference).sum(1) / (np.linalg.norm(emb, axis=1) * np.linalg.norm(reference, axis=1))
        return {
            "mean cosine": f"{cos.mean():.4f}",
            "top-1 neighbour agreement": f"{(neighbours(emb) == neighbours(reference)).mean():.3f}",
        }
    if sample == "digits-cnn":
        return {"top-1": f"{metric.top1(predict):.4f}"}
    return {"perplexity": f"{metric.perplexity(predict):.4f}"}


def size_mb(path: Path) -> float:
    """A model's bytes: the file (OpenVINO IR: .xml and its .bin), or a directory's files."""
    if path.suffix == ".xml":
        files = [path, path.with_suffix(".bin")]
    else:
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 2**20


def run(sample: str, skip_build: bool, blocks: int, runs: int) -> None:
    build = OUT / f"{sample}-{PROFILES[sample]}"
    if not (skip_build and (build / "report.json").is_file()):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tapeout",
                "build",
                str(_project(sample)),
                "--profile",
                PROFILES[sample],
                "--out",
                str(build),
            ],
            check=False,
        )
    fp32_path, artifact = build / "export" / "model.onnx", build / "artifact" / "model.onnx"
    if not artifact.is_file():
        print(f"{sample}: no artifact in {build}: the build failed before compiling", file=sys.stderr)
        return
    with np.load(build / "golden.npz") as data:
        feeds = {k[len("input.") :]: data[k][0] for k in data.files if k.startswith("input.")}
    metric = load_sample(sample)
    fp32 = session(fp32_path)
    rows = [("ORT FP32 (the export)", fp32_path, None)]
    with tempfile.TemporaryDirectory(prefix="tapeout-bench-") as tmp:
        models = baselines(sample, fp32_path, Path(tmp))
        rows += [(name, path, None) for name, path in models.items()]
        rows.append((f"**tapeout** `{PROFILES[sample]}`", artifact, build / "artifact"))
        failed = []
        if sample in OV_PROFILES:
            ov_build = OUT / f"{sample}-{OV_PROFILES[sample]}"
            if not (skip_build and (ov_build / "report.json").is_file()):
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "tapeout",
                        "build",
                        str(_project(sample)),
                        "--profile",
                        OV_PROFILES[sample],
                        "--out",
                        str(ov_build),
                    ],
                    check=False,
                )
            rows.append(("OpenVINO FP32 (the export, f32)", fp32_path, "openvino"))
            defaults, why = nncf_defaults(fp32_path, sample, Path(tmp))
            label = (
                "OpenVINO + NNCF `compress_weights` INT4_SYM, defaults"
                if sample == "tiny-lm"
                else "OpenVINO + NNCF `quantize`, defaults"
            )
            if defaults is not None:
                rows.append((label, defaults, None))
            else:
                failed.append(f"{label}: fails ({why})")
            if (ov_build / "artifact" / "model.xml").is_file():
                rows.append(
                    (f"**tapeout** `{OV_PROFILES[sample]}`", ov_build / "artifact" / "model.xml", ov_build / "artifact")
                )
        table = []
        for name, path, directory in rows:
            if directory == "openvino":
                sess, directory = OpenVinoModel(path), None
            elif path.suffix == ".xml":
                sess = OpenVinoModel(path)
            else:
                sess = fp32 if path == fp32_path else session(path)
            ratio = (
                (1.0, 1.0, 1.0, speed(fp32, fp32, feeds, 2, runs)[3])
                if sess is fp32
                else speed(fp32, sess, feeds, blocks, runs)
            )
            q = quality(sample, metric, predictor(sess))
            table.append((name, ratio, q, size_mb(directory or path)))
            print(f"  {sample}: {name}: {ratio[0]:.2f}x, {q}", file=sys.stderr, flush=True)
    keys = list(table[0][2])
    fp32_mb = table[0][3]
    print(f"\n### {sample} (batch 1; {blocks} blocks of ≥ {runs} runs and ≥ 50 ms per model, A B A B against FP32)\n")
    print("| model | speed vs ORT FP32, median (range) | ms/run | " + " | ".join(keys) + " | size MB (share of FP32) |")
    print("|---|---|---|" + "---|" * len(keys) + "---|")
    for name, (median, low, high, ms), q, mb in table:
        size = "—" if mb != mb else f"{mb:.2f} ({mb / fp32_mb:.0%})"
        print(
            f"| {name} | {median:.2f}× ({low:.2f}–{high:.2f}) | {ms:.3f} | "
            + " | ".join(q[k] for k in keys)
            + f" | {size} |"
        )
    for line in failed:
        print(f"| {line} | | |" + " |" * len(keys) + " |")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", nargs="+", default=list(PROFILES), choices=list(PROFILES))
    parser.add_argument("--skip-build", action="store_true", help="reuse bench/builds/* when present")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    import onnxruntime as ort

    print(
        f"onnxruntime {ort.__version__} · {subprocess.run(['uname', '-m'], capture_output=True, text=True).stdout.strip()}"
        f" · {time.strftime('%Y-%m-%d')}"
    )
    print(cpu_line())
    for sample in args.samples:
        run(sample, args.skip_build, args.blocks, args.runs)


if __name__ == "__main__":
    main()
