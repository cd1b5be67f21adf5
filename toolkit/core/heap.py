"""Memory a stage has let go of, handed back to the system, so the next stage's peak does not stack on it.

Standard library only: every layer may use it.
"""

from __future__ import annotations

import functools
import gc


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None (another C library, another OS)."""
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def return_freed_memory() -> None:
    """Hand freed heap pages back: glibc keeps them (an exported language model's protobuf, its serialized copies)
    and the next allocation's peak would stack on them (0.45 GB after the 135 M decoder's export). A few
    milliseconds."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def collect_and_return() -> None:
    """Collect the garbage in reference cycles (an ONNX quantizer's model wrapper, an exporter's graphs), then hand
    the freed pages back: for a stage that drops a whole model before the next one loads another."""
    gc.collect()
    return_freed_memory()
