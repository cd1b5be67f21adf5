"""AOTInductor: the torch.export program compiled ahead of time by Inductor into a `.pt2` package, on the CPU.

compile = `torch._inductor.aoti_compile_and_package(program)`: Inductor fuses the graph into generated C++ kernels
(OpenMP loops, vectorised for the compiling CPU's ISA) around oneDNN/MKL GEMMs, and the system C++ compiler builds
them into a shared library inside the package. The session loads it with `aoti_load_package` and calls it with
torch tensors: the device side needs torch (the same version: a package is tied to the torch that made it) and no
compiler. The program keeps the project's symbolic dims dynamic.

The op profile needs a second package. Inductor names and times its kernels in torch's profiler only where it compiled
a RecordFunction around each call (`cpp.enable_kernel_profile`), which costs time on every call with the profiler off
(measured here: +138 µs a call on 100 kernel calls, 1.4 µs each, 22 % of a small MLP's 620 µs). So the package that is
timed and shipped is compiled without it, and the build compiles the program once more with it into
`artifact/profiling/` (the package kept only: never for the sensitivity loop's candidates), which only the op profile
loads: hashed and verified with the artifact, not counted in its size, not deployed.

A package holds compiled native code: loading one runs it. Like an engine, it is only ever loaded from a build dir
whose files match their manifest hashes (`check` verifies them first); never load a package from elsewhere.
"""

from __future__ import annotations

import functools
import json
import platform
import re
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tapeout.core.artifact import Artifact
from tapeout.core.errors import BadInput, TapeoutError, TargetUnavailable, first_line, runtime_detail
from tapeout.core.schemas import InputSpec
from tapeout.targets import cxx_compiler
from tapeout.targets.base import PROFILING_DIR, OpProfile, OpTime, Probe, Target
from tapeout.targets.native_output import quieted
from tapeout.targets.program_io import ProgramSession, write_io

ARTIFACT_FILE = "model.pt2"
ISA_FILE = "vec_isa.json"  # the vector ISA the kernels were generated for: checked before loading
INSTALL = (
    "pip install torch (on the host a C++ compiler too: apt install g++, or set CXX); the device needs the "
    "same torch version, no compiler"
)


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    threads: int = Field(0, ge=0, le=4096, description="torch's intra-op threads (OpenMP); 0 = one per physical core")
    freezing: bool = Field(
        True,
        description="Inductor's freezing: the weights folded into the package as constants, "
        "Linear layers and convs on oneDNN's prepacked kernels; INT8 needs it (measured here: "
        "MiniLM FP32 21 % faster with it, a 0.13 ms CNN 50 % slower: a cost per call)",
    )
    op_profile_package: bool = Field(
        True,
        description="compile the program a second time with a RecordFunction around "
        "each kernel, into artifact/profiling/, for the op profile (the shipped package "
        "stays without: 1.4 µs a kernel call here); false: one compile, no op profile",
    )


def torch_with_aoti(install: str):
    """(torch, None) where torch imports and has AOTInductor packages, else (None, the Probe saying why): the
    first checks of both AOTInductor targets' probes."""
    try:
        import torch
    except ImportError as exc:
        return None, Probe(False, reason=f"torch cannot be imported ({exc})", install_hint=install)
    if not hasattr(torch._inductor, "aoti_load_package"):
        return None, Probe(
            False,
            torch.__version__,
            install_hint="pip install 'torch>=2.6'",
            reason=f"torch {torch.__version__} has no AOTInductor packages (torch >= 2.6)",
        )
    return torch, None


class AotiSession(ProgramSession):
    """The package's compiled model, called under inference mode."""

    def __init__(self, artifact: Artifact, threads: int, package: Path | None = None):
        import torch

        super().__init__(artifact)
        self._torch = torch
        if not threads:
            import psutil

            threads = psutil.cpu_count(logical=False) or 1
        torch.set_num_threads(threads)
        _require_isa(artifact.directory)
        with quieted():
            self._model = load_package(torch, package or artifact.path)

    def _call(self, tensors: list):
        with self._torch.inference_mode():
            return self._model(*tensors)

    def bind(self, feeds: dict[str, np.ndarray]):
        return functools.partial(self._call, self._tensors(feeds))


