"""AOTInductor on NVIDIA GPUs: the torch.export program compiled by Inductor into a `.pt2` package of Triton kernels
(cubins) and calls to cuBLAS/cuDNN, built on the device at the first `check` and cached like a TensorRT engine.

Why on the device: a package holds cubins for one compute capability, autotuned (where asked) on one GPU, and
loads only in the torch that built it. So the build dir carries the program (`program.pt2`, FP32 or with the
precision step's BF16 casts in it) and `engine-settings.json`; `build_engine` compiles it on the GPU it runs on,
into `engines/`, keyed by GPU, compute capability, torch/Triton/CUDA versions, driver, program hash and settings.
A build on a host with a CUDA GPU compiles it at build time, the same way. Before Inductor compiles, the fused-kernel
substitution pass (`targets/kernels/substitute.py`) replaces a chain only where that GPU's kernel timings file says
the kernel beat Inductor's code; every decision goes to the engine record (`[options] kernels`).

The program is opened with `tapeout.core.pt2.load`, which never unpickles; the package is native code and GPU code,
loaded only when its bytes match the record tapeout wrote (`engine_cache`), from a build dir `check` verified first.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tapeout.core.artifact import Artifact
from tapeout.core.errors import BadInput, TapeoutError, TargetUnavailable, first_line, runtime_detail
from tapeout.core.schemas import InputSpec
from tapeout.targets import cxx_compiler
from tapeout.targets.aoti import load_package
from tapeout.targets.base import EngineBuild, OpProfile, OpTime, Probe, Target
from tapeout.targets.native_output import quieted
from tapeout.targets.program_io import ProgramSession, write_io

ARTIFACT_FILE = "program.pt2"
INSTALL = (
    "on the device: torch with CUDA (pip install torch; its CUDA wheels bring Triton) and a C++ compiler "
    "(Inductor builds the package's wrapper there: apt install g++); the NVIDIA driver"
)


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    device_id: int = Field(0, ge=0, le=64, description="which CUDA GPU (after CUDA_VISIBLE_DEVICES)")
    freezing: bool = Field(
        True,
        description="Inductor's freezing: weights folded into the package as constants, "
        "so constant subgraphs fold and weight layouts are chosen once",
    )
    max_autotune: bool = Field(
        False,
        description="Inductor's max-autotune: GEMM and kernel configs benchmarked on "
        "the device while the package is compiled (minutes more, once per cache key)",
    )
    kernels: bool = Field(
        True,
        description="substitute tapeout's fused Triton kernels (`tapeout kernels`) for the "
        "chains they replace, only where `tapeout kernels bench` measured them faster than "
        "Inductor's code on this GPU; every decision goes to the engine record. false: Inductor's "
        "code everywhere",
    )


class EngineSettings(BaseModel):
    """What the device needs to compile the package, beside the program: written at build, read at check."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    freezing: bool
    max_autotune: bool
    precision: str
    built_with_torch: str
    kernels: bool = True
    # the inputs' shapes with the project's dim names, and the dims' values: the substitution pass prices a dynamic
    # program's chains at the project's shapes, as `tapeout kernels bench` timed them
    input_shapes: list[list[int | str]] = []
    dims: dict[str, int] = {}


