"""ExecuTorch, PyTorch's edge runtime: the torch.export program lowered for XNNPACK into a `.pte`.

compile = `to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])` → `to_executorch()` →
model.pte, the program an Android, iOS or Linux app loads with ExecuTorch's C++ runtime. The partitioner hands
XNNPACK every subgraph it has kernels for; what it leaves runs on ExecuTorch's portable kernels (plain C++,
no vectorisation), so the delegation record (which ops ran in XNNPACK, which did not, and how many delegated
subgraphs) is the artifact's placement, judged by `placement_max_off_share`. The session runs the `.pte` through
`executorch.runtime`, the Python bindings of that same C++ runtime and its XNNPACK kernels (x86-64 and Arm).

The Core ML delegate (`executorch-coreml`, ExecuTorchCoreML) lowers the same way with coremltools, here; its
`.pte` runs only where the runtime has the Core ML backend (macOS, iOS).

A `.pte` is a flatbuffer: loading one runs no code from the file (nothing is unpickled).
"""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tapeout.core.artifact import Artifact
from tapeout.core.errors import BadInput, TapeoutError, TargetUnavailable, first_line, runtime_detail
from tapeout.core.schemas import InputSpec
from tapeout.targets.base import OpProfile, OpTime, Probe, Target
from tapeout.targets.native_output import quieted
from tapeout.targets.program_io import ProgramSession, read_io, write_io

ARTIFACT_FILE = "model.pte"
INSTALL = 'pip install "tapeout[executorch]" (executorch 1.5 beside torch 2.13; the device side needs it too)'
_PLUMBING = {"getitem", "output", "placeholder"}  # graph plumbing, not ops a kernel runs


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    threads: int = Field(0, ge=0, le=4096, description="XNNPACK's thread pool; 0 = ExecuTorch's default (one per core)")


class ExecuTorchSession(ProgramSession):
    """The `.pte` loaded by ExecuTorch's runtime."""

    def __init__(self, artifact: Artifact, threads: int):
        super().__init__(artifact)
        with quieted():  # its import, its cpuinfo probe and the pool's reset print to the process's stderr
            from executorch.runtime import Runtime

            if threads:
                from executorch.extension.pybindings import portable_lib

                portable_lib._unsafe_reset_threadpool(threads)  # the one pool XNNPACK's kernels share
            program = Runtime.get().load_program(artifact.path)
            self._method = program.load_method("forward")

    def _call(self, tensors: list):
        return self._method.execute(tensors)

    def bind(self, feeds: dict[str, np.ndarray]):
        return functools.partial(self._method.execute, self._tensors(feeds))


