"""Generation benchmark: tapeout's generate builds against torch eager on the same model, prompt and lengths.

    python bench/generate.py [--prompt 64] [--new 64] [--trials 5] [--repeats 3] [--skip-build]

Rows, each from fresh processes (`--repeats` of them), 2 threads:
  - tapeout: `tapeout build samples/tiny-lm --profile cpu-fp32 | cpu-int8 | cpu-int4` with [workload] set to
    one prompt length (--prompt) and --new new tokens; the figures are the build's own report (TTFT and TPOT
    medians over all processes, with their 95 % order-statistic bounds; decode tok/s; peak RSS);
  - torch eager FP32: the same tiny-lm decoder and its own KV cache (forward(input_ids, *past)), greedy, in a
    fresh interpreter with torch.set_num_threads(2), timed the same way (prefill + argmax; each decode step).
Decode roofline: bytes read per decode step (the artifact's weights + the KV cache at the mean decoded position)
over the copy bandwidth this host measures (core.host_speed), and TPOT p50 as a multiple of it.

Not here yet (see the issue's note): the Llama-style 40 M HF model, ONNX Runtime GenAI's model builder and
OpenVINO GenAI rows, and OpenVINO builds: tapeout's generate export takes user decoders (tiny-lm) so far.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "builds" / "generate"
PROFILES = ("cpu-fp32", "cpu-int8", "cpu-int4")

TORCH_LOOP = r"""
import json, sys, time
import numpy as np, torch
torch.set_num_threads(2)
sys.path.insert(0, sys.argv[1])
t0 = time.perf_counter()
import model as tiny
decoder = tiny.build()
prompt_len, new, trials = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
text = np.frombuffer(open(sys.argv[1] + "/data/heldout.txt", "rb").read(), dtype=np.uint8).astype(np.int64)
ids = torch.from_numpy(text[None, :prompt_len].copy())
empty = [torch.zeros(1, decoder.generation["kv_heads"], 0, decoder.generation["head_dim"])
         for _ in range(2 * decoder.generation["layers"])]
