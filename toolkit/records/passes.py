"""The `passes` section of a report: each graph pass offered to the model, and whether it fired (how many
places it rewrote) or why not (its precondition did not hold, or nothing matched)."""

from __future__ import annotations

from typing import Literal

from tapeout.records.record import Record


class PassRecord(Record):
    name: str
    stage: str  # where in the build it ran: "export", "quantize", ...
    outcome: Literal["applied", "skipped"]
    rewrites: int = 0  # places rewritten (0 when skipped)
    reason: str  # what it did, or why it did not fire
