"""AMD GPUs (ROCm) through MIGraphX's Python module, compiled on the device.

A compiled MIGraphX program is tied to the GPU architecture (gfx942, ...) and the MIGraphX version, so
`build` writes the ONNX (FP16 or INT8 Q/DQ already in the graph, from the same precision step as the
NVIDIA targets: MIGraphX parses QuantizeLinear/DequantizeLinear natively) and `engine-settings.json`
(input shapes pinned from `[dims]`, compile options). The first `check` on the device parses and
compiles the program, saves it (msgpack) into `engines/` keyed by GPU, architecture, MIGraphX version
and ONNX hash, and later checks load it.

Written against MIGraphX's Python API (research rocm-npu.md §1.1). ROCm cannot be installed on the CI
machine: the tests check tapeout's side of the contract with a stand-in that has the API's names only.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tapeout.core.artifact import Artifact
from tapeout.core.errors import BadInput, TapeoutError, TargetUnavailable, first_line
from tapeout.core.paths import copy_onnx
from tapeout.core.schemas import InputSpec
from tapeout.targets.base import EngineBuild, Probe, Session, Target

ARTIFACT_FILE = "model.onnx"
SETTINGS_FILE = "engine-settings.json"  # engine_cache.SETTINGS_FILE
SETTINGS_SCHEMA = "tapeout.migraphx-settings/1"
INSTALL = (
    "on the device: install ROCm and MIGraphX from AMD's repositories (apt install migraphx; the Python "
    'module is in /opt/rocm/lib), then pip install "tapeout[rocm]"; PyPI\'s `migraphx` is a name placeholder'
)


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    device_id: int = Field(
        0, ge=0, le=1023, description="GPU index for the amdsmi meters (MIGraphX uses HIP's current device)"
    )
    fast_math: bool = Field(True, description="MIGraphX's fast math (approximate GELU, ...)")
    exhaustive_tune: bool = Field(False, description="tune every kernel at compile (slow compile, faster program)")


class CompileSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_id: Literal["tapeout.migraphx-settings/1"] = Field(alias="schema")
    input_dims: dict[str, list[int]]
    output_names: list[str]
    fast_math: bool
    exhaustive_tune: bool


def pinned_dims(model, inputs: list[InputSpec], dims: dict[str, int]) -> dict[str, list[int]]:
    """Every graph input's shape with symbolic dims replaced by [dims]: MIGraphX compiles static shapes
    (a dynamic range costs compile time and size that grow with its maximum)."""
    declared = {s.name: s for s in inputs}
    pinned = {}
    for value in model.graph.input:
        shape = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]
        spec = declared.get(value.name)
        if spec is not None and len(spec.shape) == len(shape):
            shape = [g if isinstance(g, int) and g > 0 else s for s, g in zip(spec.shape, shape, strict=True)]
        out = []
        for d in shape:
            if isinstance(d, int) and d > 0:
                out.append(d)
            elif d in dims:
                out.append(dims[d])
            else:
                raise BadInput(
                    f"input '{value.name}' has symbolic dim '{d}' with no value in [dims]",
                    fix=f"add {d} = N to the project's [dims]",
                )
        pinned[value.name] = out
    return pinned


def _gpu_identity(index: int) -> dict:
    """Name and gfx architecture from amdsmi (what the program is tied to); "unknown" where amdsmi cannot say."""
    try:
        import amdsmi

        amdsmi.amdsmi_init()
        try:
            asic = amdsmi.amdsmi_get_gpu_asic_info(amdsmi.amdsmi_get_processor_handles()[index])
            return {
                "gpu": str(asic.get("market_name") or "unknown"),
                "gfx": str(asic.get("target_graphics_version") or "unknown"),
            }
        finally:
            amdsmi.amdsmi_shut_down()
    except Exception as exc:  # no ROCm SMI library, no GPU at that index: the key still names the toolchain
        return {"gpu": "unknown", "gfx": f"unknown ({first_line(exc)[:60]})"}


class MIGraphX(Target):
    Options = Options

    @classmethod
    def probe(cls) -> Probe:
        try:
            mx = importlib.import_module("migraphx")
        except Exception as exc:
            return Probe(
                False,
                reason=f"the migraphx module does not import ({first_line(exc)}); it needs ROCm",
                install_hint=INSTALL,
            )
        return Probe(True, version=str(getattr(mx, "__version__", "unknown")))

    def _mx(self):
        self.probe().require(self.name)
        return importlib.import_module("migraphx")

    def preflight(self) -> None:
        """The module and a GPU target: MIGraphX builds without HIP lack get_target("gpu")."""
        mx = self._mx()
        try:
            mx.get_target("gpu")
        except Exception as exc:
            raise TargetUnavailable(
                f"target 'migraphx' is not available here: MIGraphX has no GPU target ({first_line(exc)})", fix=INSTALL
            ) from None

    def compile(self, model_path: Path, out_dir: Path, inputs: list[InputSpec], dims: dict[str, int]) -> Artifact:
        """The ONNX the program is compiled from, and engine-settings.json; the program is built by build_engine."""
        import onnx

        out_dir.mkdir(parents=True, exist_ok=True)
        copy_onnx(model_path, out_dir / ARTIFACT_FILE)
        header = onnx.load(str(out_dir / ARTIFACT_FILE), load_external_data=False)
        settings = {
            "schema": SETTINGS_SCHEMA,
            "input_dims": pinned_dims(header, inputs, dims),
            "output_names": [o.name for o in header.graph.output],
            "fast_math": self.options.fast_math,
            "exhaustive_tune": self.options.exhaustive_tune,
        }
        (out_dir / SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n")
        return Artifact(
            self.name,
            out_dir,
            ARTIFACT_FILE,
            meta={
                "engine": "compiled by MIGraphX on the device at the first `tapeout check`, cached in engines/",
                "input_dims": settings["input_dims"],
                "qdq_pairs": sum(n.op_type == "QuantizeLinear" for n in header.graph.node),
            },
        )

    def _settings(self, artifact: Artifact) -> CompileSettings:
        from tapeout.targets import engine_cache

        return engine_cache.read_settings(artifact.directory, CompileSettings, SETTINGS_SCHEMA)

    def _device(self, artifact: Artifact):
        from tapeout.core.hashing import sha256_file
        from tapeout.targets import engine_cache

        mx = self._mx()
        settings = self._settings(artifact)
        who = _gpu_identity(self.options.device_id)
        key = {
            "gpu": who["gpu"],
            "compute_capability": who["gfx"],
            "toolchain": f"migraphx {getattr(mx, '__version__', 'unknown')}",
            "driver": "ROCm",
            "onnx_sha256": sha256_file(artifact.path),
            "settings_sha256": engine_cache.settings_hash(settings.model_dump(by_alias=True)),
        }
        return mx, settings, engine_cache.entry(artifact.directory, key, ".mxr"), key

    def build_engine(self, artifact: Artifact, progress: Callable[[str], None]) -> EngineBuild:
        from tapeout.targets import engine_cache

        mx, settings, entry, key = self._device(artifact)
        record = engine_cache.cached(entry)
        if record is not None:
            return EngineBuild(
                "reused",
                f"compiled {record.get('built', '?')} for this GPU, MIGraphX and ONNX",
                entry.relative,
                key,
                0.0,
                [],
                record.get("summary", {}),
            )
        reason = engine_cache.why_build(entry.engine.parent, key)
        progress(f"compiling the MIGraphX program for {key['gpu']} ({key['compute_capability']}): {reason}")
        t0 = time.perf_counter()
        try:
            program = mx.parse_onnx(str(artifact.path), map_input_dims=settings.input_dims)
        except Exception as exc:
            raise BadInput(
                f"MIGraphX could not parse the model: {first_line(exc)}",
                fix="run `tapeout lint` on the host; an operator MIGraphX lacks must be rewritten",
            ) from None
        try:
            program.compile(
                mx.get_target("gpu"),
                offload_copy=True,
                fast_math=settings.fast_math,
                exhaustive_tune=settings.exhaustive_tune,
            )
            blob = bytes(mx.save_buffer(program, format="msgpack"))
        except Exception as exc:
            raise TapeoutError(
                f"MIGraphX could not compile the model: {first_line(exc)}",
                fix="try [options] fast_math = false; report the MIGraphX version",
            ) from None
        seconds = time.perf_counter() - t0
        summary = {
            "build_seconds": round(seconds, 3),
            "engine_bytes": len(blob),
            "input_dims": settings.input_dims,
            "outputs": len(program.get_output_shapes()),
        }
        engine_cache.store(entry, blob, key, seconds=seconds, summary=summary)
        return EngineBuild("built", reason, entry.relative, key, seconds, [], summary)

    def session(self, artifact: Artifact) -> Session:
        from tapeout.targets import engine_cache

        mx, settings, entry, _ = self._device(artifact)
        blob, _ = engine_cache.load(entry)  # verified against the record tapeout wrote
        return MxSession(mx, mx.load_buffer(blob, format="msgpack"), settings.input_dims, settings.output_names)


class MxSession(Session):
    """A compiled program with offload_copy: it takes and returns host arrays, copies included in each run."""

    def __init__(self, mx, program, input_dims: dict[str, list[int]], output_names: list[str]):
        self.mx, self.program, self.input_dims = mx, program, input_dims
        self.input_names = list(input_dims)
        self.output_names = output_names  # program.run returns the ONNX graph's outputs in order

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        params = {}
        for name, shape in self.input_dims.items():
            if name not in feeds:
                raise BadInput(f"missing input '{name}'", fix="feed every model input")
            array = np.ascontiguousarray(feeds[name])
            if list(array.shape) != shape:
                raise BadInput(
                    f"input '{name}' shape {list(array.shape)} is not the compiled {shape}",
                    fix="MIGraphX programs are compiled for the [dims] shapes: rebuild with those",
                )
            params[name] = self.mx.argument(array)
        results = self.program.run(params)
        return {name: np.array(result) for name, result in zip(self.output_names, results, strict=True)}
