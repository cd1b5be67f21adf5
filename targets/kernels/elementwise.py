"""What the two epilogue kernels share: rows of a contiguous 2-D view, one block of columns per program."""

from __future__ import annotations

from tapeout.targets.kernels.base import Case, Config

__all__ = ["Case", "cases", "configs", "grid"]


def cases() -> list[Case]:
    return [Case.of("MiniLM batch 1 (seq 128, MLP 1536)", rows=128, width=1536),
            Case.of("MiniLM batch 32 (seq 128, MLP 1536)", rows=4096, width=1536),
            Case.of("Llama-style decode step (MLP 5632)", rows=1, width=5632),
            Case.of("llama-40m prefill (seq 256, MLP 1536)", rows=256, width=1536),
            Case.of("edge: width not a multiple of the block", rows=5, width=1000),
            Case.of("edge: one element", rows=1, width=1)]


def configs(case: Case) -> list[Config]:
    return [Config.of(num_warps=w, BLOCK=b) for b, w in ((1024, 4), (256, 2), (2048, 8), (4096, 8))]


def grid(rows: int, width: int, block: int) -> tuple[int, int]:
    return rows, -(-width // block)
