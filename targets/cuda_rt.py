"""The few CUDA runtime calls a TensorRT session needs (device buffers, a stream, copies, CUDA graphs,
which GPU this is), through ctypes on libcudart: the device side then needs no torch, CuPy or
cuda-python, only the CUDA runtime library the TensorRT wheel already brings.

Every call is checked: a CUDA error is one line naming the call and CUDA's own message.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
from dataclasses import dataclass

from tapeout.core.errors import TapeoutError, TargetUnavailable

H2D, D2H = 1, 2  # cudaMemcpyKind
_ATTR_CC_MAJOR, _ATTR_CC_MINOR = 75, 76  # cudaDevAttrComputeCapabilityMajor / Minor
_CAPTURE_GLOBAL = 0  # cudaStreamCaptureModeGlobal
_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")
INSTALL = (
    "install the CUDA runtime (the tensorrt wheel brings nvidia-cuda-runtime; or the CUDA toolkit) "
    "and the NVIDIA driver"
)


class CudaError(TapeoutError):
    """A CUDA runtime call failed on the device."""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: tuple[int, int]
    driver: str  # the driver's CUDA version (cudaDriverGetVersion), e.g. "13.0"
    runtime: str

    @property
    def sm(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


@functools.cache
def library() -> ctypes.CDLL:
    """libcudart: by soname first, then from the pip wheels (nvidia/*/lib) beside this interpreter."""
    tried = []
    candidates = list(_NAMES)
    for base in sys.path:
        candidates += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", "libcudart.so*")), reverse=True)
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            tried.append(str(exc).split(":")[-1].strip() or name)
    raise TargetUnavailable(
        f"the CUDA runtime library (libcudart) is not loadable here ({'; '.join(dict.fromkeys(tried))[:200]})",
        fix=INSTALL,
    )


def _check(call: str, status: int) -> None:
    if status != 0:
        lib = library()
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        message = (lib.cudaGetErrorString(status) or b"unknown error").decode(errors="replace")
        if call in ("cudaGetDeviceCount", "cudaSetDevice"):
            raise TargetUnavailable(
                f"CUDA cannot use a GPU here: {call} failed ({message}, error {status})", fix=INSTALL
            )
        raise CudaError(
            f"CUDA {call} failed: {message} (error {status})",
            fix="check the GPU with nvidia-smi; another process may hold its memory",
        )


def device_count() -> int:
    count = ctypes.c_int(0)
    _check("cudaGetDeviceCount", library().cudaGetDeviceCount(ctypes.byref(count)))
    return count.value


def gpu(index: int) -> Gpu:
    lib = library()
    count = device_count()
    if index >= count:
        raise TargetUnavailable(
            f"device_id {index} names no GPU: CUDA sees {count}",
            fix=f"set [options] device_id below {count} (after CUDA_VISIBLE_DEVICES)",
        )
    major, minor, driver, runtime = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    _check("cudaDeviceGetAttribute", lib.cudaDeviceGetAttribute(ctypes.byref(major), _ATTR_CC_MAJOR, index))
    _check("cudaDeviceGetAttribute", lib.cudaDeviceGetAttribute(ctypes.byref(minor), _ATTR_CC_MINOR, index))
    _check("cudaDriverGetVersion", lib.cudaDriverGetVersion(ctypes.byref(driver)))
    _check("cudaRuntimeGetVersion", lib.cudaRuntimeGetVersion(ctypes.byref(runtime)))
    # cudaDeviceProp's layout changes between CUDA versions, but `name` (char[256]) is its first field
    props = ctypes.create_string_buffer(8192)
    _check("cudaGetDeviceProperties", lib.cudaGetDeviceProperties(props, index))
    name = props.raw[:256].split(b"\0", 1)[0].decode(errors="replace")

    def version(v: int) -> str:
        return f"{v.value // 1000}.{(v.value % 1000) // 10}"

    return Gpu(index, name, (major.value, minor.value), version(driver), version(runtime))


def set_device(index: int) -> None:
    _check("cudaSetDevice", library().cudaSetDevice(index))


class Buffer:
    """Device memory of a fixed size, freed with the object."""

    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        self.ptr = ctypes.c_void_p()
        _check("cudaMalloc", library().cudaMalloc(ctypes.byref(self.ptr), ctypes.c_size_t(self.nbytes)))

    @property
    def address(self) -> int:
        return int(self.ptr.value or 0)

    def __del__(self) -> None:
        if getattr(self, "ptr", None) is not None and self.ptr.value:
            library().cudaFree(self.ptr)
            self.ptr = None


class Stream:
    def __init__(self) -> None:
        self.handle = ctypes.c_void_p()
        _check("cudaStreamCreate", library().cudaStreamCreate(ctypes.byref(self.handle)))
        self.graph_exec: ctypes.c_void_p | None = None

    @property
    def address(self) -> int:
        return int(self.handle.value or 0)

    def copy(self, dst: int, src: int, nbytes: int, kind: int) -> None:
        _check(
            "cudaMemcpyAsync",
            library().cudaMemcpyAsync(
                ctypes.c_void_p(dst), ctypes.c_void_p(src), ctypes.c_size_t(nbytes), kind, self.handle
            ),
        )

    def synchronize(self) -> None:
        _check("cudaStreamSynchronize", library().cudaStreamSynchronize(self.handle))

    def capture(self, enqueue) -> None:
        """Record what `enqueue()` launches on this stream as a CUDA graph, replayed by `replay()`."""
        lib = library()
        graph, exec_ = ctypes.c_void_p(), ctypes.c_void_p()
        _check("cudaStreamBeginCapture", lib.cudaStreamBeginCapture(self.handle, _CAPTURE_GLOBAL))
        try:
            enqueue()
        finally:
            _check("cudaStreamEndCapture", lib.cudaStreamEndCapture(self.handle, ctypes.byref(graph)))
        _check("cudaGraphInstantiate", lib.cudaGraphInstantiate(ctypes.byref(exec_), graph, ctypes.c_ulonglong(0)))
        self.graph_exec = exec_

    def replay(self) -> None:
        _check("cudaGraphLaunch", library().cudaGraphLaunch(self.graph_exec, self.handle))

    def __del__(self) -> None:
        if getattr(self, "handle", None) is not None and self.handle.value:
            library().cudaStreamDestroy(self.handle)
            self.handle = None