class Aoti(Target):
    Options = Options

    def __init__(self, name, capabilities, options):
        super().__init__(name, capabilities, options)
        if not options.op_profile_package:  # no instrumented package: nothing can name Inductor's kernels
            self.capabilities = replace(capabilities, op_profiler=None)

    @classmethod
    def probe(cls) -> Probe:
        torch, missing = torch_with_aoti(INSTALL)
        if missing:
            return missing
        return Probe(True, torch.__version__, details={"cxx": cxx_compiler.inductor_default()})

    def compile_program(
        self, program, out_dir: Path, inputs: list[InputSpec], dims: dict[str, int], output_names: list[str]
    ) -> Artifact:
        """Compile and package with Inductor (the C++ compiler runs here), and write the input/output names."""
        import torch

        cxx = cxx_compiler.choose()
        if cxx is None:
            raise BadInput(
                "AOTInductor needs a C++ compiler on the building host and none was found (g++, clang++, c++ or $CXX)",
                fix="install one (apt install g++) or set CXX; the device needs none",
            )
        quantized = _quantized_ops(program)
        if quantized and not self.options.freezing:
            raise BadInput(
                "an INT8 program on aoti needs Inductor's freezing, and the profile turns it off: without "
                "it the quantized layers compile to dequantize + float GEMM",
                fix='drop [options] freezing = false, or use precision = "fp32"',
            )
        out_dir.mkdir(parents=True, exist_ok=True)
        self._package(program, out_dir / ARTIFACT_FILE, cxx, kernel_profile=False)
        kernels = integer_kernels(out_dir / ARTIFACT_FILE)
        if quantized and not sum(kernels.values()):
            raise BadInput(
                f"Inductor compiled the INT8 program ({quantized} quantize/dequantize ops) without one "
                "integer kernel: its convolutions and Linear layers would dequantize and run in float, "
                "slower than FP32",
                fix='use precision = "fp32" for aoti with this torch, or report it with `tapeout --debug …`\'s output',
            )
        write_io(out_dir, inputs, output_names, None)
        isa = _vec_isa()
        (out_dir / ISA_FILE).write_text(json.dumps({"vec_isa": isa}))
        return Artifact(
            self.name,
            out_dir,
            ARTIFACT_FILE,
            meta={
                "vec_isa": isa,
                "compiler": f"Inductor (torch {torch.__version__}) → C++ built by {cxx.describe()}",
                "compiled_for": f"{platform.machine()} CPUs with {isa} (Inductor vectorises for the building CPU's ISA; "
                "a CPU without it refuses the package at load)",
                "dynamic_dims": sorted({d for s in inputs for d in s.shape if isinstance(d, str)}),
                "loads_with": f"torch {torch.__version__} (torch._inductor.aoti_load_package); a package is tied to it",
                "freezing": self.options.freezing,
                **({"integer_kernels": kernels} if quantized else {}),
            },
        )

    def instrument(self, program, artifact: Artifact) -> Artifact:
        """The op profile's package: the program compiled again with a RecordFunction around every kernel call."""
        if not self.options.op_profile_package:
            return artifact
        self._package(
            program, artifact.directory / PROFILING_DIR / ARTIFACT_FILE, cxx_compiler.choose(), kernel_profile=True
        )
        return replace(
            artifact,
            meta={
                **artifact.meta,
                "op_profile_package": f"{PROFILING_DIR}/{ARTIFACT_FILE}: "
                "the same program with a RecordFunction around each kernel, loaded only for "
                "the op profile (not deployed)",
            },
        )

    def _package(self, program, path: Path, cxx: cxx_compiler.Compiler, kernel_profile: bool) -> None:
        import torch

        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # freezing folds the weights into the package as constants, which lets Inductor hand Linear layers to
            # oneDNN's packed GEMMs and lower PT2E's quantize/dequantize patterns to integer kernels; without it (or
            # outside no_grad) an INT8 program compiles to dequantize + float GEMM (pytorch/ao#4566)
            with quieted(), torch.no_grad():
                torch._inductor.aoti_compile_and_package(
                    program,
                    package_path=str(path),
                    inductor_configs={
                        "freezing": self.options.freezing,
                        "cpp.enable_kernel_profile": kernel_profile,
                        **cxx.inductor_configs(),
                    },
                )
        except TapeoutError:
            raise
        except Exception as exc:
            raise BadInput(
                f"AOTInductor could not compile the program: {first_line(exc)}",
                detail=runtime_detail(exc),
                fix="`tapeout --debug …` prints Inductor's whole message; or use a target that takes "
                "ONNX (`tapeout targets`)",
            ) from None

    def op_profile(
        self, artifact: Artifact, feeds: dict[str, np.ndarray], iterations: int, pace_s: float | None = None
    ) -> OpProfile:
        """A separate pass of the instrumented package under torch's profiler: every kernel Inductor generated
        ("cpp_fused_gelu_view_1") and every call out to oneDNN or ATen ("aoti_torch_cpu__linear_pointwise"), timed
        per run (the median call, times the runs)."""
        from torch.profiler import ProfilerActivity, profile, record_function

        package = artifact.directory / PROFILING_DIR / ARTIFACT_FILE
        if not package.is_file():
            raise BadInput(
                f"this aoti build has no op-profiling package ({package} is missing)",
                fix="rebuild with [options] op_profile_package = true, or set [check] op_profile = false",
            )
        call = AotiSession(artifact, self.options.threads, package=package).bind(feeds)
        for _ in range(3):
            call()
        walls = []
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(iterations):
                with record_function(_RUN):
                    start = time.perf_counter()
                    call()
                    walls.append((time.perf_counter() - start) * 1e6)
        spans = [
            (e.name, e.cpu_parent.id, e.time_range.elapsed_us())
            for e in prof.events()
            if e.cpu_parent is not None and e.cpu_parent.name == _RUN
        ]
        return kernel_profile(spans, walls, self.capabilities.op_profiler or "torch profiler")

    def session(self, artifact: Artifact) -> AotiSession:
        try:
            return AotiSession(artifact, self.options.threads)
        except TapeoutError:
            raise
        except Exception as exc:  # another torch version, another CPU's ISA, a truncated package
            raise BadInput(
                f"torch could not load the AOTInductor package {artifact.path}: {first_line(exc)}",
                detail=runtime_detail(exc),
                fix="rebuild with the torch version the device runs",
            ) from None