ttft, tpot = [], []
with torch.inference_mode():
    for trial in range(trials + 1):
        s = time.perf_counter()
        logits, *past = decoder(ids, *empty)
        token = logits[:, -1:].argmax(-1)
        first = time.perf_counter() - s
        steps = []
        for _ in range(new - 1):
            s = time.perf_counter()
            logits, *past = decoder(token, *past)
            token = logits[:, -1:].argmax(-1)
            steps.append(time.perf_counter() - s)
        if trial:
            ttft.append(first * 1e3)
            tpot += [x * 1e3 for x in steps]
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
params = sum(p.numel() for p in decoder.parameters())
print(json.dumps({"ttft_ms": ttft, "tpot_ms": tpot, "peak_rss_mb": peak, "weights_bytes": 4 * params}))
"""


def project(prompt: int, new: int, trials: int) -> Path:
    folder = OUT / "tiny-lm"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(REPO / "samples" / "tiny-lm", folder, ignore=shutil.ignore_patterns("build", "__pycache__"))
    text = (folder / "tapeout.toml").read_text()
    text = text.replace("prompt_lengths = [16, 64]", f"prompt_lengths = [{prompt}]")
    text = text.replace("new_tokens = 32", f"new_tokens = {new}\ntrials = {trials}")
    (folder / "tapeout.toml").write_text(text)
    return folder


def build(folder: Path, profile: str, repeats: int) -> dict:
    spec = OUT / f"{profile}.toml"
    spec.write_text(f'extends = "{profile}"\n[options]\nthreads = 2\n[check]\nrepeats = {repeats}\niterations = 100\n'
                    "op_profile = false\n")
    out = OUT / profile
    result = subprocess.run([sys.executable, "-m", "tapeout", "build", str(folder), "--profile", str(spec),
                             "--out", str(out), "--json"], capture_output=True, text=True)
    if result.returncode not in (0, 1):
        sys.exit(f"tapeout build --profile {profile} failed: {result.stderr.strip().splitlines()[-1:]}")
    return json.loads((out / "report.json").read_text())


def bounds(values: np.ndarray) -> str:
    from tapeout.measurement import stats

    q = stats.summarize([values], 0.95, quantiles=(0.5,)).quantiles["p50"]
    return f"{q.point:.3f} [{q.lower:.3f}, {q.upper:.3f}]"


def torch_row(folder: Path, prompt: int, new: int, trials: int, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, "-c", TORCH_LOOP, str(folder), str(prompt), str(new), str(trials)],
                              capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    ttft = np.concatenate([r["ttft_ms"] for r in runs])
    tpot = np.concatenate([r["tpot_ms"] for r in runs])
    return {"name": "torch eager FP32 (own KV cache)", "ttft": bounds(ttft), "tpot": bounds(tpot),
            "tpot_p50": float(np.median(tpot)), "tok_s": 1e3 / float(np.median(tpot)),
            "peak": max(r["peak_rss_mb"] for r in runs), "weights_bytes": runs[0]["weights_bytes"]}


def tapeout_row(report: dict, prompt: int) -> dict:
    w = report["workload"]
    t = w["ttft_ms"][str(prompt)]["quantiles"]["p50"]
    p = w["tpot_ms"]["quantiles"]["p50"]
    tok = w["decode_tokens_per_s"]
    acc = report.get("accuracy") or {}
    return {"name": f"tapeout {report['profile']['name'].split('/')[-1]} ({report['profile']['precision']})",
            "ttft": f"{t['point']:.3f} [{t['lower']:.3f}, {t['upper']:.3f}]",
            "tpot": f"{p['point']:.3f} [{p['lower']:.3f}, {p['upper']:.3f}]", "tpot_p50": p["point"],
            "tok_s": tok["point"], "peak": w["memory_mb"]["peak_rss"], "weights_bytes": report["artifact"]["bytes"],
            "ppl": acc.get("artifact"), "agree": w["agreement"]["share"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-build", action="store_true", help="reuse the builds under bench/builds/generate")
    args = parser.parse_args()
    from tapeout.core.decoding import CacheLayout
    from tapeout.core.host import cpu_info
    from tapeout.core.host_speed import host_state

    OUT.mkdir(parents=True, exist_ok=True)
    folder = project(args.prompt, args.new, args.trials) if not args.skip_build else OUT / "tiny-lm"
    rows = []
    for profile in PROFILES:
        report = (json.loads((OUT / profile / "report.json").read_text()) if args.skip_build
                  else build(folder, profile, args.repeats))
        rows.append(tapeout_row(report, args.prompt))
    layout = CacheLayout.from_json(report["workload"]["layout"])
    rows.append(torch_row(folder, args.prompt, args.new, args.trials, args.repeats))
    state = host_state()
    mean_position = args.prompt + args.new / 2
    cpu, flags = cpu_info()
    print(f"tiny-lm (1.9 M parameters), prompt {args.prompt}, {args.new} new tokens, batch 1, 2 threads, "
          f"{args.repeats} fresh processes × {args.trials} generations per row")
    print(f"host: {cpu} ({platform.machine()}), flags: {' '.join(sorted(flags))}")
    print(f"copy bandwidth {state['bandwidth_gbs']:.1f} GB/s (range {state['bandwidth_gbs_range'][0]:.1f}–"
          f"{state['bandwidth_gbs_range'][1]:.1f}); times in ms, p50 [95 % bounds]\n")
    header = ["build", "TTFT p50", "TPOT p50", "decode tok/s", "peak RSS MB", "roofline ms", "TPOT/roofline",
              "perplexity", "greedy agreement"]
    table = []
    for r in rows:
        roof = (r["weights_bytes"] + layout.kv_bytes(int(mean_position))) / (state["bandwidth_gbs"] * 1e9) * 1e3
        table.append([r["name"], r["ttft"], r["tpot"], f"{r['tok_s']:.0f}", f"{r['peak']:.0f}", f"{roof:.3f}",
                      f"{r['tpot_p50'] / roof:.1f}×", "—" if r.get("ppl") is None else f"{r['ppl']:.4f}",
                      "—" if r.get("agree") is None else f"{r['agree']:.0%}"])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table, strict=True)]
    for line in (header, ["-" * w for w in widths], *table):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)))
    print("\nroofline: the artifact's bytes (weights) + keys and values at the mean decoded position, read once per "
          "decode step, over the copy bandwidth above (torch's: its FP32 parameters). Perplexity "
          "(per byte, held-out text, teacher-forced through the cache) and agreement are the builds' own.")


if __name__ == "__main__":
    main()
