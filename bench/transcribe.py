"""Transcription benchmark: tapeout's transcribe builds of samples/whisper-tiny against torch eager on the same model
and clips, in interleaved rounds of fresh processes.

    python bench/transcribe.py [--profiles P,...] [--rounds 5] [--trials 3] [--skip-build] [--openvino-genai PYTHON]
                               [--onnxruntime-genai PYTHON]

Rows, each round one fresh process per row (the order rotated every round), 2 threads:
  - tapeout: `tapeout build samples/whisper-tiny --profile P` (default cpu-fp32, cpu-int8, cpu-int4,
    openvino-cpu-fp32, openvino-cpu-bf16 — openvino-cpu-fp32 with [options] inference_precision = "bf16", what the
    CPU plugin runs by default where the CPU has BF16 —, openvino-cpu-int4), then each round `tapeout check BUILD --repeats 1`: its loop's encoder,
    time to first token, time per token and each clip length's real-time factor (p50 of the process's `--trials`
    timed transcriptions per length), its peak RSS; greedy agreement with FP32 torch is the build's (4 clips × up to
    32 tokens, measured through the artifact);
  - torch eager FP32: transformers' WhisperForConditionalGeneration from the same directory, in a fresh interpreter
    with torch.set_num_threads(2): the encoder once, then greedy decoding over transformers' own EncoderDecoderCache
    (the cross keys and values computed at the first step, then read), the same clip lengths and token counts, timed
    the same way (the encoder; the first token: the encoder and the first decoder call; each later step).
  - OpenVINO GenAI (with --openvino-genai PYTHON): optimum-intel's export of the same directory
    (`optimum-cli export openvino --task automatic-speech-recognition-with-past`, FP32 and INT8 weights; the
    directory's generation config copied over the export's, which drops Whisper's language map), FP32 weights at the
    plugin's default inference precision (BF16 on CPUs with it) and at f32, INT8 weights at the default, run by its
    WhisperPipeline on raw 16 kHz audio of each clip length (the sample's synthetic speech) in fresh processes of
    PYTHON, the end token suppressed so it decodes the same token counts: its own PerfMetrics give the encoder, TTFT
    and TPOT; the feature extraction it does first (tapeout's loop starts from features) is taken off TTFT and the
    total. Its greedy agreement: its token ids (through a streamer) on the raw audio of the build's golden clips
    against torch's tokens in the cpu-fp32 build's workload.npz, as tapeout judges its own. optimum-intel pins its
    own transformers, so PYTHON is a separate environment:
        python3 -m venv /tmp/ovg && /tmp/ovg/bin/pip install torch==2.13.0 \
            "optimum-intel[openvino]==2.2.*" openvino==2026.4.1 openvino-tokenizers==2026.4.1 openvino-genai==2026.4.1
  - ONNX Runtime GenAI (with --onnxruntime-genai PYTHON): its model builder's FP32 and INT4 CPU models of the same
    directory (`python -m onnxruntime_genai.models.builder -p fp32|int4 -e cpu`), run by its Generator on a 16 kHz
    WAV of the same speech, min_length = max_length so it decodes the same token counts: TTFT = set_inputs (its
    encoder and the start tokens' decoder call) + the first generate_next_token; TPOT each later one; its feature
    extraction (the multimodal processor) is timed apart and left out, as for OpenVINO GenAI. Its encoder is not
    timed apart (its API runs it inside set_inputs). Its agreement as OpenVINO GenAI's (its sequence's ids). PYTHON: an environment with onnxruntime-genai 0.18 and
    transformers ≥ 5 (its builder's), e.g. `pip install onnxruntime-genai==0.18 onnx_ir "transformers>=5"`.
Each clip length decodes audio_s × tokens_per_s tokens (3 a second: 30 for 10 s, 90 for 30 s), whatever the model
says. The table: each row's median over the rounds of its per-round p50s, and the range over the rounds; a row's
real-time factor over torch's in the same round (the per-round ratios: the comparison the host's drift does not
decide). Build time per step and peak memory of each build from its report.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
# bench/kernels.py would stand in for the `kernels` package transformers imports, in this process and its children
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
SAMPLE = REPO / "samples" / "whisper-tiny"
OUT = REPO / "bench" / "builds" / "transcribe"
PROFILES = ("cpu-fp32", "cpu-int8", "cpu-int4", "openvino-cpu-fp32", "openvino-cpu-bf16", "openvino-cpu-int4")
AUDIO_S = (10.0, 30.0)
TOKENS_PER_S = 3.0
THREADS = 2


def project(trials: int) -> Path:
    """The sample with the bench's clip lengths and trials; its one budget the agreement floor of each profile."""
    folder = OUT / "project"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(SAMPLE, folder, ignore=shutil.ignore_patterns("build", "__pycache__"))
    text = (folder / "tapeout.toml").read_text()
    text = text.replace("trials = 10 ", f"trials = {trials} ").replace("real_time_factor = 0.5", "")
    (folder / "tapeout.toml").write_text(text.replace("greedy_min_agreement = 0.9", ""))
    return folder


