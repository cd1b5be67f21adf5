"""What the GPU benchmarks check first: a torch that sees a CUDA GPU, or exit 4 (DESIGN §4: the target
is not available here) with one line saying why."""

from __future__ import annotations

import sys
from pathlib import Path


def fail(message: str) -> None:
    print(f"bench/{Path(sys.argv[0]).name}: {message}", file=sys.stderr)
    sys.exit(4)


def cuda_torch(what_for: str = ""):
    """torch, where it is installed and sees a CUDA GPU; `what_for` ends the message where it does not."""
    try:
        import torch
    except ImportError:
        fail("torch is not installed")
    if not torch.cuda.is_available():
        fail("no CUDA GPU here (torch.cuda.is_available() is False)" + (f"; {what_for}" if what_for else ""))
    return torch
