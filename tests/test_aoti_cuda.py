"""The `aoti-cuda` target on a host without a GPU, our side of the contract: an FP32 build writes the program (opened
without unpickling), io.json and the engine settings, runs its ONNX twin for parity only, and leaves the package to
the device (`check` here exits 4 in one line); a BF16 build, whose candidates only the GPU can score, is refused
before any work; the gpu-inductor rule plans BF16 without asking the host CPU; the kernel profile's grouping.
tests/gpu/test_aoti_cuda_gpu.py compiles and runs the packages on a real GPU."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import SAMPLES, run_cli
from tapeout import targets
from tapeout.core import pt2
from tapeout.core.capabilities import Capabilities
from tapeout.core.errors import BadInput
from tapeout.quantize import rule_tables, rules
from tapeout.targets import engine_cache
from tapeout.targets.aoti_cuda import gpu_kernel_profile

PROBE = targets.target_class("aoti-cuda").probe()
no_gpu = pytest.mark.skipif(PROBE.available, reason="a CUDA GPU is here: tests/gpu/test_aoti_cuda_gpu.py covers it")


@no_gpu
def test_fp32_build_writes_the_program_and_leaves_the_package_to_the_device(tmp_path):
    out = tmp_path / "b"
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", "aoti-cuda-fp32", "--out", out, "--json")
    assert result.code == 0, result.err
    report = result.json()
    assert report["artifact"]["main_file"] == "program.pt2"
    assert sorted(p.name for p in (out / "artifact").iterdir()) == ["engine-settings.json", "io.json", "program.pt2"]
    settings = json.loads((out / "artifact" / "engine-settings.json").read_text())
    assert settings == {
        "freezing": True,
        "max_autotune": False,
        "precision": "fp32",
        "kernels": True,
        "built_with_torch": settings["built_with_torch"],
        "dims": {"batch": 1},
        "input_shapes": [["batch", 1, 8, 8]],
    }  # what the substitution pass prices chains at
    assert report["engine"] is None and "sees no CUDA GPU" in report["target"]["emulated"]
    assert pt2.pickled_entries(out / "artifact" / "program.pt2") == []
    pt2.load(out / "artifact" / "program.pt2")  # the device opens it the same way: never unpickled
    verdicts = {b["budget"]: b["verdict"] for b in report["budgets"]}
    assert verdicts["parity_min_cosine"] == "pass"  # the ONNX twin on ORT's CPU EP: parity only, no timing judged
    assert not (out / "engines").exists()

    check = run_cli("check", out)
    assert check.code == 4 and len(check.err.strip().splitlines()) == 1, check.err
    assert "aoti-cuda" in check.err and "no CUDA GPU" in check.err


@no_gpu
def test_bf16_build_is_refused_before_any_work_without_a_gpu(tmp_path):
    out = tmp_path / "b"
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", "aoti-cuda-bf16", "--out", out)
    assert result.code == 4 and len(result.err.strip().splitlines()) == 1, result.err
    assert "candidates are compiled and scored on the device" in result.err and "fp32" in result.err
    assert not out.exists()


@dataclasses.dataclass(frozen=True)
class _Draft:
    groups: tuple = ()
    notes: tuple = ()


def test_gpu_inductor_rule_plans_bf16_without_asking_the_host_cpu(monkeypatch):
    from tapeout.quantize.methods import bf16_program

    rule = rule_tables.RULE_SETS["gpu-inductor"][("cnn", "bf16")]
    assert rule.method == "program-bf16" and rule.options == {"device": "cuda"}
    no_bf16 = rules.InstructionSet("x86_64", frozenset({"avx2"}), "a host without BF16")
    monkeypatch.setattr(bf16_program, "with_modules", lambda draft, analysis: ("planned",))
    planned = bf16_program.ProgramBf16().plan(_Draft(), rule, None, None, no_bf16)
    assert planned.groups == ("planned",) and "tensor cores" in planned.notes[0]
    # the CPU rule set still refuses the same host: there oneDNN would emulate BF16 through FP32
    with pytest.raises(BadInput, match="BF16 arithmetic"):
        bf16_program.ProgramBf16().plan(
            _Draft(), rule_tables.RULE_SETS["x86-inductor"][("cnn", "bf16")], None, None, no_bf16
        )


def test_capabilities_name_the_gpu_inductor_rules_and_the_device_compile():
    caps: Capabilities = targets.TARGETS["aoti-cuda"].capabilities
    assert caps.rules == "gpu-inductor" and caps.compile_on == "device" and caps.compiles_from == "torch.export"
    assert caps.timing_sync == "device" and set(caps.precisions) == {"fp32", "bf16"}


def test_a_changed_program_is_named_as_why_the_package_is_compiled_again(tmp_path):
    key = {
        "gpu": "NVIDIA H100",
        "compute_capability": "9.0",
        "toolchain": "torch 2.11",
        "driver": "CUDA 13.0",
        "program_sha256": "a" * 64,
        "settings_sha256": "b" * 64,
    }
    entry = engine_cache.entry(tmp_path / "artifact", key, ".pt2")
    engine_cache.store(entry, b"package", key, seconds=1.0)
    assert engine_cache.cached(entry) is not None
    why = engine_cache.why_build(entry.engine.parent, {**key, "program_sha256": "c" * 64})
    assert why == f"the cached engine was built for another program {'a' * 12} → {'c' * 12}"
    entry.engine.write_bytes(b"changed")  # a package is native code: changed bytes are never loaded
    assert engine_cache.cached(entry) is None


def test_gpu_kernel_profile_keeps_one_row_per_call_site_and_types_inductor_kernels():
    spans = [
        (name, run, us)
        for run in range(3)
        for name, us in (
            ("triton_per_fused_native_layer_norm_3", 4.0 + run),
            ("sm90_xmma_gemm_bf16bf16<128,64>(params)", 10.0),
            ("triton_per_fused_native_layer_norm_3", 5.0),
            ("triton_poi_fused_gelu_7", 2.0),
        )
    ]
    profile = gpu_kernel_profile(spans, [30.0, 31.0, 90.0], "torch profiler (CUDA)")
    rows = {op.node: op for op in profile.ops}
    assert list(rows) == [
        "triton_per_fused_native_layer_norm_3 #1",
        "sm90_xmma_gemm_bf16bf16<128,64>(params) #1",
        "triton_per_fused_native_layer_norm_3 #2",
        "triton_poi_fused_gelu_7 #1",
    ]
    first = rows["triton_per_fused_native_layer_norm_3 #1"]
    assert first.op_type == "triton_per_fused_native_layer_norm" and first.provider == "Inductor Triton"
    assert first.calls == 3 and first.total_us == pytest.approx(5.0 * 3)  # the median call, times the runs
    gemm = rows["sm90_xmma_gemm_bf16bf16<128,64>(params) #1"]
    assert gemm.op_type == "sm90_xmma_gemm_bf16bf16" and gemm.provider == "cuBLAS/cuDNN/ATen"
    assert profile.runs == 3 and profile.run_total_us == pytest.approx(31.0 * 3)


def test_report_lists_every_fused_kernel_decision_with_both_timings():
    from tapeout.reports.build_sections import engine_section

    decision = {
        "kernel": "add-layernorm",
        "where": "add → layer_norm",
        "case": "rows=128,width=384",
        "dtype": "float16",
        "config": "warps=4,stages=2",
    }
    engine = {
        "action": "built",
        "reason": "no engine cached in this build dir yet",
        "file": "engines/x.pt2",
        "seconds": 42.0,
        "layers": [],
        "key": {"gpu": "NVIDIA H200", "program_sha256": "a" * 64, "kernel_timings": "none"},
        "summary": {
            "fused_kernels": {
                "gpu": "NVIDIA H200 | sm90",
                "timings": "1 timed kernel case(s)",
                "substituted": 1,
                "decisions": [
                    {
                        **decision,
                        "substituted": True,
                        "kernel_ms": 0.0041,
                        "inductor_ms": 0.0062,
                        "reason": "1.51× faster",
                    },
                    {
                        **decision,
                        "case": "rows=4096,width=384",
                        "substituted": False,
                        "kernel_ms": 0.0097,
                        "inductor_ms": 0.0089,
                        "reason": "slower than Inductor's code",
                    },
                ],
            }
        },
    }
    text = "\n".join(engine_section(engine))
    assert "Fused kernels: 1 of 2 chains substituted (1 timed kernel case(s))" in text
    assert (
        "| add-layernorm | add → layer_norm | rows=128,width=384 | float16 | 0.0041 | 0.0062 | yes | 1.51× faster |"
        in text
    )
    assert "| 0.0097 | 0.0089 | no | slower than Inductor's code |" in text
    assert "program aaaaaaaaaaaa" in text and "a" * 13 not in text  # hashes shortened in the key line


def test_the_device_compile_names_its_wrapper_compiler_or_says_in_one_line_that_there_is_none(monkeypatch):
    """Our side of the device compile's first step, here: the package's wrapper is built by the compiler
    `cxx_compiler` chooses (tests/test_cxx_compiler.py: one linking libstdc++ statically is passed over), and with
    none the engine step stops with one line naming what to install."""
    from tapeout.core.errors import TargetUnavailable
    from tapeout.targets import aoti_cuda, cxx_compiler

    chosen = aoti_cuda._wrapper_compiler()
    assert chosen.path and chosen.inductor_configs() == {"cpp.cxx": (chosen.path,)}
    monkeypatch.setattr(cxx_compiler, "choose", lambda: None)
    with pytest.raises(TargetUnavailable) as refused:
        aoti_cuda._wrapper_compiler()
    assert (
        "needs a C++ compiler on the device" in str(refused.value)
        and refused.value.fix == "apt install g++ on the device"
    )