def build(folder: Path, profile: str) -> dict:
    out = OUT / profile
    given = profile
    if profile == BF16:
        given = str(OUT / f"{BF16}.toml")
        Path(given).write_text('extends = "openvino-cpu-fp32"\n[options]\ninference_precision = "bf16"\n')
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "tapeout", "build", str(folder), "--profile", given, "--out", str(out), "--json"],
        capture_output=True,
        text=True,
    )
    if result.returncode not in (0, 1):
        raise SystemExit(f"tapeout build --profile {profile} failed:\n{result.stderr[-3000:]}")
    report = json.loads(result.stdout)
    report["_wall_s"] = time.perf_counter() - started
    return report


def tapeout_process(build_dir: Path) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "tapeout", "check", str(build_dir), "--repeats", "1", "--json"],
        capture_output=True,
        text=True,
    )
    if result.returncode not in (0, 1):
        raise SystemExit(f"tapeout check {build_dir} failed:\n{result.stderr[-3000:]}")
    w = json.loads(result.stdout)["workload"]
    return {
        "encoder_ms": w["encoder_ms"]["quantiles"]["p50"]["point"],
        "ttft_ms": w["ttft_ms"]["quantiles"]["p50"]["point"],
        "tpot_ms": w["tpot_ms"]["quantiles"]["p50"]["point"],
        **{f"rtf@{s:g}": w["real_time_factor"][f"{s:g}"]["quantiles"]["p50"]["point"] for s in AUDIO_S},
        "peak_rss_mb": w["memory_mb"]["peak_rss"],
    }


