"""What a reorder run element by element costs on this host: its strided side's conflicts in the L1 data cache.

OpenVINO's CPU plugin moves a tensor between its channels-last and plain layouts with oneDNN's generic reorder
(`reorder_f32` in its compiled graph, where no JIT kernel matches) wherever a plain op reads what a blocked one wrote:
unet-m's group norms, whose Reshape follows a conv. That loop walks the source in order and writes each element
to its place in the destination, so the C channels of one spatial position land a plane apart: C cache lines in
flight. Where the plane is a multiple of the L1's set stride (64 sets × 64 B = 4 KiB here) all C lines fall in
one set, and past the set's ways every write misses: on this 2-core AMD EPYC (48 KiB, 12 ways), 6.0 ns an element
for C = 64 channels of a 64 × 64 plane, 2.4 for 64 channels of a 16 × 16 plane (1 KiB: 16 lines a set), 0.3 for a
40 × 40 plane (6.4 KiB: 4 a set), where a copy moves an element in ~0.05. Its bytes say nothing of this: priced at
the copy bandwidth, unet-m's two such reorders were 58 µs against 2.0 ms measured.

The model: the worst set's lines over the cache's ways (the conflict ratio, from the layout's plane and channel
count and the L1's geometry in sysfs) gives the seconds per element, read off what this host measured for the
same loop (numpy's indexed assignment in the source's order, one set loaded at several ratios): over ten shapes
of OpenVINO's reorder here, its times were those of the measured loop at the same shape within 0.1-0.5 ns an
element. A device spec has no such figure: there the reorder keeps its bytes.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tapeout.records.estimate import StridedRecord

# Conflict ratios (lines in the worst set / the set's ways) the host's loop is timed at, all in one set: under the ways,
# at them, past them.
PROBE_RATIOS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True)
class Strided:
    """The L1 data cache's geometry and what one element of a strided scalar loop costs per conflict ratio."""

    sets: int
    ways: int
    line: int
    table: tuple[tuple[float, float], ...]   # (conflict ratio, seconds per element), ratios ascending

    def ratio(self, lines: int, stride: int) -> float:
        """The worst set's share of `lines` cache lines `stride` bytes apart, over the set's ways."""
        if lines <= 1 or stride <= 0:
            return 0.0
        per_set: dict[int, int] = {}
        for k in range(lines):
            s = (k * stride // self.line) % self.sets
            per_set[s] = per_set.get(s, 0) + 1
        return max(per_set.values()) / self.ways

    def seconds(self, elements: int, lines: int, stride: int) -> float:
        """Seconds for `elements` moved one at a time with `lines` streams `stride` bytes apart (0 unmeasured)."""
        if not self.table:
            return 0.0
        ratios = [r for r, _ in self.table]
        return elements * float(np.interp(self.ratio(lines, stride), ratios, [s for _, s in self.table]))

    def to_json(self) -> dict | None:
        if not self.table:
            return None
        return {"sets": self.sets, "ways": self.ways, "line": self.line,
                "ns_per_element": [[r, s * 1e9] for r, s in self.table]}

    @classmethod
    def from_json(cls, data: dict | StridedRecord | None) -> Strided | None:
        """What `to_json` wrote (validated: a malformed record raises pydantic's ValidationError); None for none."""
        if not data:
            return None
        found = data if isinstance(data, StridedRecord) else StridedRecord.model_validate(data)
        return cls(found.sets, found.ways, found.line,
                   tuple(sorted((r, ns / 1e9) for r, ns in found.ns_per_element)))


# What a roof has where no loop was measured (a calibration made before it was, a CPU whose sysfs gives no L1): such a
# reorder is priced at its bytes, as any movement.
UNMEASURED = Strided(1, 1, 1, ())


def l1_geometry(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> tuple[int, int, int] | None:
    """(sets, ways, line bytes) of this CPU's L1 data cache from sysfs; None where it does not say."""
    try:
        for index in sorted(root.glob("index*")):
            if (index / "level").read_text().strip() == "1" and (index / "type").read_text().strip() in ("Data",
                                                                                                        "Unified"):
                ways = int((index / "ways_of_associativity").read_text())
                line = int((index / "coherency_line_size").read_text())
                sets = int((index / "number_of_sets").read_text())
                return (sets, ways, line) if sets > 0 and ways > 0 and line > 0 else None
    except (OSError, ValueError):
        return None
    return None


def _loop_seconds(lines: int, plane: int, repeats: int = 5) -> float:
    """Seconds per element for a channels-last tensor of `lines` channels written plain, `plane` float32 elements a
    channel, element by element in the source's order (the best of `repeats`)."""
    source = np.random.default_rng(0).random(lines * plane, dtype=np.float32)
    order = (np.arange(lines)[None, :] * plane + np.arange(plane)[:, None]).reshape(-1)
    dest = np.empty_like(source)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        dest[order] = source
        best = min(best, time.perf_counter() - start)
    return best / source.size


@functools.lru_cache(maxsize=1)
def measured() -> Strided:
    """This host's strided loop (~0.1 s): the ways' number of channels each in its own set (no conflict), then every
    channel in one set (a plane of whole set strides, at least 16 KiB, so each element of a line is written on
    another pass) at each of PROBE_RATIOS."""
    geometry = l1_geometry()
    if geometry is None:
        return UNMEASURED
    sets, ways, line = geometry
    step = sets * line // 4                       # the set stride in float32 elements
    plane = max(step, 4096) // step * step
    points = [(ways, plane + line // 4)] + [(max(2, round(r * ways)), plane) for r in PROBE_RATIOS]
    shape = Strided(sets, ways, line, ())
    table = sorted((shape.ratio(lines, 4 * p), _loop_seconds(lines, p)) for lines, p in points)
    return Strided(sets, ways, line, tuple(table))


def layout_streams(shape: list[int], source: str, dest: str, itemsize: int) -> tuple[int, int]:
    """(Cache lines in flight, their stride in bytes) for a reorder between a plain layout (`abcd`) and its
    channels-last form (`acdb`): the channels, a plane apart. (1, 0), one stream, for any other pair of layouts."""
    plain = "abcdefgh"[:len(shape)]
    last = plain[0] + plain[2:] + plain[1] if len(shape) >= 3 else plain
    if {source, dest} != {plain, last} or len(shape) < 3:
        return 1, 0
    return int(shape[1]), int(math.prod(shape[2:])) * itemsize
