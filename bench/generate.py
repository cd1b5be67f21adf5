"""Generation benchmark: tapeout's generate builds against torch eager on the same model, prompt and lengths.

    python bench/generate.py [--sample tiny-lm|llama-40m|smollm2-135m] [--prompt N] [--new N] [--trials 5]
                             [--repeats 3] [--profiles P,...] [--skip-build] [--rounds N] [--llamacpp SRC]
                             [--openvino-genai PYTHON]

Rows, each from fresh processes (`--repeats` of them), 2 threads:
  - tapeout: `tapeout build samples/<sample> --profile` cpu-fp32, cpu-int8, cpu-int4 (ONNX Runtime, the cache
    bound in its buffers), cpu-int4 with `[quantization] overrides = { lm_head = "int4" }` (the LM head at 4 bits,
    as ONNX Runtime GenAI's builder writes it; the profile's rule starts it at 8), cpu-int8 with the same override
    (the body dynamic INT8 for prefill, the head 4-bit MatMulNBits for decode), openvino-cpu, openvino-cpu-int4
    (OpenVINO's stateful model) with [workload] set to one
    prompt length (--prompt) and --new new tokens; the figures are the build's own report (TTFT and TPOT medians
    over all processes, with their 95 % order-statistic bounds; decode tok/s; peak RSS), or with --skip-build, for
    a build kept from before, `tapeout check BUILD --repeats R` of it now (its loop's figures measured again in
    this run, like every other row; perplexity and the estimate stay the build's);
  - torch eager FP32: the same decoder and its own KV cache (tiny-lm: forward(input_ids, *past); llama-40m:
    transformers' LlamaForCausalLM with its DynamicCache), greedy, in a fresh interpreter with
    torch.set_num_threads(2), timed the same way (prefill + argmax; each decode step).
--rounds N then measures every row but torch's again, interleaved: N rounds of one fresh process per row (a
tapeout row: `tapeout check BUILD --repeats 1`), the order rotated each round, and prints each row's median of its
per-round p50s, and each tapeout row's TTFT and TPOT over the best other row's in the same round. The first table's
rows are measured one after another, minutes apart, on a host whose speed drifts by 10–30 % over minutes; the
per-round ratios are the comparison that drift does not decide.
Decode roofline: bytes read per decode step over the copy bandwidth this host measures (core.host_speed), and TPOT
p50 as a multiple of it. Bytes read per step: every weight a decode step multiplies by, at its stored precision
(tapeout: the build's plan per group, int4/int8 with one scale per block; ONNX Runtime GenAI: its ONNX
initializers; torch: FP32 parameters), one row of an embedding table that only a lookup reads, and the KV cache
at the mean decoded position.

  - llama.cpp (a Hugging Face sample, with --llamacpp SRC: SRC is llama.cpp's source tree, whose converter
    `convert_hf_to_gguf.py` writes the GGUF; llama-cpp-python's sdist carries it under vendor/llama.cpp):
    the same directory converted to an F32 GGUF (no tokenizer: token ids in, as every row here), quantized by
    llama.cpp's own `llama_model_quantize` to Q4_0 and Q8_0, and run greedy by llama-cpp-python in fresh processes
    (`eval` of the prompt, then one token at a time; each token the argmax of the last logits): TTFT = the prompt's
    eval and its argmax; TPOT = each later eval and argmax. Build llama-cpp-python with clang (Debian's GCC 12
    miscompiles its AMX tile set-up and quantized models die with "Illegal instruction" on AMX hosts):
        apt-get install clang-19 libomp-19-dev
        CMAKE_ARGS="-DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19" pip install llama-cpp-python==0.3.36
  - ONNX Runtime GenAI (a Hugging Face sample, when `onnxruntime_genai` imports: `pip install -e ".[bench]"`):
    its model builder's INT4 and FP32 CPU models made from the same Hugging Face directory
    (`python -m onnxruntime_genai.models.builder -p int4|fp32 -e cpu`), run greedy by its own Generator in fresh
    processes: TTFT = append_tokens (prefill) + the first generate_next_token; TPOT = each later one.
  - OpenVINO GenAI (a Hugging Face sample, with --openvino-genai PYTHON): optimum-intel's INT4 export of the same directory
    (`optimum-cli export openvino --weight-format int4 --group-size 32 --ratio 1.0 --sym`), run greedy by its
    LLMPipeline in fresh processes of PYTHON, timed by its own PerfMetrics (TTFT; each later token), three times:
    its CPU defaults (bf16 activations on CPUs with them, a u8 KV cache, the PagedAttention backend); f32 with an
    f32 cache, as tapeout's openvino-cpu-int4 runs; and that on its SDPA backend (ATTENTION_BACKEND=SDPA: the
    stateful model with the fused attention over the state, the form tapeout's loop runs). optimum-intel pins its
    own transformers, so PYTHON is a separate environment:
        python3 -m venv /tmp/ovg && /tmp/ovg/bin/pip install torch==2.13.0 \
            "optimum-intel[openvino]==2.2.*" openvino==2026.4.1 openvino-tokenizers==2026.4.1 openvino-genai==2026.4.1
  - --cuda (on an NVIDIA GPU with onnxruntime-gpu): the ort-cuda builds cuda-fp32 and cuda-fp16 (the KV cache bound
    in GPU memory between steps, the logits alone copied to the host) against torch eager and torch.compile
    (dynamic=True) on the GPU at FP32 and FP16, each synchronised before a token's clock stops; memory is the
    process's GPU memory as NVML lists it (CUDA context included); the roofline is over the device-to-device copy
    bandwidth measured there.
Defaults: tiny-lm at prompt 64 + 64 new; llama-40m and smollm2-135m at prompt 128 + 128 new.
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
PROFILES = (
    "cpu-fp32",
    "cpu-int8",
    "cpu-int8-lm-head-int4",
    "cpu-int4",
    "cpu-int4-lm-head-int4",
    "openvino-cpu",
    "openvino-cpu-int4",
)
# rows that are a shipped profile with one setting changed: cpu-int4 with its LM head at 4 bits, as ONNX Runtime
# GenAI's model builder writes it (the rule starts the head at 8: on llama-40m that is about half the bytes a
# decode step reads), so the two decode at the same precision
VARIANTS = {
    "cpu-int4-lm-head-int4": ("cpu-int4", '[quantization]\noverrides = { lm_head = "int4" }\n'),
    "cpu-int8-lm-head-int4": ("cpu-int8", '[quantization]\noverrides = { lm_head = "int4" }\n'),
}
CUDA_PROFILES = ("cuda-fp32", "cuda-fp16")
DEFAULTS = {"tiny-lm": (64, 64), "llama-40m": (128, 128), "smollm2-135m": (128, 128)}  # prompt, new tokens

TORCH_LOOP = r"""
import json, os, sys, time
import numpy as np, torch
torch.set_num_threads(2)
sys.path.insert(0, sys.argv[1])
import model as sample
prompt_len, new, trials = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
device, dtype, compiled = sys.argv[5], getattr(torch, sys.argv[6]), sys.argv[7] == "compile"
cuda = device == "cuda"
if hasattr(sample, "directory"):  # a Hugging Face directory: transformers' own model and cache
    import transformers
    decoder = transformers.AutoModelForCausalLM.from_pretrained(sample.directory()).eval()
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, decoder.config.vocab_size, (1, prompt_len)))

    import inspect
    key = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"  # renamed in 5.x

    def first_call(ids):
        out = decoder(input_ids=ids, use_cache=True)
        return out.logits, getattr(out, key)

    def next_call(token, cache):
        out = decoder(input_ids=token, use_cache=True, **{key: cache})
        return out.logits, getattr(out, key)
