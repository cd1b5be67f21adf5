"""The fused Triton kernels (targets/kernels/): every kernel against its reference in Triton's interpreter, the
harness refusing kernels that cheat, and the substitution pass deciding from measured timings. Kernels run in
fresh processes (tests/kernel_checks.py, the CLI): the interpreter must be on before triton is imported.
Timing needs a GPU: tests/gpu/test_kernels_gpu.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

HERE = Path(__file__).parent
ENV = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}


def _scenario(name: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(HERE / "kernel_checks.py"), name], capture_output=True, text=True, env=ENV, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _tapeout(*args: str, env=ENV) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tapeout", *args], capture_output=True, text=True, env=env, timeout=900
    )


def test_kernels_verify_in_the_interpreter_float32_and_float16():
    # two kernels here; every kernel in every dtype is the slow test's
    done = _tapeout("kernels", "verify", "add-layernorm", "gemv-int4", "--dtype", "float32,float16", "--json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    found = json.loads(done.stdout)
    assert found["backend"] == "interpreter" and found["failed"] == 0
    kernels = {c["kernel"] for c in found["checks"] if c["ok"]}
    assert kernels == {"add-layernorm", "gemv-int4"} and len(found["checks"]) == 26
    # the model's own shapes and the edge cases both ran; big ones were cut and say from what
    cases = {c["case"] for c in found["checks"] if c["kernel"] == "add-layernorm"}
    assert {"rows=3,width=200", "rows=2,width=1", "rows=1,width=2048"} <= cases
    assert any(c["cut_from"] == "rows=4096,width=384" for c in found["checks"])
    assert "in Triton's interpreter" in done.stderr


@pytest.mark.slow
def test_every_kernel_verifies_in_the_interpreter_and_every_config_of_one():
    configs = _tapeout("kernels", "verify", "silu-mul", "--all-configs", "--dtype", "float32", "--json")
    assert configs.returncode == 0, configs.stdout[-3000:]
    assert len({c["config"] for c in json.loads(configs.stdout)["checks"]}) == 4
    done = _tapeout("kernels", "verify", "--json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    found = json.loads(done.stdout)
    from tapeout.targets import kernels

    assert {c["kernel"] for c in found["checks"] if c["ok"]} == set(kernels.names())
    # what the interpreter cannot verify is said, not passed: attention's bfloat16 tl.dot
    skipped = [c for c in found["checks"] if c["ok"] is None]
    assert skipped and {(c["kernel"], c["dtype"]) for c in skipped} == {("attention", "bfloat16")}
    assert all("interpreter" in c["problem"] for c in skipped)


def test_the_harness_refuses_an_off_by_one_a_write_past_the_end_a_cached_result_and_an_aliased_output():
    found = _scenario("planted")
    # the honest kernel passes the same checks the planted ones fail
    assert all(c["ok"] for c in found["honest"])
    assert all(c["ok"] is False and "unwritten" in c["problem"] and c["unwritten"] > 0 for c in found["off_by_one"])
    # one element past each row: the rows overwrite their neighbour's first element before it is written, and the
    # last row's lands in the guard zone after the output (without the guards: memory the harness does not own)
    assert all(c["ok"] is False and "wrote past the end of output out" in c["problem"] for c in found["past_the_end"])
    assert found["cached"][0]["ok"] is False and "earlier call" in found["cached"][0]["problem"]
    assert all(c["ok"] is False for c in found["cached"])
    assert all(c["ok"] is False and "shares memory with an input" in c["problem"] for c in found["aliased"])


def test_substitution_replaces_only_where_the_kernel_was_faster_and_keeps_the_result():
    found = _scenario("substitution")
    by_kernel = {}
    for d in found["decisions"]:
        by_kernel.setdefault(d["kernel"], []).append(d)
    assert set(by_kernel) == {"rotary", "attention", "add-layernorm", "bias-gelu", "add-rmsnorm", "silu-mul"}
    assert len(by_kernel["rotary"]) == 2  # q and k
    # silu·mul measured slower than Inductor's code: kept, with both timings in the reason
    (silu,) = by_kernel["silu-mul"]
    assert not silu["substituted"] and "slower than Inductor" in silu["reason"] and "1.0000 vs 0.5000" in silu["reason"]
    assert found["replaced"] == 6 and all(d["substituted"] for d in found["decisions"] if d["kernel"] != "silu-mul")
    assert found["ops"].count("tapeout.rotary.default") == 2 and "tapeout.silu_mul.default" not in found["ops"]
    # each call launches with the config that was timed (here the last of its tuning space), not the default
    launched = {
        op.removeprefix("tapeout.").removesuffix(".default").replace("_", "-"): config
        for op, config in found["launched"]
    }
    assert launched == {k: v for k, v in found["tuned"].items() if k != "silu-mul"}
    assert all(d["config"] == found["tuned"][d["kernel"]] for d in found["decisions"])
    assert found["sdpa_left"] == 0
    # the rewritten program, its kernels run in the interpreter, computes what the model does
    assert found["max_abs"] < 1e-4
    # a program for the CPU keeps Inductor's code everywhere, and says why
    assert found["cpu"] and not any(d["substituted"] for d in found["cpu"])
    assert all("CUDA GPUs" in d["reason"] for d in found["cpu"])


def test_decisions_without_a_timing_keep_inductor_and_say_how_to_measure():
    pytest.importorskip("torch")
    from tapeout.targets.kernels import substitute, timings
    from tapeout.targets.kernels.base import Case, Match

    matches = [
        Match("add-layernorm", [], (), Case.of(rows=128, width=384), "float16"),
        Match("attention", [], (), Case.of(batch=1, heads=12, seq=128, dim=32), "float16"),
        Match("bias-gelu", [], (), Case.of(rows=128, width=1536), "float16"),
        Match("silu-mul", [], (), Case.of(rows=1, width=5632), "float16"),
        Match("add-layernorm", [], (), Case.of(rows=1, width=2048), "float16"),
        Match("add-layernorm", [], (), Case.of(rows=256, width=512), "float16"),
    ]
    block = "BLOCK=1024,warps=4,stages=2"
    table = {
        timings.entry_key("attention", "batch=1,heads=12,seq=128,dim=32", "float16"): timings.Timing(
            config="BLOCK_M=64,BLOCK_N=64,warps=4,stages=2",
            kernel_ms=0.02,
            kernel_p90_ms=0.03,
            inductor_ms=None,
            calls=50,
        ),
        timings.entry_key("bias-gelu", "rows=128,width=1536", "float16"): timings.Timing(
            config=block, kernel_ms=0.004, kernel_p90_ms=0.005, inductor_ms=0.004, calls=50
        ),
        # faster, but timed with a config this kernel no longer has (a timings file from an older tapeout)
        timings.entry_key("silu-mul", "rows=1,width=5632", "float16"): timings.Timing(
            config="BLOCK=512,warps=4,stages=2", kernel_ms=0.002, kernel_p90_ms=0.003, inductor_ms=0.004, calls=50
        ),
        # H100 figures: faster at the median, but its p90 is above Inductor's p50 (noise at 5 µs) ...
        timings.entry_key("add-layernorm", "rows=1,width=2048", "float16"): timings.Timing(
            config="warps=4,stages=2", kernel_ms=0.0048, kernel_p90_ms=0.0057, inductor_ms=0.0049, calls=100
        ),
        # ... and faster beyond its spread
        timings.entry_key("add-layernorm", "rows=256,width=512", "float16"): timings.Timing(
            config="warps=4,stages=2", kernel_ms=0.0040, kernel_p90_ms=0.0045, inductor_ms=0.0049, calls=100
        ),
    }
    first, second, third, fourth, fifth, sixth = substitute.decide(matches, table, "H100")
    assert not first.substituted and "tapeout kernels bench add-layernorm" in first.reason
    assert not second.substituted and "not timed" in second.reason
    assert not third.substituted and "slower than Inductor" in third.reason  # a tie is not a win
    assert (
        not fourth.substituted and "'BLOCK=512,warps=4,stages=2'" in fourth.reason and "does not have" in fourth.reason
    )
    assert not fifth.substituted and "within its own spread" in fifth.reason and "p90 0.0057" in fifth.reason
    assert sixth.substituted and "1.22× faster" in sixth.reason and sixth.config == "warps=4,stages=2"


def test_bench_without_a_gpu_is_one_line_exit_4():
    done = _tapeout("kernels", "bench", "silu-mul")
    assert done.returncode == 4, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "needs an NVIDIA GPU" in done.stderr
    assert "tapeout kernels verify" in done.stderr


def test_bad_names_and_dtypes_are_one_line_exit_2():
    for args, words in (
        (("kernels", "verify", "layernorm"), "unknown kernel 'layernorm'"),
        (("kernels", "verify", "silu-mul", "--dtype", "fp8"), "unknown dtype 'fp8'"),
    ):
        done = _tapeout(*args)
        assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_malformed_timings_file_is_one_line(tmp_path):
    from tapeout.core.errors import BadInput
    from tapeout.targets.kernels import timings

    key = timings.device_key("NVIDIA H100 80GB HBM3", (9, 0), "3.9.0", "2.13.0")
    saved = timings.save(
        key,
        {
            "silu-mul | rows=1,width=5632 | float16": timings.Timing(
                config="BLOCK=1024,warps=4,stages=2", kernel_ms=0.003, kernel_p90_ms=0.004, inductor_ms=0.005, calls=100
            )
        },
        tmp_path,
    )
    assert timings.load(key, tmp_path)["silu-mul | rows=1,width=5632 | float16"].inductor_ms == 0.005
    # another GPU or toolchain never reads these timings
    assert timings.load(timings.device_key("NVIDIA H200", (9, 0), "3.9.0", "2.13.0"), tmp_path) == {}
    for body in (
        "{not json",
        "[" * 100_000 + "]" * 100_000,
        json.dumps({"schema": "tapeout.kernel-timings/1", "device": key, "entries": {"x": {"config": 1}}}),
    ):
        saved.write_text(body)
        with pytest.raises(BadInput, match="malformed") as caught:
            timings.load(key, tmp_path)
        assert "\n" not in str(caught.value)


def test_kernels_list_names_every_kernel_and_what_it_replaces():
    done = _tapeout("kernels", "list", "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    from tapeout.targets import kernels

    assert found["available"] and [k["kernel"] for k in found["kernels"]] == kernels.names()
    assert all(k["replaces"] and k["dtypes"] for k in found["kernels"])


@pytest.mark.slow  # MiniLM's real weights through the interpreter, substituted whole
def test_the_samples_chains_match_and_minilm_substituted_whole_keeps_its_output():
    found = _scenario("samples")
    from collections import Counter

    # MiniLM (real weights): per layer two residual add + LayerNorms, attention (the eager BERT path: matmul, scale,
    # mask, softmax, matmul), bias + GELU; the embeddings' LayerNorm follows a broadcast add and is left
    assert Counter(found["minilm"]["matches"]) == {
        "add-layernorm float32": 12,
        "attention float32": 6,
        "bias-gelu float32": 6,
    }
    assert found["minilm"]["replaced"] == 24 and found["minilm"]["left"] == ["aten.layer_norm.default"]
    assert found["minilm"]["max_abs"] < 1e-4
    # llama-40m: rotary on q and k, Llama's decomposed RMSNorm after each residual add, eager attention, silu·mul
    assert Counter(found["llama-40m"]["matches"]) == {
        "rotary float32": 16,
        "add-rmsnorm float32": 16,
        "attention float32": 8,
        "silu-mul float32": 8,
    }
    # priced at the project's dims (MiniLM batch 1), not the batch-2 example the dynamic program was traced with,
    # and every such shape is one `tapeout kernels bench` times: a bench on a GPU covers the samples' decisions
    assert "add-layernorm rows=128,width=384" in found["minilm"]["cases"]
    assert "add-layernorm rows=256,width=384" in found["minilm"]["traced_at"]
    from tapeout.targets import kernels

    timed = {f"{name} {case.key}" for name in kernels.names() for case in kernels.get(name).bench_cases()}
    for sample in ("minilm", "llama-40m"):
        assert set(found[sample]["cases"]) <= timed, set(found[sample]["cases"]) - timed


def test_aoti_cuda_substitutes_from_the_gpus_timings_at_the_projects_shapes():
    """What aoti-cuda's package compile runs on the device (targets/aoti_cuda.substitute_kernels), here on a stand-in
    timings file: untimed, Inductor's code stays and the decision says how to time it; timed faster beyond its
    spread, the chain becomes the kernel's op; the chain is priced at the recorded dims (batch 4 × 128 rows), not at
    the traced example (2 × 128); a new timings file changes the package's cache key."""
    found = _scenario("aoti_cuda")
    untimed, timed = found["untimed"], found["timed"]
    assert untimed["substituted"] == 0 and "`tapeout kernels bench add-layernorm`" in untimed["decisions"][0]["reason"]
    assert timed["substituted"] == 1 and timed["decisions"][0]["config"] and timed["timings"].startswith("1 timed")
    assert found["case"] == "rows=512,width=384" and found["ops"] == ["tapeout.add_layernorm.default"]
    assert found["digest_before"] == "none" and len(found["digest_after"]) == 64