def torch_process(trials: int) -> dict:
    result = subprocess.run(
        [sys.executable, __file__, "--child-torch", "--trials", str(trials)], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(f"the torch row failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def torch_child(trials: int) -> None:
    """One fresh process of the torch eager row: its figures as one JSON line."""

    import torch
    import transformers

    sys.path.insert(0, str(SAMPLE))
    import audio
    import model

    torch.set_num_threads(THREADS)
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(model.directory()).eval()
    start = [hf.config.decoder_start_token_id, *(t for _, t in model.FORCED)]
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)  # padded to 30 s, as Whisper runs a clip
    features = extractor(audio.speech(0, 8.0), sampling_rate=16_000, padding="max_length", return_tensors="np")
    x = torch.from_numpy(features["input_features"].astype(np.float32))
    clock = time.perf_counter_ns
    figures: dict[str, list] = {"encoder_ms": [], "ttft_ms": [], "tpot_ms": []}
    totals: dict[float, list] = {s: [] for s in AUDIO_S}
    with torch.inference_mode():
        for seconds in AUDIO_S:
            tokens = round(seconds * TOKENS_PER_S)
            for trial in range(trials + 1):  # the first is a warm-up at this length
                t0 = clock()
                encoded = hf.model.encoder(x).last_hidden_state
                t1 = clock()
                out = hf(encoder_outputs=(encoded,), decoder_input_ids=torch.tensor([start]), use_cache=True)
                token = int(out.logits[0, -1].argmax())
                t2 = clock()
                steps = []
                for _ in range(tokens - 1):
                    ts = clock()
                    out = hf(
                        encoder_outputs=(encoded,),
                        decoder_input_ids=torch.tensor([[token]]),
                        past_key_values=out.past_key_values,
                        use_cache=True,
                    )
                    token = int(out.logits[0, -1].argmax())
                    steps.append((clock() - ts) / 1e6)
                if trial:
                    figures["encoder_ms"].append((t1 - t0) / 1e6)
                    figures["ttft_ms"].append((t2 - t0) / 1e6)
                    figures["tpot_ms"] += steps
                    totals[seconds].append((clock() - t0) / 1e6)
    row = {k: float(np.median(v)) for k, v in figures.items()}
    row.update({f"rtf@{s:g}": float(np.median(v)) / (s * 1e3) for s, v in totals.items()})
    row["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(row))


GOLDEN = 4  # the sample's agreement_clips: the build's golden clips, whose torch tokens its workload.npz holds
COMPARED = 32  # its agreement_tokens
EOS = 50257  # the sample's end token
BF16 = "openvino-cpu-bf16"  # openvino-cpu-fp32 with the CPU plugin's BF16 inference (what OpenVINO picks by default)


def peak_rss_mb() -> float:
    """This process's peak resident memory: VmHWM, which starts anew at exec (ru_maxrss does not: a child forked by
    this bench's parent would report the parent's hundreds of MB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def golden_audio(audio) -> list[np.ndarray]:
    """The raw speech of the sample's golden clips (audio.clips: seeds 0, 1, …, 4 to 12 s each)."""
    return [audio.speech(seed, float(np.random.default_rng(seed).uniform(4, 12))) for seed in range(GOLDEN)]


def agreement_of(tokens: list[list[int]]) -> float:
    """A peer's greedy tokens on the golden clips against torch's (the cpu-fp32 build's workload.npz), as tapeout
    judges its own: the share reproduced before each clip's first divergence, the end token repeated after it."""
    with np.load(OUT / "cpu-fp32" / "workload.npz") as data:
        reference = data["reference"]
    eos = EOS
    rows = [[*t[:COMPARED], *[eos] * (COMPARED - len(t[:COMPARED]))] for t in tokens]
    shares = []
    for ref, got in zip(reference, np.asarray(rows), strict=True):
        differ = np.flatnonzero(ref != got)
        shares.append((differ[0] if differ.size else len(ref)) / len(ref))
    return float(np.mean(shares))


def ov_genai_export(python: str, weights: str) -> Path:
    """optimum-intel's export of the sample's directory at `weights` (fp32 | int8), made once."""
    out = OUT / f"ov-genai-{weights}"
    if not (out / "openvino_encoder_model.xml").is_file():
        sys.path.insert(0, str(SAMPLE))
        import model

        source = model.directory()
        cli = Path(python).parent / "optimum-cli"
        command = [str(cli), "export", "openvino", "--model", str(source), "--task"]
        command += ["automatic-speech-recognition-with-past", "--weight-format", weights, str(out)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"optimum-cli export failed:\n{result.stderr[-3000:]}")
        shutil.copyfile(source / "generation_config.json", out / "generation_config.json")
    return out


def ov_genai_process(python: str, folder: Path, trials: int, precision: str) -> dict:
    command = [python, __file__, "--child-ov-genai", str(folder), "--trials", str(trials), "--precision", precision]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"the OpenVINO GenAI row failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def ov_genai_child(folder: str, trials: int, precision: str) -> None:
    """One fresh process of an OpenVINO GenAI row (run by its own environment's Python): its figures as one line.
    `precision`: its CPU plugin's inference precision ("default": bf16 on CPUs with it)."""

    import openvino_genai

    sys.path.insert(0, str(SAMPLE))
    import audio

    settings = {"INFERENCE_NUM_THREADS": THREADS}
    if precision != "default":
        settings["INFERENCE_PRECISION_HINT"] = precision
    pipe = openvino_genai.WhisperPipeline(folder, "CPU", **settings)

    class Tokens(openvino_genai.StreamerBase):  # the token ids it decodes (its results carry text only)
        def __init__(self):
            super().__init__()
            self.ids: list[int] = []

        def write(self, token):
            self.ids += list(token) if isinstance(token, list) else [int(token)]
            return openvino_genai.StreamingStatus.RUNNING

        def end(self):
            pass

    golden = pipe.get_generation_config()
    golden.language, golden.task, golden.return_timestamps = "<|en|>", "transcribe", False
    golden.max_new_tokens = COMPARED
    tokens = []
    for clip in golden_audio(audio):
        streamer = Tokens()
        pipe.generate(clip.tolist(), golden, streamer=streamer)
        tokens.append(streamer.ids)
    config = pipe.get_generation_config()
    config.language, config.task, config.return_timestamps = "<|en|>", "transcribe", False
    config.suppress_tokens = [config.eos_token_id]  # the same token counts as every other row
    figures: dict[str, list] = {"encoder_ms": [], "ttft_ms": [], "tpot_ms": []}
    totals: dict[float, list] = {s: [] for s in AUDIO_S}
    for seconds in AUDIO_S:
        config.max_new_tokens = round(seconds * TOKENS_PER_S)
        speech = audio.speech(0, seconds).tolist()
        for trial in range(trials + 1):  # the first is a warm-up at this length
            metrics = pipe.generate(speech, config).perf_metrics
            if trial:
                features = metrics.get_features_extraction_duration().mean
                figures["encoder_ms"].append(metrics.get_encode_inference_duration().mean)
                figures["ttft_ms"].append(metrics.get_ttft().mean - features)
                figures["tpot_ms"].append(metrics.get_tpot().mean)
                totals[seconds].append(metrics.get_generate_duration().mean - features)
    row = {k: float(np.median(v)) for k, v in figures.items()}
    row.update({f"rtf@{s:g}": float(np.median(v)) / (s * 1e3) for s, v in totals.items()})
    row["peak_rss_mb"] = peak_rss_mb()
    row["tokens"] = tokens
    print(json.dumps(row))


def ort_genai_export(python: str, precision: str) -> Path:
    """ONNX Runtime GenAI's builder's model of the sample's directory at `precision` (fp32 | int4), made once."""
    out = OUT / f"ort-genai-{precision}"
    if not (out / "genai_config.json").is_file():
        sys.path.insert(0, str(SAMPLE))
        import model

        command = [python, "-m", "onnxruntime_genai.models.builder", "-i", str(model.directory()), "-o", str(out)]
        result = subprocess.run([*command, "-p", precision, "-e", "cpu"], capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"onnxruntime-genai's builder failed:\n{result.stderr[-3000:]}")
    return out


def ort_genai_process(python: str, folder: Path, trials: int) -> dict:
    command = [python, __file__, "--child-ort-genai", str(folder), "--trials", str(trials)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"the ONNX Runtime GenAI row failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _wav(path: Path, speech: np.ndarray) -> None:
    import wave

    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16_000)
        out.writeframes((np.clip(speech, -1, 1) * 32767).astype(np.int16).tobytes())


def ort_genai_child(folder: str, trials: int) -> None:
    """One fresh process of an ONNX Runtime GenAI row (run by its own environment's Python): one JSON line."""
    import tempfile

    import onnxruntime_genai as og

    sys.path.insert(0, str(SAMPLE))
    import audio

    config = og.Config(folder)
    config.clear_providers()  # the CPU
    config.overlay(
        json.dumps(
            {
                "model": {
                    "decoder": {"session_options": {"intra_op_num_threads": THREADS}},
                    "encoder": {"session_options": {"intra_op_num_threads": THREADS}},
                }
            }
        )
    )
    model = og.Model(config)
    processor = model.create_multimodal_processor()
    prompt = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
    figures: dict[str, list] = {"ttft_ms": [], "tpot_ms": []}
    totals: dict[float, list] = {s: [] for s in AUDIO_S}
    clock = time.perf_counter_ns
    golden_tokens = []
    with tempfile.TemporaryDirectory() as scratch:
        for i, clip in enumerate(golden_audio(audio)):
            path = Path(scratch) / f"golden-{i}.wav"
            _wav(path, clip)
            params = og.GeneratorParams(model)
            params.set_search_options(do_sample=False, max_length=4 + COMPARED)
            generator = og.Generator(model, params)
            generator.set_inputs(processor([prompt], audios=og.Audios.open(str(path))))
            while not generator.is_done():
                generator.generate_next_token()
            golden_tokens.append([int(t) for t in generator.get_sequence(0)[4:]])
        for seconds in AUDIO_S:
            path = Path(scratch) / f"{seconds:g}.wav"
            _wav(path, audio.speech(0, seconds))
            tokens = round(seconds * TOKENS_PER_S)
            for trial in range(trials + 1):  # the first is a warm-up at this length
                inputs = processor([prompt], audios=og.Audios.open(str(path)))  # its feature extraction: left out
                params = og.GeneratorParams(model)
                params.set_search_options(do_sample=False, min_length=4 + tokens, max_length=4 + tokens)
                t0 = clock()
                generator = og.Generator(model, params)
                generator.set_inputs(inputs)
                generator.generate_next_token()
                t1 = clock()
                steps = []
                while not generator.is_done():
                    ts = clock()
                    generator.generate_next_token()
                    steps.append((clock() - ts) / 1e6)
                if trial:
                    figures["ttft_ms"].append((t1 - t0) / 1e6)
                    figures["tpot_ms"] += steps
                    totals[seconds].append((clock() - t0) / 1e6)
    row = {k: float(np.median(v)) for k, v in figures.items()}
    row["encoder_ms"] = float("nan")  # inside set_inputs: not timed apart
    row["tokens"] = golden_tokens
    row.update({f"rtf@{s:g}": float(np.median(v)) / (s * 1e3) for s, v in totals.items()})
    row["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(row))


def machine() -> str:
    flags = ""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                name = line.split(":", 1)[1].strip()
            if line.startswith("Flags"):
                have = set(line.split(":", 1)[1].split())
                wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile")
                flags = " ".join(f for f in wanted if f in have)
    except OSError:
        name = platform.processor()
    return f"{name}, {os.cpu_count()} cores, flags: {flags}; load {os.getloadavg()[0]:.2f}"


def spread(values: list[float], digits: int = 3) -> str:
    if all(np.isnan(values)):
        return "—"
    return f"{np.median(values):.{digits}g} ({min(values):.{digits}g}–{max(values):.{digits}g})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profiles", default=",".join(PROFILES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--skip-build", action="store_true", help="measure the builds kept from before")
    parser.add_argument("--openvino-genai", metavar="PYTHON", help="add OpenVINO GenAI's WhisperPipeline rows")
    parser.add_argument("--child-torch", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--onnxruntime-genai", metavar="PYTHON", help="add ONNX Runtime GenAI's Whisper rows")
    parser.add_argument("--child-ov-genai", help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--child-ort-genai", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_torch:
        torch_child(args.trials)
        return
    if args.child_ov_genai:
        ov_genai_child(args.child_ov_genai, args.trials, args.precision)
        return
    if args.child_ort_genai:
        ort_genai_child(args.child_ort_genai, args.trials)
        return
    profiles = [p for p in args.profiles.split(",") if p]
    print(f"machine: {machine()}")
    builds: dict[str, dict] = {}
    if not args.skip_build:
        folder = project(args.trials)
        for profile in profiles:
            builds[profile] = build(folder, profile)
    else:
        for profile in profiles:
            builds[profile] = json.loads((OUT / profile / "report.json").read_text())
    if builds and not args.skip_build:
        print("\nbuild time per step (s) and the build's peak RSS (MB):")
        for profile, report in builds.items():
            run = report["run"]
            steps = " · ".join(f"{s['name']} {s['seconds']:.1f}" for s in run["steps"] if s["seconds"] >= 0.5)
            peak = run["peak_rss_mb"]
            print(f"  {profile}: {report['_wall_s']:.0f} s wall, peak {peak:.0f} MB: {steps}")
    rows = {f"tapeout {p}": (lambda p=p: tapeout_process(OUT / p)) for p in profiles}
    rows["torch eager fp32"] = lambda: torch_process(args.trials)
    if args.openvino_genai:
        for weights, precision in (("fp32", "default"), ("fp32", "f32"), ("int8", "default")):
            folder = ov_genai_export(args.openvino_genai, weights)
            rows[f"OpenVINO GenAI {weights} ({precision} inference)"] = lambda f=folder, p=precision: ov_genai_process(
                args.openvino_genai, f, args.trials, p
            )
    if args.onnxruntime_genai:
        for precision in ("fp32", "int4"):
            folder = ort_genai_export(args.onnxruntime_genai, precision)
            rows[f"ONNX Runtime GenAI {precision}"] = lambda f=folder: ort_genai_process(
                args.onnxruntime_genai, f, args.trials
            )
    measured: dict[str, list[dict]] = {name: [] for name in rows}
    names = list(rows)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            measured[name].append(rows[name]())
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(
        f"\n{args.rounds} rounds × one fresh process per row, order rotated; median (range over rounds) of each "
        f"process's p50; {args.trials} timed transcriptions per clip length per process; {THREADS} threads\n"
    )
    head = [
        "row",
        "encoder ms",
        "TTFT ms",
        "TPOT ms",
        "RTF@10 s",
        "RTF@30 s",
        "RTF@30 s / torch",
        "peak RSS MB",
        "agreement",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    torch_rtf = [m["rtf@30"] for m in measured["torch eager fp32"]]
    for name, runs in measured.items():
        ratio = [m["rtf@30"] / t for m, t in zip(runs, torch_rtf, strict=True)]
        profile = name.removeprefix("tapeout ")
        if profile in builds:
            agreement = f"{builds[profile]['workload']['agreement']['share']:.2f}"
        elif "tokens" in runs[0]:
            agreement = f"{agreement_of(runs[0]['tokens']):.2f}"
        else:
            agreement = "reference"
        cells = [
            name,
            *(spread([m[k] for m in runs]) for k in ("encoder_ms", "ttft_ms", "tpot_ms", "rtf@10", "rtf@30")),
            spread(ratio),
            spread([m["peak_rss_mb"] for m in runs], 4),
            agreement,
        ]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