class ExecuTorch(Target):
    """The XNNPACK delegate; a delegate is a subclass naming its runtime backend and its partitioners."""

    Options = Options
    BACKEND: ClassVar[str] = "XnnpackBackend"  # the name ExecuTorch's runtime registers the delegate under
    DELEGATE: ClassVar[str] = "XNNPACK"
    INSTALL: ClassVar[str] = INSTALL

    @classmethod
    def probe(cls) -> Probe:
        try:
            with quieted():
                import executorch
                from executorch.runtime import Runtime
        except Exception as exc:  # ImportError, or its native library failing to load
            return Probe(
                False,
                reason=f"executorch cannot be imported ({type(exc).__name__}: {str(exc)[:160]})",
                install_hint=cls.INSTALL,
            )
        version = _version(executorch)
        backends = list(Runtime.get().backend_registry.registered_backend_names)
        if cls.BACKEND not in backends:
            return Probe(False, version, install_hint=cls.INSTALL, reason=cls._missing_backend(version, backends))
        return Probe(True, version, details={"backends": backends})

    @classmethod
    def _missing_backend(cls, version: str, backends: list[str]) -> str:
        return f"this executorch {version} runtime has no {cls.BACKEND} (it has {', '.join(backends) or 'none'})"

    def _partitioners(self) -> list:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        return [XnnpackPartitioner()]

    def _meta(self) -> dict:
        return {"runtime": "executorch.runtime (ExecuTorch's C++ runtime and its XNNPACK kernels)"}

    def compile_program(
        self, program, out_dir: Path, inputs: list[InputSpec], dims: dict[str, int], output_names: list[str]
    ) -> Artifact:
        """Lower for the delegate, write the `.pte` and its signature, and record what was delegated."""
        out_dir.mkdir(parents=True, exist_ok=True)
        try:
            with quieted():
                from executorch.devtools.backend_debug import get_delegation_info
                from executorch.exir import to_edge_transform_and_lower

                program, pinned = _static(program, inputs, dims)
                edge = to_edge_transform_and_lower(program, partitioner=self._partitioners())
                delegation = get_delegation_info(edge.exported_program().graph_module)
                pte = edge.to_executorch()
        except TapeoutError:
            raise
        except ImportError as exc:  # a delegate's own toolkit (coremltools) missing on the building host
            raise TargetUnavailable(
                f"lowering for {self.DELEGATE} needs {exc.name or exc} on this host", fix=self.INSTALL
            ) from None
        except Exception as exc:  # the lowering's own errors name the op it could not take
            raise BadInput(
                f"ExecuTorch could not lower the program for {self.DELEGATE}: {first_line(exc)}",
                detail=runtime_detail(exc),
                fix="replace the op it names, or use a target that takes ONNX (`tapeout targets`)",
            ) from None
        (out_dir / ARTIFACT_FILE).write_bytes(pte.buffer)
        write_io(out_dir, inputs, output_names, dims if pinned else None)
        placement = _placement(delegation, self.DELEGATE)
        return Artifact(
            self.name,
            out_dir,
            ARTIFACT_FILE,
            meta={
                "delegate": self.DELEGATE,
                "placement": placement,
                "shapes": (
                    f"static at the project's dims ({', '.join(pinned)}): memory planned ahead, every view delegated"
                    if pinned
                    else "static, as exported"
                ),
                "delegated_subgraphs": delegation.num_delegated_subgraphs,
                "portable_ops": sorted({o["op_type"] for o in placement["off"]}),
                **self._meta(),
            },
        )

    def session(self, artifact: Artifact) -> ExecuTorchSession:
        try:
            return ExecuTorchSession(artifact, getattr(self.options, "threads", 0))
        except TapeoutError:
            raise
        except Exception as exc:  # a .pte from another ExecuTorch version, a truncated file
            raise BadInput(
                f"ExecuTorch could not load {artifact.path}: {first_line(exc)}",
                detail=runtime_detail(exc),
                fix="rebuild with the executorch version the device runs",
            ) from None

    def op_profile(
        self, artifact: Artifact, feeds: dict[str, np.ndarray], iterations: int, pace_s: float | None = None
    ) -> OpProfile:
        """A separate pass with ExecuTorch's event tracer on (ETDump): every XNNPACK kernel inside the delegate (its
        own profiler's names: "Convolution (NHWC, F32) IGEMM") and every op on the portable kernels, timed per run."""
        import tempfile

        with quieted():
            import torch
            from executorch.devtools import Inspector
            from executorch.runtime import Runtime

            io = read_io(artifact.directory)
            tensors = [torch.from_numpy(np.ascontiguousarray(feeds[name])) for name in io.inputs]
            with tempfile.TemporaryDirectory(prefix="tapeout-etdump-") as tmp:
                program = Runtime.get().load_program(artifact.path, enable_etdump=True)
                method = program.load_method("forward")
                for _ in range(3 + iterations):  # the last `iterations` runs are kept: the rest is warm-up
                    method.execute(tensors)
                program.write_etdump_result_to_file(str(Path(tmp) / "run.etdp"), str(Path(tmp) / "debug.bin"))
                events = Inspector(etdump_path=str(Path(tmp) / "run.etdp")).to_dataframe()
        return _etdump_profile(events, iterations, self.capabilities.op_profiler or "ExecuTorch ETDump", self.DELEGATE)


class CoreMLOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    compute_units: Literal["all", "cpu_and_ne", "cpu_and_gpu", "cpu_only"] = Field(
        "all", description="where Core ML may place ops: the Neural Engine is in 'all' and 'cpu_and_ne'"
    )
    compute_precision: Literal["float16", "float32"] = Field(
        "float16", description="Core ML's compute precision; the Neural Engine runs float only in FP16"
    )
    minimum_deployment_target: Literal["iOS16", "iOS17", "iOS18"] = "iOS17"