_RUN = "tapeout.run"  # the profiler range around one call: the kernels are the records directly inside it
_GRAPH_PREFIX = re.compile(r"^graph_\d+_")


def kernel_profile(spans: list[tuple[str, int, float]], walls: list[float], method: str) -> OpProfile:
    """Kernel records `(name, run, µs)` directly inside each profiled call as an OpProfile: one row per kernel call
    site in a run (a kernel Inductor reuses, or a oneDNN call made per layer, is one row per call: "… #2"), its
    median call times the runs, so one stalled call does not stand for every run; the run total likewise."""
    runs: dict[int, Counter] = {}
    times: dict[str, list[float]] = {}
    order: list[str] = []
    for name, run, us in spans:
        name = _GRAPH_PREFIX.sub("", name)
        seen = runs.setdefault(run, Counter())
        seen[name] += 1
        node = f"{name} #{seen[name]}"
        if node not in times:
            order.append(node)
        times.setdefault(node, []).append(us)
    ops = []
    for node in order:
        name = node.rsplit(" #", 1)[0]
        extern = name.startswith("aoti_torch_")
        # a generated kernel's name ends in its index in the program ("cpp_fused_gelu_view_1"): its type is the rest
        op_type = name if extern else re.sub(r"_\d+$", "", name)
        ops.append(
            OpTime(
                node=node,
                op_type=op_type,
                provider="oneDNN/ATen" if extern else "Inductor C++",
                calls=len(times[node]),
                total_us=float(np.median(times[node])) * len(times[node]),
                precision="int8" if re.search(r"_q(linear|conv)", name) else "",
            )
        )
    total = float(np.median(walls)) * len(walls) if walls else 0.0
    return OpProfile(runs=len(walls), run_total_us=total, ops=ops, method=method)


def _quantized_ops(program) -> int:
    """How many PT2E quantize/dequantize ops the program holds (0: a float program)."""
    return sum(
        1 for n in program.graph.nodes if n.op == "call_function" and str(n.target).startswith("quantized_decomposed.")
    )


def integer_kernels(package: Path) -> dict[str, int]:
    """The oneDNN integer kernels the package's generated code calls, by kind: what Inductor really lowered the
    quantized convolutions and Linear layers to (our own just-written package, read as text)."""
    import zipfile

    calls = {"qconv": 0, "qlinear": 0}
    with zipfile.ZipFile(package) as archive:
        for name in archive.namelist():
            if name.endswith("wrapper.cpp"):
                for kind in re.findall(
                    r"aoti_torch_cpu__(qconv|qlinear)\w*\(", archive.read(name).decode("utf-8", "replace")
                ):
                    calls[kind] += 1
    return calls


def load_package(torch, path: Path, device_index: int = -1):
    """The package's compiled model, loaded as `aoti_load_package` loads it less the CPU-ISA comparison before it.

    That comparison only warns, and to make it Inductor proves each vector ISA cold: a C++ compile and a child Python
    that dlopens it, per ISA. On torch 2.11 the child imports torch: ~50 s of every fresh process on the H200 machine,
    most of a three-process measurement. The loader itself (`AOTIModelPackageLoader`, wrapped as torch wraps it) is
    the same; the `aoti` target refuses a package for an ISA the CPU lacks first (`_require_isa`)."""
    from torch._inductor.package import AOTICompiledModel

    try:
        loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, device_index)
    except (AttributeError, TypeError):  # a torch whose loader differs: its own public call, probe and all
        return torch._inductor.aoti_load_package(str(path), device_index=device_index)
    return AOTICompiledModel(loader)


def _vec_isa() -> str:
    """The vector ISA Inductor generates code for on this CPU ("avx512 avx512_vnni", "avx2", "neon", "" = scalar)."""
    from torch._inductor import cpu_vec_isa

    return str(cpu_vec_isa.pick_vec_isa())


def _require_isa(directory: Path) -> None:
    """A package built for AVX-512 dies of an illegal instruction on an AVX2-only CPU: refuse it first, exit 4."""
    from torch._inductor import cpu_vec_isa

    try:
        built = json.loads((directory / ISA_FILE).read_text())["vec_isa"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInput(
            f"{directory / ISA_FILE} is missing or malformed ({exc})",
            fix="copy the build dir to the device as built, or rebuild",
        ) from None
    here = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]
    if built and built not in here:
        raise TargetUnavailable(
            f"the AOTInductor package was compiled for {built}, which this CPU lacks (it has: "
            f"{', '.join(here) or 'no vector ISA Inductor uses'})",
            fix="build on a machine of the device's CPU class (or on the device)",
        )