class AotiCudaSession(ProgramSession):
    """The package's compiled model on one GPU: inputs copied to the device, a device sync per call."""

    def __init__(self, artifact: Artifact, package: Path, device_id: int):
        import torch

        super().__init__(artifact)
        self._torch, self._device = torch, torch.device("cuda", device_id)
        torch.cuda.set_device(self._device)
        torch.empty(1, device=self._device)  # the primary context made current before the package's code loads
        # Not quieted: a package that cannot load says why on stderr (on the H200, packages built by a compiler that
        # linked libstdc++ statically crashed in this call: `cxx_compiler` now chooses the compiler).
        self._model = load_package(torch, package, device_index=device_id)

    def _tensors(self, feeds: dict[str, np.ndarray]) -> list:
        return [t.to(self._device) for t in super()._tensors(feeds)]

    def _call(self, tensors: list):
        with self._torch.inference_mode():
            out = self._model(*tensors)
        outs = out if isinstance(out, tuple | list) else (out,)
        return tuple(t.cpu() for t in outs)  # .cpu() waits for the GPU: the outputs are the run's end

    def bind(self, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
        """Inputs resident on the GPU, the outputs left there: the timed call is the package's run alone; the
        timing's device sync (`synchronize`) ends it."""
        tensors, model, torch = self._tensors(feeds), self._model, self._torch

        def call():
            with torch.inference_mode():
                return model(*tensors)

        return call

    def bind_with_copies(self, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
        """End to end: host arrays copied in, the outputs copied back to host memory (which waits for the GPU)."""
        host = super()._tensors(feeds)
        model, torch, device = self._model, self._torch, self._device

        def call():
            with torch.inference_mode():
                out = model(*[t.to(device, non_blocking=False) for t in host])
            return [t.cpu() for t in (out if isinstance(out, tuple | list) else (out,))]

        return call

    def synchronize(self) -> None:
        self._torch.cuda.synchronize(self._device)


class AotiCuda(Target):
    Options = Options

    @classmethod
    def probe(cls) -> Probe:
        from tapeout.targets.aoti import torch_with_aoti

        torch, missing = torch_with_aoti(INSTALL)
        if missing:
            return missing
        if not torch.cuda.is_available():
            cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            return Probe(
                False,
                torch.__version__,
                install_hint=INSTALL,
                reason=f"torch {torch.__version__} ({cuda}) sees no CUDA GPU",
            )
        return Probe(
            True, torch.__version__, details={"cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0)}
        )

    def preflight(self) -> None:
        import torch

        count = torch.cuda.device_count()
        if self.options.device_id >= count:
            raise TargetUnavailable(
                f"device_id {self.options.device_id} names no GPU: torch sees {count}",
                fix=f"set [options] device_id below {count} (after CUDA_VISIBLE_DEVICES)",
            )

    def compile_program(
        self, program, out_dir: Path, inputs: list[InputSpec], dims: dict[str, int], output_names: list[str]
    ) -> Artifact:
        """The program and engine-settings.json; the package is compiled by build_engine, on the GPU."""
        import torch

        from tapeout.targets.engine_cache import SETTINGS_FILE

        out_dir.mkdir(parents=True, exist_ok=True)
        with quieted():
            torch.export.save(program, str(out_dir / ARTIFACT_FILE))  # plain tensors: core/pt2 opens it unpickled
        write_io(out_dir, inputs, output_names, None)
        precision = "bf16" if _computes_in_bf16(program) else "fp32"
        settings = EngineSettings(
            freezing=self.options.freezing,
            max_autotune=self.options.max_autotune,
            precision=precision,
            built_with_torch=torch.__version__,
            kernels=self.options.kernels,
            input_shapes=[list(s.shape) for s in inputs],
            dims=dict(dims),
        )
        (out_dir / SETTINGS_FILE).write_text(json.dumps(settings.model_dump(), indent=1))
        return Artifact(
            self.name,
            out_dir,
            ARTIFACT_FILE,
            meta={
                "compiler": "Inductor (AOTInductor, CUDA): Triton kernels and cuBLAS calls, compiled on the device",
                "engine": "compiled on the device at the first `tapeout check` (or here, where a CUDA GPU is), cached in "
                "engines/ per GPU, compute capability, torch/Triton/CUDA version, driver, program and settings",
                "dynamic_dims": sorted({d for s in inputs for d in s.shape if isinstance(d, str)}),
                "program_saved_with": f"torch {torch.__version__} (the device's torch must load it: the same or newer)",
                "precision": precision,
                "freezing": self.options.freezing,
                "max_autotune": self.options.max_autotune,
            },
        )

    def _settings(self, artifact: Artifact) -> EngineSettings:
        from tapeout.targets.engine_cache import read_settings

        return read_settings(artifact.directory, EngineSettings, "aoti-cuda engine settings")

    def _device(self, artifact: Artifact):
        """(GPU description, its kernel-timings key, settings, cache entry, key): the key names everything a package
        is tied to."""
        import torch
        import triton

        from tapeout.core.hashing import sha256_file
        from tapeout.targets import engine_cache
        from tapeout.targets.kernels import timings

        index = self.options.device_id
        props = torch.cuda.get_device_properties(index)
        settings = self._settings(artifact)
        gpu = timings.device_key(props.name, (props.major, props.minor), triton.__version__, torch.__version__)
        key = {
            "gpu": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "toolchain": f"torch {torch.__version__}, Triton {triton.__version__}, CUDA {torch.version.cuda}",
            "driver": _driver(index),
            "program_sha256": sha256_file(artifact.path),
            "settings_sha256": engine_cache.settings_hash(settings.model_dump()),
            # new kernel timings may change what is substituted: another package
            "kernel_timings": kernel_timings_digest(gpu) if settings.kernels else "off",
        }
        return props, gpu, settings, engine_cache.entry(artifact.directory, key, ".pt2"), key

    def build_engine(self, artifact: Artifact, progress: Callable[[str], None]) -> EngineBuild:
        import torch
        from torch.export.passes import move_to_device_pass

        from tapeout.core import pt2
        from tapeout.targets import engine_cache

        props, gpu, settings, entry, key = self._device(artifact)
        record = engine_cache.cached(entry)
        if record is not None:
            return EngineBuild(
                "reused",
                f"built {record.get('built', '?')} for this GPU, toolchain, driver, program and settings",
                entry.relative,
                key,
                0.0,
                [],
                record.get("summary", {}),
            )
        reason = engine_cache.why_build(entry.engine.parent, key)
        cxx = _wrapper_compiler()
        progress(
            f"compiling the AOTInductor package for {props.name} (sm_{props.major}{props.minor}), "
            f"{key['toolchain']}, wrapper built by {cxx.describe()}: {reason}"
        )
        t0 = time.perf_counter()
        try:
            program = pt2.load(artifact.path)
        except TapeoutError:
            raise
        except Exception as exc:  # another torch's serialization: the device's torch cannot read this program
            raise TargetUnavailable(
                f"torch {torch.__version__} here cannot load the program saved with torch "
                f"{settings.built_with_torch}: {first_line(exc)}",
                fix="build with the torch version the device runs, or on the device",
            ) from None
        program = move_to_device_pass(program, f"cuda:{self.options.device_id}")
        substitution = None
        if settings.kernels:
            substitution = substitute_kernels(program, settings, gpu)
            progress(
                f"fused kernels: {substitution['substituted']} of {len(substitution['decisions'])} chains "
                f"substituted ({substitution['timings']})"
            )
        try:
            data, kernels = _compile(program, settings, cxx)
        except Exception as exc:
            if not substitution or not substitution["substituted"]:
                raise _not_compiled(props.name, exc) from None
            # the kernels' program did not compile: Inductor's code everywhere, and every decision says why
            reason = f"Inductor could not compile the program with the kernels ({first_line(exc)}): its code kept"
            substitution = {
                **substitution,
                "substituted": 0,
                "compile_failed": first_line(exc),
                "decisions": [
                    {**d, "substituted": False, "reason": reason} if d["substituted"] else d
                    for d in substitution["decisions"]
                ],
            }
            progress(reason)
            try:
                unsubstituted = move_to_device_pass(pt2.load(artifact.path), f"cuda:{self.options.device_id}")
                data, kernels = _compile(unsubstituted, settings, cxx)
            except Exception as again:
                raise _not_compiled(props.name, again) from None
        seconds = time.perf_counter() - t0
        summary = {
            "build_seconds": round(seconds, 3),
            "package_bytes": len(data),
            **kernels,
            "freezing": settings.freezing,
            "max_autotune": settings.max_autotune,
            **({"fused_kernels": substitution} if substitution is not None else {}),
        }
        engine_cache.store(entry, data, key, seconds=seconds, summary=summary)
        return EngineBuild("built", reason, entry.relative, key, seconds, [], summary)

    def _package(self, artifact: Artifact) -> Path:
        from tapeout.targets import engine_cache

        _, _, _, entry, _ = self._device(artifact)
        engine_cache.load(entry)  # its bytes against the record tapeout wrote: a package is native code
        return entry.engine

    def session(self, artifact: Artifact) -> AotiCudaSession:
        package = self._package(artifact)
        try:
            return AotiCudaSession(artifact, package, self.options.device_id)
        except TapeoutError:
            raise
        except Exception as exc:
            raise BadInput(
                f"torch could not load the AOTInductor package {package}: {first_line(exc)}",
                detail=runtime_detail(exc),
                fix=f"delete {package.parent} and run `tapeout check` again: it compiles the package for this GPU",
            ) from None

    def op_profile(
        self, artifact: Artifact, feeds: dict[str, np.ndarray], iterations: int, pace_s: float | None = None
    ) -> OpProfile:
        """The GPU kernels of each run under torch's profiler (CUPTI): Inductor's Triton kernels ("triton_per_fused_
        native_layer_norm_3") and the library calls between them (cuBLAS GEMMs, cuDNN convs), device time per
        kernel call site, the median run's, times the runs. One profiler session per run, so each kernel belongs
        to exactly one run."""
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        session = self.session(artifact)
        call = session.bind(feeds)
        for _ in range(5):
            call()
        session.synchronize()
        spans, walls = [], []
        for run in range(iterations):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                start = time.perf_counter()
                call()
                session.synchronize()
                walls.append((time.perf_counter() - start) * 1e6)
            spans += [
                (e.name, run, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA
            ]
        return gpu_kernel_profile(spans, walls, self.capabilities.op_profiler or "torch profiler (CUDA)")


def _not_compiled(gpu_name: str, exc: Exception) -> BadInput:
    return BadInput(
        f"AOTInductor could not compile the program for {gpu_name}: {first_line(exc)}",
        detail=runtime_detail(exc),
        fix="`tapeout --debug check …` prints Inductor's whole message; or build for ort-cuda",
    )


def _wrapper_compiler() -> cxx_compiler.Compiler:
    """The C++ compiler for the package's wrapper (`cxx_compiler`: on the H200 image, $CXX linked libstdc++
    statically and every package it built crashed when torch loaded it)."""
    cxx = cxx_compiler.choose()
    if cxx is None:
        raise TargetUnavailable(
            "AOTInductor needs a C++ compiler on the device to build the package's wrapper, and "
            "none was found (g++, c++, clang++ or $CXX)",
            fix="apt install g++ on the device",
        )
    return cxx


def _compile(program, settings: EngineSettings, cxx: cxx_compiler.Compiler) -> tuple[bytes, dict]:
    """The program (on the GPU) compiled into a package: its bytes, what it launches and which compiler built it."""
    import torch

    with quieted(), torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        package = Path(tmp) / "model.pt2"
        torch._inductor.aoti_compile_and_package(
            program,
            package_path=str(package),
            inductor_configs={
                "freezing": settings.freezing,
                "max_autotune": settings.max_autotune,
                **cxx.inductor_configs(),
            },
        )
        return package.read_bytes(), {**_kernel_counts(package), "compiler": cxx.describe()}


def substitute_kernels(program, settings: EngineSettings, gpu: str, folder: Path | None = None) -> dict:
    """The substitution pass on `program` (rewritten in place) with the kernel timings measured on `gpu` (the
    `tapeout kernels bench` file; `folder` overrides where it is read): how many chains were replaced, and every
    decision with its two timings."""
    from types import SimpleNamespace

    from tapeout.targets.kernels import substitute, timings

    table = timings.load(gpu, folder)
    specs = [SimpleNamespace(shape=shape) for shape in settings.input_shapes]
    replaced, decisions = substitute.substitute(program, table, gpu, specs or None, settings.dims or None)
    return {
        "gpu": gpu,
        "timings": f"{len(table)} timed kernel case(s) for this GPU"
        if table
        else "no kernel timings for this GPU: `tapeout kernels bench` measures them",
        "substituted": replaced,
        "decisions": [d.row() for d in decisions],
    }


def kernel_timings_digest(gpu: str, folder: Path | None = None) -> str:
    """The sha256 of the kernel timings file for `gpu` ("none" without one): part of the package's cache key."""
    from tapeout.core.hashing import sha256_file
    from tapeout.targets.kernels import timings

    path = timings.path_for(gpu, folder)
    return sha256_file(path) if path.is_file() else "none"


def gpu_kernel_profile(spans: list[tuple[str, int, float]], walls: list[float], method: str) -> OpProfile:
    """Kernel records `(name, run, µs of device time)` as an OpProfile: one row per kernel call site in a run (a
    kernel launched twice a run is "… #2"), its median call times the runs. Inductor's kernels are named
    `triton_<kind>_fused_<ops>_<index>`: their type is the name without the index; a library kernel's type is its
    name up to the template arguments."""
    seen: dict[int, dict[str, int]] = {}
    times: dict[str, list[float]] = {}
    order: list[str] = []
    for name, run, us in spans:
        counts = seen.setdefault(run, {})
        counts[name] = counts.get(name, 0) + 1
        node = f"{name} #{counts[name]}"
        if node not in times:
            order.append(node)
        times.setdefault(node, []).append(us)
    ops = []
    for node in order:
        name = node.rsplit(" #", 1)[0]
        triton = name.startswith("triton_")
        op_type = re.sub(r"_\d+$", "", name) if triton else re.split(r"[<(]", name, maxsplit=1)[0].strip()
        ops.append(
            OpTime(
                node=node,
                op_type=op_type[:120],
                provider="Inductor Triton" if triton else "cuBLAS/cuDNN/ATen",
                calls=len(times[node]),
                total_us=float(np.median(times[node])) * len(times[node]),
            )
        )
    total = float(np.median(walls)) * len(walls) if walls else 0.0
    return OpProfile(runs=len(walls), run_total_us=total, ops=ops, method=method)


def _computes_in_bf16(program) -> bool:
    """Whether any op of the program takes a bfloat16 tensor (the precision step's casts): the record's precision."""
    import torch

    return any(
        getattr(getattr(a, "meta", {}).get("val"), "dtype", None) == torch.bfloat16
        for node in program.graph.nodes
        if node.op == "call_function"
        for a in node.args
    )


def _kernel_counts(package: Path) -> dict[str, int]:
    """How many Triton kernels and how many library calls (cuBLAS/ATen fallbacks) the package's wrapper launches:
    what Inductor fused, read from our own just-written package."""
    import zipfile

    triton = extern = 0
    with zipfile.ZipFile(package) as archive:
        for name in archive.namelist():
            if name.endswith(".cpp") and "wrapper" in name:
                text = archive.read(name).decode("utf-8", "replace")
                triton += len(set(re.findall(r"\b(triton_\w+?_\d+)\b", text)))
                extern += len(re.findall(r"aoti_torch_cuda_\w+\(", text))
    return {"triton_kernels": triton, "library_calls": extern}


def _driver(index: int) -> str:
    """The driver's version from NVML, where nvidia-ml-py is installed: the key's other fields name the GPU and the
    toolchain, and a package's cubins run on any newer driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return f"{pynvml.nvmlSystemGetDriverVersion()}"
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML here: not part of the key
        return "not read (no NVML)"
