"""NVIDIA GPUs through ONNX Runtime's CUDA execution provider (the `onnxruntime-gpu` wheel).

compile = the FP32 or FP16 ONNX model itself, loaded once on the GPU to prove the CUDA EP takes it.
The precision step converted it on the host (FP16: ORT's converter, planned by the rule table); ORT
applies its CUDA fusions (attention, LayerNorm, GELU) when the session loads, so the artifact stays
portable across GPUs, drivers and cuDNN versions.

Timed runs bind inputs and outputs in device memory (IOBinding) and end with a device sync; the
end-to-end latency with host copies is timed apart. TF32 is off unless the profile asks: the CUDA
EP's own default (use_tf32=1) would run "fp32" MatMuls and Convs in TF32 on Ampere and newer.
CUDA graphs (optional) replay the whole run from fixed device buffers; ORT allows them only when
every node runs on the CUDA EP.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Literal

from pydantic import Field

from tapeout.core.artifact import Artifact
from tapeout.core.errors import BadInput, TargetUnavailable, first_line, runtime_detail
from tapeout.core.paths import copy_onnx
from tapeout.core.schemas import InputSpec
from tapeout.core.workload import Workload
from tapeout.targets.native_output import native_output_captured
from tapeout.targets.ort_ep import OrtOptions, OrtTarget, ort_complaint

ARTIFACT_FILE = "model.onnx"
_SEARCH = {"exhaustive": "EXHAUSTIVE", "heuristic": "HEURISTIC", "default": "DEFAULT"}


class Options(OrtOptions):
    device_id: int = Field(0, ge=0, le=1023, description="CUDA device index (after CUDA_VISIBLE_DEVICES)")
    tf32: bool = Field(False, description="let FP32 MatMul/Conv run in TF32 on Ampere and newer (ORT's default is on)")
    cuda_graph: bool = Field(False, description="capture the run once and replay it (needs every node on the CUDA EP)")
    conv_algo_search: Literal["exhaustive", "heuristic", "default"] = Field(
        "exhaustive", description="cuDNN convolution algorithm search; exhaustive costs cold-start time"
    )
    prefer_nhwc: bool = Field(False, description="NHWC convolution kernels (faster FP16 convs on tensor cores)")
    gpu_mem_limit_mb: int | None = Field(None, ge=1, le=2**24, description="cap on ORT's CUDA memory arena")


class OrtCuda(OrtTarget):
    EP = "CUDAExecutionProvider"
    INSTALL = (
        'pip install "tapeout[cuda]" && pip uninstall -y onnxruntime && pip install onnxruntime-gpu '
        "(the GPU wheel replaces the CPU one under the same import name; it needs the CUDA and cuDNN "
        "versions its release notes name)"
    )
    Options = Options

    def preflight(self) -> None:
        """Listed is not usable: the provider library loads CUDA, cuDNN and a GPU only when a session asks.
        Build and check ask once, with a one-node session, before any work. Not in probe(): the inference
        process times probe() as loading the runtime library, and a CUDA context created there would move
        CUDA's start-up out of the cold start it belongs to."""
        _preload_cuda_libraries()
        why = _tiny_session_problem()
        if why:
            raise TargetUnavailable(
                f"target 'ort-cuda' is not available here: the CUDA EP is built in but did not load: {why}",
                fix=self.INSTALL,
            )

    def workload_problem(self, workload: Workload) -> str | None:
        if self.options.cuda_graph and workload.carries:
            return (
                f"[options] cuda_graph = true replays one captured run from fixed buffers, and {workload.carries} "
                "(set cuda_graph = false)"
            )
        return None

    def _providers(self) -> list:
        o = self.options
        cuda = {
            "device_id": str(o.device_id),
            "use_tf32": "1" if o.tf32 else "0",
            "cudnn_conv_algo_search": _SEARCH[o.conv_algo_search],
            "enable_cuda_graph": "1" if o.cuda_graph else "0",
            "prefer_nhwc": "1" if o.prefer_nhwc else "0",
        }
        if o.gpu_mem_limit_mb:
            cuda["gpu_mem_limit"] = str(o.gpu_mem_limit_mb * 2**20)
        return [(self.EP, cuda), "CPUExecutionProvider"]  # the CPU EP takes the nodes the CUDA EP has no kernel for

    def _io_device(self) -> tuple[str, int]:
        return ("cuda", self.options.device_id)

    def _replays_graph(self) -> bool:
        return self.options.cuda_graph

    def _new_session(self, model: str | bytes, so):
        _preload_cuda_libraries()
        try:
            return super()._new_session(model, so)
        except Exception as exc:
            text = first_line(exc)
            if self.options.cuda_graph and "graph" in text.lower():
                raise BadInput(
                    f"cuda_graph = true, but ORT cannot capture this model: {text}",
                    detail=runtime_detail(exc),
                    fix="set [options] cuda_graph = false (CUDA graphs need every node on the CUDA EP)",
                ) from None
            raise

    def _profiling_session(self, artifact: Artifact, folder: Path):
        # A graph replay is one opaque launch: profile node by node, without it.
        plain = OrtCuda(self.name, self.capabilities, self.options.model_copy(update={"cuda_graph": False}))
        return OrtTarget._profiling_session(plain, artifact, folder)

    def compile(self, model_path: Path, out_dir: Path, inputs: list[InputSpec], dims: dict[str, int]) -> Artifact:
        """The model as prepared on the host, proven loadable by the CUDA EP here (this host has the GPU)."""
        import onnx

        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / ARTIFACT_FILE
        copy_onnx(model_path, target)  # with its external-data files, each confined to the model's folder
        self._load(target, self._session_options(), f"{model_path}")
        header = onnx.load(str(target), load_external_data=False)
        fp16 = sum(i.data_type == onnx.TensorProto.FLOAT16 for i in header.graph.initializer)
        return Artifact(
            self.name,
            out_dir,
            ARTIFACT_FILE,
            meta={
                "weights": f"{fp16} of {len(header.graph.initializer)} initializers FP16",
                "tf32": self.options.tf32,
                "cuda_graph": self.options.cuda_graph,
                "fusions": "applied by ONNX Runtime's CUDA EP when the session loads (graph_optimization "
                f"= {self.options.graph_optimization})",
            },
        )


@functools.cache
def _preload_cuda_libraries() -> None:
    """CUDA and cuDNN installed as pip wheels (nvidia-cublas-cu13, nvidia-cudnn-cu13, ...: what torch pulls in)
    are not on the loader's path; ORT >= 1.21 can load them from site-packages first. directory="" keeps it
    from looking at torch (the device side has none). Best effort: the EP check after it says what failed."""
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)  # onnxruntime-gpu >= 1.21
    if preload is not None:
        with native_output_captured(), contextlib.suppress(Exception):
            preload(directory="")


def _tiny_session_problem() -> str | None:
    """None if a one-node session runs on the CUDA EP; else what ORT said (a missing libcublas, no GPU, ...)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    try:
        with native_output_captured() as said:
            # default options: with a device_id, ORT 1.31 leads with a plugin-EP lookup line, not the missing library
            sess = ort.InferenceSession(model.SerializeToString(), providers=[OrtCuda.EP, "CPUExecutionProvider"])
    except Exception as exc:
        return first_line(exc)
    if OrtCuda.EP in sess.get_providers():
        return None
    return ort_complaint(said) or "ORT fell back to the CPU EP without saying why"