class ExecuTorchCoreML(ExecuTorch):
    """The Core ML delegate: lowered here by coremltools (it converts on Linux), run by an ExecuTorch runtime built
    with the Core ML backend, which exists on macOS and iOS only. Core ML compiles the model for the device's
    Neural Engine, GPU and CPU when the program loads there, so the capabilities say `compile_on = "device"`: the
    build goes on without the runtime, its latency verdicts estimated, and `check` exits 4 off Apple hardware."""

    Options = CoreMLOptions
    BACKEND = "CoreMLBackend"
    DELEGATE = "Core ML"
    INSTALL = (
        'on the host: pip install "tapeout[executorch]" (coremltools comes with it); on the Apple device: '
        "pip install executorch (its macOS wheel has the Core ML backend), or the iOS runtime in an app"
    )

    @classmethod
    def _missing_backend(cls, version: str, backends: list[str]) -> str:
        return (
            f"this executorch {version} runtime has no {cls.BACKEND}: Core ML runs on macOS and iOS only (this "
            f"runtime has {', '.join(backends) or 'none'})"
        )

    def _partitioners(self) -> list:
        import coremltools as ct
        from executorch.backends.apple.coreml.compiler import CoreMLBackend
        from executorch.backends.apple.coreml.partition import CoreMLPartitioner

        o = self.options
        specs = CoreMLBackend.generate_compile_specs(
            compute_precision=ct.precision.FLOAT16 if o.compute_precision == "float16" else ct.precision.FLOAT32,
            compute_unit={
                "all": ct.ComputeUnit.ALL,
                "cpu_and_ne": ct.ComputeUnit.CPU_AND_NE,
                "cpu_and_gpu": ct.ComputeUnit.CPU_AND_GPU,
                "cpu_only": ct.ComputeUnit.CPU_ONLY,
            }[o.compute_units],
            minimum_deployment_target=getattr(ct.target, o.minimum_deployment_target),
        )
        return [CoreMLPartitioner(compile_specs=specs)]

    def _meta(self) -> dict:
        o = self.options
        return {
            "runtime": "ExecuTorch's runtime with the Core ML backend (macOS, iOS); Core ML compiles the model "
            "for the device at load",
            "compute_units": o.compute_units,
            "compute_precision": o.compute_precision,
            "minimum_deployment_target": o.minimum_deployment_target,
        }


_AGGREGATES = {"DELEGATE_CALL", "OPERATOR_CALL", "Method::execute"}  # sums of the rows that are ops


def _etdump_profile(events, iterations: int, method: str, delegate: str) -> OpProfile:
    """ETDump's Execute events as an OpProfile: one row per op instance, its last `iterations` times (ms)."""
    ops, run_total = [], 0.0
    for row in events.itertuples():
        if row.event_block_name != "Execute":
            continue
        times = list(row.raw)[-iterations:]
        if row.event_name == "Method::execute":
            run_total = sum(times) * 1e3
        if row.event_name in _AGGREGATES:
            continue
        # a portable kernel's event is "native_call_<op>.out"; every other op event comes from inside the delegate,
        # named by its own profiler ("Convolution (NHWC, F32) IGEMM #2": the kernel and its instance)
        portable = row.event_name.startswith("native_call_")
        op_type = (
            row.event_name.removeprefix("native_call_").removesuffix(".out")
            if portable
            else row.event_name.rsplit(" #", 1)[0]
        )
        ops.append(
            OpTime(
                node=row.event_name,
                op_type=op_type,
                provider="portable" if portable else delegate,
                calls=len(times),
                total_us=sum(times) * 1e3,
            )
        )
    return OpProfile(runs=iterations, run_total_us=run_total, ops=ops, method=method)


def _static(program, inputs: list[InputSpec], dims: dict[str, int]):
    """The program re-exported at the project's dims where it has symbolic ones, and what was pinned. An edge
    program runs the shapes its app feeds; static, ExecuTorch plans its memory ahead and XNNPACK takes the views a
    dynamic batch leaves to the portable kernels (digits-cnn's flatten)."""
    import torch

    pinned = sorted({f"{d}={dims[d]}" for s in inputs for d in s.shape if isinstance(d, str)})
    if not pinned:
        return program, pinned
    args = tuple(torch.zeros(s.concrete_shape(dims), dtype=getattr(torch, s.dtype)) for s in inputs)
    return torch.export.export(program.module(), args), pinned


def _placement(delegation, delegate: str) -> dict:
    """The delegation record as a placement: ops inside the delegate's subgraphs against ops left to ExecuTorch's
    portable kernels (one entry per op type, its count in the node field)."""
    on = off = 0
    left: Counter[str] = Counter()
    for name, row in delegation.delegation_by_operator.items():
        if name in _PLUMBING or name.startswith("sym_"):  # graph plumbing, a dynamic dim's size: no kernel
            continue
        on += row.delegated
        off += row.non_delegated
        if row.non_delegated:
            left[name] = row.non_delegated
    total = on + off
    return {
        "accelerator": delegate,
        "total_nodes": total,
        "on_accelerator": on,
        "off_share": off / total if total else 0.0,
        "off": [
            {
                "node": f"{count} node(s)",
                "op_type": op,
                "reason": f"not taken by {delegate}: ExecuTorch's portable kernel runs it",
            }
            for op, count in sorted(left.items())
        ],
        "subgraphs": delegation.num_delegated_subgraphs,
        "source": f"ExecuTorch's delegation record of the lowered program ({delegate} partitioner)",
    }


def _version(module) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("executorch")
    except PackageNotFoundError:
        return getattr(module, "__version__", "unknown")