else:  # tiny-lm: forward(input_ids, *past) -> (logits, *present)
    decoder = sample.build()
    text = np.frombuffer(open(sys.argv[1] + "/data/heldout.txt", "rb").read(), dtype=np.uint8).astype(np.int64)
    ids = torch.from_numpy(text[None, :prompt_len].copy())
    empty = [torch.zeros(1, decoder.generation["kv_heads"], 0, decoder.generation["head_dim"])
             for _ in range(2 * decoder.generation["layers"])]

    def first_call(ids):
        logits, *past = decoder(ids, *empty)
        return logits, past

    def next_call(token, past):
        logits, *past = decoder(token, *past)
        return logits, past
params = sum(p.numel() for p in decoder.parameters())
decoder = decoder.to(device=device, dtype=dtype)
ids = ids.to(device)
if not hasattr(sample, "directory"):
    empty = [e.to(device=device, dtype=dtype) for e in empty]
if compiled:  # symbolic lengths from the start: the cache grows every token
    if hasattr(sample, "directory"):
        decoder.forward = torch.compile(decoder.forward, dynamic=True)
    else:
        decoder = torch.compile(decoder, dynamic=True)
sync = torch.cuda.synchronize if cuda else (lambda: None)
ttft, tpot = [], []
warm = 2 if compiled else 1  # torch.compile: compilations for prefill, then for decode's symbolic lengths
with torch.inference_mode():
    for trial in range(trials + warm):
        sync()
        s = time.perf_counter()
        logits, past = first_call(ids)
        token = logits[:, -1:].argmax(-1)
        sync()
        first = time.perf_counter() - s
        steps = []
        for _ in range(new - 1):
            s = time.perf_counter()
            logits, past = next_call(token, past)
            token = logits[:, -1:].argmax(-1)
            sync()  # the token is chosen when the device says so (tapeout's loop reads the logits on the host)
            steps.append(time.perf_counter() - s)
        if trial >= warm:
            ttft.append(first * 1e3)
            tpot += [x * 1e3 for x in steps]
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
gpu_peak = None
if cuda:  # as tapeout's NVML meter reads it: this process's device memory (context, caching allocator's pool)
    import pynvml
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    mine = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()]
    gpu_peak = mine[0] / 2**20 if mine and mine[0] is not None else torch.cuda.max_memory_reserved() / 2**20
