"""Build cost at the sizes users ship: tapeout's build of a decoder, step by step, beside ONNX Runtime GenAI's model
builder on the same Hugging Face directory, in one run.

    python bench/scale.py [--models llama-40m,smollm2-135m,qwen2.5-0.5b] [--profile cpu-int4] [--out DIR]
                          [--genai-python PYTHON] [--optimum-python PYTHON] [--rounds N]

Models (random weights from their configs, so nothing is downloaded): the samples llama-40m (41.6 M) and
smollm2-135m (SmolLM2-135M's shape, 134.5 M), and qwen2.5-0.5b (Qwen2.5-0.5B's shape: qkv bias, GQA 14/2, a
151 936-token vocabulary; 494 M), written by this script under --out. Per model and round, each in a fresh process
one after another (the order rotated between rounds): `tapeout build MODEL -p PROFILE` with an empty export cache
(its report's time per step, the wall time and the process's peak resident memory), then the same build again,
which reuses that export (the row "export cached"), and with --genai-python, ONNX Runtime GenAI's builder at INT4
for the CPU (`PYTHON -m onnxruntime_genai.models.builder -i HF_DIR -o OUT -p int4 -e cpu`: the builder needs
transformers 5), and with --optimum-python, optimum-intel's OpenVINO export at INT4 (`optimum-cli export openvino
--weight-format int4 --group-size 32 --ratio 1.0 --sym`; its own environment, see bench/generate.py). Peak memory is each process's own (`wait4`), over the FP32 weights'
size. Targets (issue 78): a 135 M cpu-int4 build in at most 3 minutes on 2 cores, a 0.5 B one in at most 10, peak
memory at most 2.5x the FP32 weights. `lscpu` flags and the load are printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QWEN_05B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
PROJECT = """[model]
name = "{name}"
source = "{source}"
outputs = ["logits"]

[[inputs]]
name = "input_ids"
shape = ["batch", 256]
dtype = "int64"
range = [0, {top}]

[dims]
batch = 1

