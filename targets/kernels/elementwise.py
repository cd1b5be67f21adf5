"""What the two epilogue kernels share: rows of a contiguous 2-D view, one block of columns per program, the
MLP shapes of the samples, one tuning space, and a case from the matched chain's output."""

from __future__ import annotations

from typing import ClassVar

from tapeout.targets.kernels.base import Case, Config, Kernel, concrete


class Epilogue(Kernel):
    shrinkable: ClassVar[tuple[str, ...]] = ("rows",)

    def cases(self) -> list[Case]:
        return [
            Case.of("MiniLM batch 1 (seq 128, MLP 1536)", rows=128, width=1536),
            Case.of("MiniLM batch 32 (seq 128, MLP 1536)", rows=4096, width=1536),
            Case.of("Llama-style decode step (MLP 5632)", rows=1, width=5632),
            Case.of("llama-40m prefill (seq 256, MLP 1536)", rows=256, width=1536),
            Case.of("edge: width not a multiple of the block", rows=5, width=1000),
            Case.of("edge: one element", rows=1, width=1),
        ]

    def configs(self, case: Case | None) -> list[Config]:
        return [Config.of(num_warps=w, BLOCK=b) for b, w in ((1024, 4), (256, 2), (2048, 8), (4096, 8))]


def grid(rows: int, width: int, block: int) -> tuple[int, int]:
    return rows, -(-width // block)


def case_of(val) -> Case:
    """rows × width of a matched node's output (its `meta["val"]`), at the sizes being priced."""
    width = concrete(val.shape[-1])
    return Case.of(rows=concrete(val.numel()) // max(width, 1), width=width)