# an embedding table only a lookup reads costs one row a step; a tied head reads it whole (counted once)
table = decoder.get_input_embeddings().weight if hasattr(decoder, "get_input_embeddings") else decoder.embed.weight
head = decoder.get_output_embeddings() if hasattr(decoder, "get_output_embeddings") else decoder.lm_head
tied = head is not None and head.weight is table
read = params - (0 if tied else table.numel() - table.shape[1])
print(json.dumps({"ttft_ms": ttft, "tpot_ms": tpot, "peak_rss_mb": peak, "gpu_peak_mb": gpu_peak,
                  "weights_bytes": torch.finfo(dtype).bits // 8 * read, "params": params}))
"""


GENAI_LOOP = r"""
import json, sys, time
import numpy as np
import onnxruntime_genai as og
folder, prompt_len, new, trials = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model = og.Model(folder)
vocab = json.load(open(folder + "/genai_config.json"))["model"]["vocab_size"]
ids = np.random.default_rng(0).integers(0, vocab, (1, prompt_len)).astype(np.int32)
ttft, tpot = [], []
for trial in range(trials + 1):
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompt_len + new, do_sample=False, min_length=prompt_len + new)
    generator = og.Generator(model, params)
    s = time.perf_counter()
    generator.append_tokens(ids)
    generator.generate_next_token()
    first = time.perf_counter() - s
    steps = []
    for _ in range(new - 1):
        s = time.perf_counter()
        generator.generate_next_token()
        steps.append(time.perf_counter() - s)
    if trial:
        ttft.append(first * 1e3)
        tpot += [x * 1e3 for x in steps]
    del generator
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
print(json.dumps({"ttft_ms": ttft, "tpot_ms": tpot, "peak_rss_mb": peak}))
"""


# The converter run with no tokenizer: the samples' directories have none, and every row here feeds token ids
GGUF_CONVERT = r"""
import sys
sys.path.insert(0, sys.argv[1])
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[2:]]
import convert_hf_to_gguf as convert
found = convert.get_model_class


def without_vocab(*args, **kwargs):  # the model's class with no tokenizer to read: "none", ids in and out
    cls = found(*args, **kwargs)
    return type(cls.__name__, (cls,), {"set_vocab": lambda self: self._set_vocab_none(), "model_arch": cls.model_arch})


convert.get_model_class = without_vocab
convert.main()
"""

GGUF_QUANTIZE = r"""
import ctypes, sys
import llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = int(sys.argv[3])
params.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params)))
"""

LLAMACPP_LOOP = r"""
import json, sys, time
import numpy as np
import llama_cpp
path, prompt_len, new, trials = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = llama_cpp.Llama(model_path=path, n_ctx=prompt_len + new, n_batch=prompt_len, n_ubatch=prompt_len, n_threads=2,
                      n_threads_batch=2, verbose=False)
vocab = llm.n_vocab()
rng = np.random.default_rng(0)


def greedy():  # the last token's logits (the only row llama.cpp computes without logits_all)
    return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))