[workload]
kind = "generate"
prompt_lengths = [128]
new_tokens = 128
max_context = 256
trials = 3
agreement_prompts = 4
"""


def project_of(name: str, out: Path) -> tuple[Path, Path]:
    """(the project to build, its Hugging Face directory)."""
    if name in ("llama-40m", "smollm2-135m"):
        sample = REPO / "samples" / name
        subprocess.run([sys.executable, str(sample / "model.py")], check=True, capture_output=True)
        return sample, sample / "hf"
    if name != "qwen2.5-0.5b":
        raise SystemExit(f"unknown model {name!r}: llama-40m, smollm2-135m or qwen2.5-0.5b")
    project = out / "projects" / name
    hf = project / "hf"
    if not (hf / "config.json").is_file():
        # in a process of its own: a child's peak RSS, as wait4 reports it, is at least its parent's at the fork,
        # and this model is 2 GB in FP32
        maker = (
            "import json, sys, torch, transformers; torch.manual_seed(0); transformers.Qwen2ForCausalLM("
            "transformers.Qwen2Config(**json.loads(sys.argv[1]))).eval().save_pretrained(sys.argv[2])"
        )
        subprocess.run([sys.executable, "-c", maker, json.dumps(QWEN_05B), str(hf)], check=True, cwd=REPO)
    (project / "tapeout.toml").write_text(PROJECT.format(name=name, source="hf", top=QWEN_05B["vocab_size"] - 1))
    return project, hf


def with_tokenizer(hf: Path) -> Path:
    """A word-level tokenizer of the model's vocabulary beside its weights, where it has none: the builder copies a
    tokenizer into its output and refuses a directory without one (random-weight models come with none)."""
    if not (hf / "tokenizer.json").is_file():
        from tokenizers import Tokenizer, models

        vocab = json.loads((hf / "config.json").read_text())["vocab_size"]
        Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0")).save(str(hf / "tokenizer.json"))
        (hf / "tokenizer_config.json").write_text(
            json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "t0"})
        )
    return hf


def timed(command: list[str], log: Path, env: dict) -> tuple[int, float, float]:
    """(exit code, wall seconds, the process tree's peak RSS in MB: the largest of its processes')."""
    start = time.perf_counter()
    with log.open("w") as sink:
        child = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, time.perf_counter() - start, usage.ru_maxrss / 1024


def weights_mb(hf: Path) -> float:
    return sum(f.stat().st_size for f in hf.glob("*.safetensors")) / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama-40m,smollm2-135m")
    parser.add_argument("--profile", default="cpu-int4")
    parser.add_argument("--out", type=Path, default=Path("/tmp/tapeout-bench-scale"))
    parser.add_argument("--genai-python", help="a Python with onnxruntime-genai (its builder) and transformers 5")
    parser.add_argument("--optimum-python", help="a Python with optimum-intel and OpenVINO (its own environment)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()

    flags = next(
        (
            line.split(":", 1)[1].split()
            for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
            if line.startswith("Flags")
        ),
        [],
    )
    print(
        f"host: {os.cpu_count()} CPUs; flags {' '.join(f for f in flags if f.startswith(('avx', 'amx', 'fma')))}; "
        f"load {os.getloadavg()[0]:.2f}"
    )
    env = {**os.environ, "TAPEOUT_CALIBRATION": str(args.out / "calibration")}
    rows: dict[tuple[str, str], list[tuple[float, float, dict]]] = {}
    models = args.models.split(",")
    projects = {m: project_of(m, args.out) for m in models}
    for r in range(args.rounds):
        for model in models[r % len(models) :] + models[: r % len(models)]:
            project, hf = projects[model]
            tools = [
                (
                    "tapeout " + args.profile,
                    [
                        sys.executable,
                        "-m",
                        "tapeout",
                        "build",
                        str(project),
                        "-p",
                        args.profile,
                        "-o",
                        str(args.out / "builds" / model / args.profile),
                    ],
                )
            ]
            if args.genai_python:
                tools.append(
                    (
                        "ORT GenAI builder int4",
                        [
                            args.genai_python,
                            "-m",
                            "onnxruntime_genai.models.builder",
                            "-i",
                            str(with_tokenizer(hf)),
                            "-o",
                            str(args.out / "genai" / model),
                            "-p",
                            "int4",
                            "-e",
                            "cpu",
                            "-c",
                            str(args.out / "genai-cache" / model),
                        ],
                    )
                )
            if args.optimum_python:
                tools.append(
                    (
                        "optimum-intel export int4",
                        [
                            str(Path(args.optimum_python).parent / "optimum-cli"),
                            "export",
                            "openvino",
                            "--model",
                            str(with_tokenizer(hf)),
                            "--task",
                            "text-generation-with-past",
                            "--weight-format",
                            "int4",
                            "--group-size",
                            "32",
                            "--ratio",
                            "1.0",
                            "--sym",
                            str(args.out / "genai" / model),
                        ],
                    )
                )
            cache = args.out / "export-cache" / f"{model}-{r}"
            shutil.rmtree(cache, ignore_errors=True)  # the first build is cold, and leaves its export for the next
            ordered = tools[r % len(tools) :] + tools[: r % len(tools)]
            if ordered[0][0].startswith("tapeout"):
                ordered.insert(1, (f"tapeout {args.profile}, export cached", ordered[0][1]))
            else:
                ordered.append((f"tapeout {args.profile}, export cached", tools[0][1]))
            for tool, command in ordered:
                shutil.rmtree(args.out / "genai" / model, ignore_errors=True)
                log = args.out / f"{model}-{tool.split()[0]}{'-cached' if 'cached' in tool else ''}-{r}.log"
                log.parent.mkdir(parents=True, exist_ok=True)
                code, wall, rss = timed(command, log, {**env, "TAPEOUT_EXPORT_CACHE": str(cache)})
                steps = {}
                if tool.startswith("tapeout"):
                    report = args.out / "builds" / model / args.profile / "report.json"
                    if report.is_file():
                        steps = {s["name"]: s["seconds"] for s in json.loads(report.read_text())["run"]["steps"]}
                print(f"  {model} · {tool}: exit {code}, {wall:.0f} s, peak {rss:.0f} MB", flush=True)
                if code not in ((0, 1) if tool.startswith("tapeout") else (0,)):  # tapeout: 1 is a budget missed
                    print(log.read_text()[-1500:])
                    continue
                rows.setdefault((model, tool), []).append((wall, rss, steps))
    print(
        f"\n{'model':<14} {'tool':<32} {'FP32 weights MB':>16} {'wall s':>8} {'peak MB':>8} {'peak/weights':>13}  "
        "slowest steps (s)"
    )
    for (model, tool), runs in rows.items():
        fp32 = weights_mb(projects[model][1])
        wall = statistics.median(w for w, _, _ in runs)
        rss = statistics.median(m for _, m, _ in runs)
        steps = runs[-1][2]
        slowest = ", ".join(f"{k} {v:.0f}" for k, v in sorted(steps.items(), key=lambda kv: -kv[1])[:5])
        spread = f" [{min(w for w, _, _ in runs):.0f}, {max(w for w, _, _ in runs):.0f}]" if len(runs) > 1 else ""
        print(f"{model:<14} {tool:<32} {fp32:>16.0f} {wall:>8.0f}{spread} {rss:>8.0f} {rss / fp32:>13.1f}  {slowest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