ttft, tpot = [], []
for trial in range(trials + 1):
    ids = rng.integers(0, vocab, prompt_len).tolist()
    llm.reset()  # eval drops the cache past n_tokens: each generation starts from an empty cache
    s = time.perf_counter()
    llm.eval(ids)
    token = greedy()
    first = time.perf_counter() - s
    steps = []
    for _ in range(new - 1):
        s = time.perf_counter()
        llm.eval([token])
        token = greedy()
        steps.append(time.perf_counter() - s)
    if trial:
        ttft.append(first * 1e3)
        tpot += [x * 1e3 for x in steps]
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
print(json.dumps({"ttft_ms": ttft, "tpot_ms": tpot, "peak_rss_mb": peak}))
"""

LLAMACPP_TYPES = {"Q4_0": 2, "Q8_0": 7}  # llama.cpp's LLAMA_FTYPE_MOSTLY_* ids


def gguf_read_bytes(source: Path, path: Path) -> int:
    """Bytes of the GGUF's tensors a decode step reads: whole, except a token table that a separate output matrix
    leaves to the lookup alone (one row)."""
    sys.path.insert(0, str(source / "gguf-py"))
    import gguf

    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    total = sum(int(t.n_bytes) for t in tensors.values())
    table = tensors.get("token_embd.weight")
    if table is not None and "output.weight" in tensors:
        total -= int(table.n_bytes) - int(table.n_bytes) // int(table.shape[-1])
    return total


def llamacpp_rows(source: Path, hf_dir: Path, prompt: int, new: int, trials: int, repeats: int) -> list[dict]:
    """llama.cpp's Q4_0 and Q8_0 of the same directory (its converter, then its quantizer), run by llama-cpp-python."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("llama_cpp is not installed: no llama.cpp rows (see the docstring: build it with clang)", file=sys.stderr)
        return []
    if not (source / "convert_hf_to_gguf.py").is_file():
        sys.exit(
            f"--llamacpp {source}: no convert_hf_to_gguf.py there; give llama.cpp's source tree "
            "(llama-cpp-python's sdist has it under vendor/llama.cpp)"
        )
    f32 = OUT / f"gguf-{hf_dir.parent.name}-f32.gguf"
    if not f32.is_file():
        print("llama.cpp converter, f32 …", file=sys.stderr, flush=True)
        done = subprocess.run(
            [sys.executable, "-c", GGUF_CONVERT, str(source), str(hf_dir), "--outtype", "f32", "--outfile", str(f32)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0 or not f32.is_file():
            sys.exit(f"convert_hf_to_gguf.py failed: {(done.stderr or done.stdout).strip().splitlines()[-3:]}")
    rows = []
    for label, ftype in LLAMACPP_TYPES.items():
        path = OUT / f"gguf-{hf_dir.parent.name}-{label}.gguf"
        if not path.is_file():
            print(f"llama.cpp quantizer, {label} …", file=sys.stderr, flush=True)
            subprocess.run(
                [sys.executable, "-c", GGUF_QUANTIZE, str(f32), str(path), str(ftype)], capture_output=True, check=True
            )
        row, _ = loop_row(
            f"llama.cpp {label} (llama-cpp-python)",
            LLAMACPP_LOOP,
            [str(path), str(prompt), str(new), str(trials)],
            repeats,
        )
        rows.append({**row, "weights_bytes": gguf_read_bytes(source, path)})
    return rows


def onnx_read_bytes(path: Path) -> int:
    """Bytes of the initializers a decode step reads: whole, except a table only Gather reads (one row)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    readers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    total = 0
    for init in model.graph.initializer:
        size = int(np.prod(init.dims)) * onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
        total += size // init.dims[0] if readers.get(init.name) == {"Gather"} and init.dims else size
    return total


def plan_read_bytes(report: dict) -> int:
    """Bytes of weights a decode step reads, from the build's analysis (params per group) and its precision plan:
    int4/int8 weights with one scale per block (FP32 scales on ONNX Runtime, FP16 in OpenVINO's NNCF)."""
    plan = (report.get("quantization") or {}).get("plan") or {}
    precision = {g["group"]: g["precision"] for g in plan.get("groups", [])}
    block = plan.get("block_size", 32)
    scale = 2 if report["target"]["name"] == "openvino" else 4
    per_weight = {
        "fp32": 4.0,
        "fp16": 2.0,
        "int8": 1.0,
        "int4": 0.5 + scale / block,
        "int8-weight": 1.0 + scale / block,
    }
    return int(
        sum(
            g["params"] * per_weight.get(precision.get(g["name"], "fp32"), 4.0)
            for g in report["analysis"]["groups"]
            if g["role"] != "embedding"
        )
    )


OV_GENAI_LOOP = r"""
import json, sys
import numpy as np
import openvino as ov
import openvino_genai as og
folder, prompt_len, new, trials, settings = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
config = {"INFERENCE_NUM_THREADS": 2, **json.loads(settings)}
pipe = og.LLMPipeline(folder, "CPU", **config)  # no tokenizer in the folder: token ids in, token ids out
vocab = json.load(open(folder + "/config.json"))["vocab_size"]
rng = np.random.default_rng(0)
generation = og.GenerationConfig()
generation.max_new_tokens = generation.min_new_tokens = new
generation.do_sample, generation.ignore_eos = False, True
ttft, tpot = [], []
for trial in range(trials + 1):
    # a new prompt each time: the pipeline keeps its KV cache between calls and reuses a repeated prompt's prefix
    # (the same prompt again measured a 1.9 ms "TTFT")
    ids = rng.integers(0, vocab, (1, prompt_len)).astype(np.int64)
    inputs = og.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
    raw = pipe.generate(inputs, generation).perf_metrics.raw_metrics  # its own clocks: TTFT and each later token
    if trial:
        ttft += [t / 1e3 for t in raw.m_times_to_first_token]
        tpot += [t / 1e3 for t in raw.m_durations]
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
print(json.dumps({"ttft_ms": ttft, "tpot_ms": tpot, "peak_rss_mb": peak}))
"""


def genai_rows(hf_dir: Path, prompt: int, new: int, trials: int, repeats: int) -> list[dict]:
    """ONNX Runtime GenAI's builder models (INT4, FP32) run by its own Generator; none when it is not installed."""
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        print(
            'onnxruntime_genai is not installed: no ONNX Runtime GenAI rows (pip install -e ".[bench]")',
            file=sys.stderr,
        )
        return []
    source = (
        OUT / f"genai-source-{hf_dir.parent.name}"
    )  # the builder insists on a tokenizer: a word-level one over the model's ids
    if not (source / "tokenizer.json").is_file():
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        shutil.rmtree(source, ignore_errors=True)
        shutil.copytree(hf_dir, source)
        vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
        words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
        words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", bos_token="t1", eos_token="t2").save_pretrained(
            source
        )
    rows = []
    for precision in ("int4", "fp32"):
        folder = OUT / f"genai-{hf_dir.parent.name}-{precision}"
        if not (folder / "genai_config.json").is_file():
            print(f"ONNX Runtime GenAI model builder, {precision} …", file=sys.stderr, flush=True)
            built = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "onnxruntime_genai.models.builder",
                    "-i",
                    str(source),
                    "-o",
                    str(folder),
                    "-p",
                    precision,
                    "-e",
                    "cpu",
                    "-c",
                    str(OUT / "genai-cache"),
                ],
                capture_output=True,
                text=True,
            )
            if built.returncode != 0 or not (folder / "genai_config.json").is_file():
                tail = (built.stderr or built.stdout).strip().splitlines()[-1:]
                print(f"ONNX Runtime GenAI builder failed at {precision}: {tail}", file=sys.stderr)
                continue
        row, _ = loop_row(
            f"ONNX Runtime GenAI {precision.upper()} (model builder)",
            GENAI_LOOP,
            [str(folder), str(prompt), str(new), str(trials)],
            repeats,
        )
        rows.append({**row, "weights_bytes": onnx_read_bytes(folder / "model.onnx")})
    return rows


# OpenVINO GenAI's CPU settings per row: as it ships (bf16 activations where the CPU has them, a u8 KV cache, and
# its PagedAttention backend: the continuous-batching scheduler over a block-paged cache), as tapeout's
# openvino-cpu-int4 profile runs (f32 activations, an f32 cache), and that again on its SDPA backend: the stateful
# model with the plugin's fused attention over the state, the form tapeout's own loop drives
OV_GENAI_SETTINGS = {
    "its defaults: bf16, u8 cache, PagedAttention": {},
    "f32, f32 cache, PagedAttention": {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"},
    "f32, f32 cache, SDPA backend": {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "f32",
        "ATTENTION_BACKEND": "SDPA",
    },
}


def ov_genai_rows(python: str, hf_dir: Path, prompt: int, new: int, trials: int, repeats: int) -> list[dict]:
    """OpenVINO GenAI's LLMPipeline on optimum-intel's INT4 export of the same Hugging Face directory (symmetric
    INT4 in groups of 32 like tapeout's profile; optimum puts the tied embedding/LM head at 8 bits), run by `python`:
    an interpreter of its own environment, since optimum-intel pins its own transformers."""
    folder = OUT / f"ov-genai-{hf_dir.parent.name}-int4"
    if not (folder / "openvino_model.xml").is_file():
        print("optimum-intel export, int4 …", file=sys.stderr, flush=True)
        cli = Path(python).parent / "optimum-cli"
        done = subprocess.run(
            [
                str(cli),
                "export",
                "openvino",
                "--model",
                str(hf_dir),
                "--task",
                "text-generation-with-past",
                "--weight-format",
                "int4",
                "--group-size",
                "32",
                "--ratio",
                "1.0",
                "--sym",
                str(folder),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0 or not (folder / "openvino_model.xml").is_file():
            print(
                f"optimum-intel export failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}",
                file=sys.stderr,
            )
            return []
    import openvino as ov

    weights = sum(
        op.get_byte_size()
        for op in ov.Core().read_model(str(folder / "openvino_model.xml")).get_ops()
        if op.get_type_name() == "Constant"
    )  # the tied table is the head's too: read whole per token
    rows = []
    for label, settings in OV_GENAI_SETTINGS.items():
        row, _ = loop_row(
            f"OpenVINO GenAI INT4 (optimum-intel, {label})",
            OV_GENAI_LOOP,
            [str(folder), str(prompt), str(new), str(trials), json.dumps(settings)],
            repeats,
            python,
        )
        rows.append({**row, "weights_bytes": weights})
    return rows


def project(sample: str, prompt: int, new: int, trials: int) -> Path:
    import re

    folder = OUT / sample
    if folder.exists():
        shutil.rmtree(folder)
    # the llama sample's hf/ (written by its model.py) is made again in the copy: same config, same seed
    shutil.copytree(REPO / "samples" / sample, folder, ignore=shutil.ignore_patterns("build", "__pycache__", "hf"))
    text = (folder / "tapeout.toml").read_text()
    text = re.sub(r"prompt_lengths = \[[^]]*\]", f"prompt_lengths = [{prompt}]", text)
    text = re.sub(r"new_tokens = \d+", f"new_tokens = {new}", text)
    text = re.sub(r"\ntrials = \d+.*", "", text)
    text = re.sub(
        r"max_context = \d+", lambda m: f"max_context = {max(int(m.group(0).split()[-1]), prompt + new)}", text
    )
    (folder / "tapeout.toml").write_text(text.replace("[workload]\n", f"[workload]\ntrials = {trials}\n"))
    return folder


def build(folder: Path, profile: str, repeats: int) -> dict:
    base, extra = VARIANTS.get(profile, (profile, ""))
    spec = OUT / f"{profile}.toml"
    spec.write_text(
        f'extends = "{base}"\n[options]\nthreads = 2\n[check]\nrepeats = {repeats}\niterations = 100\n'
        f"op_profile = false\n{extra}"
    )
    out = OUT / f"{folder.name}-{profile}"
    result = subprocess.run(
        [sys.executable, "-m", "tapeout", "build", str(folder), "--profile", str(spec), "--out", str(out), "--json"],
        capture_output=True,
        text=True,
    )
    if result.returncode not in (0, 1):
        sys.exit(f"tapeout build --profile {profile} failed: {result.stderr.strip().splitlines()[-1:]}")
    return json.loads((out / "report.json").read_text())


def bounds(values: np.ndarray) -> str:
    from tapeout.measurement import stats
    from tapeout.reports.generation import interval

    q = stats.summarize([values], 0.95, quantiles=(0.5,)).quantiles["p50"]
    return interval(
        {
            "point": q.point,
            "lower": q.lower if np.isfinite(q.lower) else None,
            "upper": q.upper if np.isfinite(q.upper) else None,
        }
    )


def loop_row(name: str, loop: str, args: list[str], repeats: int, python: str = sys.executable) -> tuple[dict, dict]:
    """A row from `repeats` fresh interpreters (`python`) each running `loop` (a script printing its timings as
    JSON), and the first run's own figures."""
    runs = []
    for _ in range(repeats):
        done = subprocess.run([python, "-c", loop, *args], capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    ttft = np.concatenate([r["ttft_ms"] for r in runs])
    tpot = np.concatenate([r["tpot_ms"] for r in runs])
    return {
        "name": name,
        "ttft": bounds(ttft),
        "tpot": bounds(tpot),
        "tpot_p50": float(np.median(tpot)),
        "tok_s": 1e3 / float(np.median(tpot)),
        "peak": max(r["peak_rss_mb"] for r in runs),
        "again": [python, "-c", loop, *args],
    }, runs[0]


def torch_row(
    folder: Path,
    prompt: int,
    new: int,
    trials: int,
    repeats: int,
    device: str = "cpu",
    dtype: str = "float32",
    mode: str = "eager",
) -> dict:
    label = {"float32": "FP32", "float16": "FP16"}[dtype]
    where = " on the GPU" if device == "cuda" else ""
    name = f"torch {'eager' if mode == 'eager' else 'torch.compile (dynamic=True)'} {label}{where} (its own KV cache)"
    row, first = loop_row(
        name, TORCH_LOOP, [str(folder), str(prompt), str(new), str(trials), device, dtype, mode], repeats
    )
    if device == "cuda":
        row["peak"] = first["gpu_peak_mb"]
    row["kv_scale"] = 0.5 if dtype == "float16" else 1.0  # its cache in the model's dtype
    return {**row, "weights_bytes": first["weights_bytes"], "params": first["params"]}


COPY_BANDWIDTH = r"""
import json, torch
x = torch.empty(2**28, dtype=torch.uint8, device="cuda")
y = torch.empty_like(x)
for _ in range(3):
    y.copy_(x)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
rates = []
for _ in range(10):
    start.record(); y.copy_(x); end.record(); end.synchronize()
    rates.append(2 * x.numel() / (start.elapsed_time(end) * 1e-3) / 1e9)  # read + write
print(json.dumps({"bandwidth_gbs": sorted(rates)[5], "bandwidth_gbs_range": [min(rates), max(rates)],
                  "gpu": torch.cuda.get_device_name()}))
"""


def gpu_copy_bandwidth() -> dict:
    """The GPU's device-to-device copy bandwidth (a 256 MiB copy, read + write counted, median of ten)."""
    done = subprocess.run([sys.executable, "-c", COPY_BANDWIDTH], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def tapeout_row(report: dict, prompt: int) -> dict:
    from tapeout.reports.generation import interval

    w = report["workload"]
    t = w["ttft_ms"][str(prompt)]["quantiles"]["p50"]
    p = w["tpot_ms"]["quantiles"]["p50"]
    tok = w["decode_tokens_per_s"]
    acc = report.get("accuracy") or {}
    est = (report.get("estimate") or {}).get("generation") or {}
    return {
        "est_ttft": ((est.get("ttft_ms") or {}).get(str(prompt)) or {}).get("lower_bound"),
        "est_tpot": ((est.get("tpot_ms") or {}).get("lower_bound") or {}).get("p50"),
        "name": f"tapeout {report['profile']['name'].split('/')[-1]} ({report['profile']['precision']})",
        "again": [sys.executable, "-m", "tapeout", "check", report["build_dir"], "--repeats", "1", "--json"],
        "ttft": interval(t),
        "tpot": interval(p),
        "tpot_p50": p["point"],
        "tok_s": tok["point"],
        "weights_bytes": plan_read_bytes(report),
        "peak": (w["memory_mb"].get("device") or {}).get("peak")
        if report["target"]["name"] == "ort-cuda"
        else w["memory_mb"]["peak_rss"],
        "ppl": acc.get("artifact"),
        "agree": w["agreement"]["share"],
    }


def measured_again(build_dir: str, repeats: int) -> dict:
    """The workload figures of a kept build measured now, by `tapeout check` in `repeats` fresh processes: a build's
    own figures are from when it was built, and the other rows are measured in this run (exit 1 is a missed
    budget: the figures still stand)."""
    done = subprocess.run(
        [sys.executable, "-m", "tapeout", "check", build_dir, "--repeats", str(repeats), "--json"],
        capture_output=True,
        text=True,
    )
    if done.returncode not in (0, 1):
        sys.exit(f"tapeout check {build_dir} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    return json.loads(done.stdout)["workload"]


def one_process(command: list[str], prompt: int) -> tuple[float, float]:
    """TTFT and TPOT medians (ms) of one more fresh process of a row: its loop again, or `tapeout check` of the
    build with one process (exit 1 is a missed budget: the figures still stand)."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        sys.exit(f"{' '.join(command[:4])} … failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1] if "tapeout" not in command[:3] else done.stdout)
    if "ttft_ms" in out:  # a peer's loop: its raw timings
        return float(np.median(out["ttft_ms"])), float(np.median(out["tpot_ms"]))
    w = out["workload"]
    return w["ttft_ms"][str(prompt)]["quantiles"]["p50"]["point"], w["tpot_ms"]["quantiles"]["p50"]["point"]


def interleaved(rows: list[dict], rounds: int, prompt: int) -> None:
    """Every row again in `rounds` rounds, one fresh process per row per round, the order rotated each round, so
    that a host whose speed drifts over minutes moves every row of a round alike; then each tapeout row against the
    best other row, per round."""
    rows = [r for r in rows if r.get("again") and not r["name"].startswith("torch")]
    got: dict[str, list[tuple[float, float]]] = {r["name"]: [] for r in rows}
    for k in range(rounds):
        print(f"round {k + 1} of {rounds} …", file=sys.stderr, flush=True)
        for r in rows[k % len(rows) :] + rows[: k % len(rows)]:
            got[r["name"]].append(one_process(r["again"], prompt))
    ours = [n for n in got if n.startswith("tapeout")]
    peers = [n for n in got if not n.startswith("tapeout")]

    def spread(values) -> str:
        return f"{np.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"

    def ahead(ratios) -> str:  # the per-round ratios, and in how many rounds the tapeout row was ahead
        return f"{spread(ratios)}, ahead {int(np.sum(ratios < 1))}/{len(ratios)}"

    print(
        f"\nInterleaved: {rounds} rounds, one fresh process per row per round (order rotated); median of the "
        "per-round p50s [min, max], ms\n"
    )
    header = ["build", "TTFT", "TPOT", "TTFT / best other's, per round", "TPOT / best other's, per round"]
    table = []
    for name in got:
        ttft, tpot = np.array(got[name]).T
        row = [name, spread(ttft), spread(tpot), "", ""]
        if name in ours and peers:  # per round, against the best of the others in that round
            best = np.array([[min(got[p][k][m] for p in peers) for m in (0, 1)] for k in range(rounds)])
            row[3], row[4] = ahead(ttft / best[:, 0]), ahead(tpot / best[:, 1])
        table.append(row)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table, strict=True)]
    for line in (header, ["-" * w for w in widths], *table):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)))
    print("\nA ratio below 1 is tapeout's build ahead in that round (a shorter time).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", choices=sorted(DEFAULTS), default="tiny-lm")
    parser.add_argument("--prompt", type=int, help="default: 64 (tiny-lm), 128 (llama-40m)")
    parser.add_argument("--new", type=int, help="default: 64 (tiny-lm), 128 (llama-40m)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profiles", help=f"the tapeout rows, comma-separated (default: {','.join(PROFILES)})")
    parser.add_argument(
        "--llamacpp",
        metavar="SRC",
        type=Path,
        help="a Hugging Face sample: add llama.cpp Q4_0 and "
        "Q8_0 rows; SRC is llama.cpp's source tree (its converter; see the docstring)",
    )
    parser.add_argument(
        "--skip-build",
        action="store_true",
        help="reuse the builds under bench/builds/generate (building what is missing)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="then every row but torch's again, interleaved: this many rounds of one fresh process per row (CPU only)",
    )
    parser.add_argument(
        "--cuda",
        action="store_true",
        help="on an NVIDIA GPU: ort-cuda builds (cuda-fp32, cuda-fp16) "
        "against torch eager and torch.compile on the GPU, FP32 and FP16",
    )
    parser.add_argument(
        "--openvino-genai",
        metavar="PYTHON",
        help="a Hugging Face sample: add OpenVINO GenAI rows, run by this "
        "interpreter of an environment with optimum-intel and openvino-genai (see the docstring)",
    )
    args = parser.parse_args()
    args.prompt = args.prompt or DEFAULTS[args.sample][0]
    args.new = args.new or DEFAULTS[args.sample][1]
    from tapeout.core.decoding import CacheLayout
    from tapeout.core.host import cpu_info
    from tapeout.core.host_speed import host_state

    OUT.mkdir(parents=True, exist_ok=True)
    folder = project(args.sample, args.prompt, args.new, args.trials) if not args.skip_build else OUT / args.sample
    rows = []
    chosen = args.profiles.split(",") if args.profiles else PROFILES
    unknown = sorted(set(chosen) - set(PROFILES) - set(CUDA_PROFILES))
    if unknown:
        sys.exit(f"--profiles: unknown {', '.join(unknown)}; choose from {', '.join(PROFILES + CUDA_PROFILES)}")
    for profile in CUDA_PROFILES if args.cuda else chosen:
        kept = OUT / f"{args.sample}-{profile}" / "report.json"
        if args.skip_build and kept.is_file():
            report = json.loads(kept.read_text())
            print(f"measuring {args.sample} for {profile} again (tapeout check) …", file=sys.stderr, flush=True)
            report = {**report, "workload": measured_again(report["build_dir"], args.repeats)}
        else:  # --skip-build builds what is missing
            print(f"building {args.sample} for {profile} …", file=sys.stderr, flush=True)
            report = build(folder, profile, args.repeats)
        rows.append(tapeout_row(report, args.prompt))
    layout = CacheLayout.from_json(report["workload"]["layout"])
    if args.cuda:
        rows += [
            torch_row(folder, args.prompt, args.new, args.trials, args.repeats, "cuda", dtype, mode)
            for mode in ("eager", "compile")
            for dtype in ("float32", "float16")
        ]
    else:
        sys.path.insert(0, str(folder))
        import model as sample  # the sample's own maker: the same config and seed as the builds'

        if hasattr(sample, "directory"):  # a Hugging Face directory: the peers build from it
            hf_dir = sample.directory()
            if args.llamacpp:
                rows += llamacpp_rows(args.llamacpp, hf_dir, args.prompt, args.new, args.trials, args.repeats)
            rows += genai_rows(hf_dir, args.prompt, args.new, args.trials, args.repeats)
            if args.openvino_genai:
                rows += ov_genai_rows(args.openvino_genai, hf_dir, args.prompt, args.new, args.trials, args.repeats)
        rows.append(torch_row(folder, args.prompt, args.new, args.trials, args.repeats))
    state = gpu_copy_bandwidth() if args.cuda else host_state()
    mean_position = args.prompt + args.new / 2
    cpu, flags = cpu_info()
    params = next((r.pop("params") for r in rows if "params" in r), 0)
    for r in rows:
        r.pop("params", None)
    print(
        f"{args.sample} ({params / 1e6:.1f} M parameters), prompt {args.prompt}, {args.new} new tokens, batch 1, 2 threads, "
        f"{args.repeats} fresh processes × {args.trials} generations per row"
    )
    print(f"host: {cpu} ({platform.machine()}), flags: {' '.join(sorted(flags))}")
    if args.cuda:
        print(f"GPU: {state['gpu']}")
    print(
        f"{'device-to-device' if args.cuda else 'host'} copy bandwidth {state['bandwidth_gbs']:.1f} GB/s (range "
        f"{state['bandwidth_gbs_range'][0]:.1f}–{state['bandwidth_gbs_range'][1]:.1f}); times in ms, p50 [95 % bounds]\n"
    )
    header = [
        "build",
        "TTFT p50",
        "TPOT p50",
        "decode tok/s",
        "peak GPU MB (NVML)" if args.cuda else "peak RSS MB",
        "roofline ms",
        "TPOT/roofline",
        "est. TTFT ≥",
        "est. TPOT ≥",
        "perplexity",
        "greedy agreement",
    ]
    table = []
    for r in rows:
        kv = layout.kv_bytes(int(mean_position)) * r.get("kv_scale", 1.0)
        roof = (r["weights_bytes"] + kv) / (state["bandwidth_gbs"] * 1e9) * 1e3
        table.append(
            [
                r["name"],
                r["ttft"],
                r["tpot"],
                f"{r['tok_s']:.0f}",
                "—" if r.get("peak") is None else f"{r['peak']:.0f}",
                f"{roof:.3f}",
                f"{r['tpot_p50'] / roof:.1f}×",
                *("—" if r.get(k) is None else f"{r[k]:.3f}" for k in ("est_ttft", "est_tpot")),
                "—" if r.get("ppl") is None else f"{r['ppl']:.4f}",
                "—" if r.get("agree") is None else f"{r['agree']:.0%}",
            ]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table, strict=True)]
    for line in (header, ["-" * w for w in widths], *table):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)))
    copy = (
        "the GPU's device-to-device copy, read + write counted; at batch 1 a small decoder's step is kernel "
        "launches and the token's trip to the host, not bytes"
        if args.cuda
        else "one thread's numpy copy, read + "
        "write counted: a runtime reading with 2 threads can beat it, so TPOT/roofline below 1× means faster than "
        "that copy, not faster than memory"
    )
    print(
        "\nroofline: the weights a decode step reads at their stored precision (an embedding table only a lookup reads: "
        f"one row) + keys and values at the mean decoded position, over the copy bandwidth above ({copy}). est. TTFT/TPOT: the build's own estimate of its loop "
        "(report.json estimate.generation: each phase's kernels at the roofline of this host, the graph's own bytes, "
        "the cache's copies included; docs/estimator.md). Perplexity "
        "(per byte, held-out text, teacher-forced through the cache) and agreement are the builds' own."
    )
    if args.rounds and not args.cuda:
        interleaved(rows, args.rounds, args.prompt)


if __name__ == "__main__":
    main()
