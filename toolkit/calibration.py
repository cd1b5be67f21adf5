"""Efficiency factors fitted from measured per-op profiles, per device and target, with their provenance.

A calibration is made from build (or check) dirs whose latency was measured on the device itself
(never through an emulator or a stand-in). For each one it records, per kernel class, the
roofline seconds of the model's kernels (`kernels.py`) and the seconds the runtime's own profiler
spent in ops of that class (scaled to the timed p50, since the profiler inflates what it times).
The fit:

- efficiency per class and build precision: pooled roofline seconds / pooled measured seconds
  (per class over all precisions where a precision has no record);
- overhead: what the p50 holds beyond the classes' predicted time, as a fixed part plus a part
  per kernel (least squares, both non-negative);
- tails: the median p90/p50 and p99/p50 of the records, so p90 and p99 budgets can be estimated;
- the error band: every model left out in turn, the rest fitted, the left-out model's builds
  predicted. The band is the range of those errors, so it is never scored on what it was fitted to.

Where: `calibration/<device>--<target>.json` in the user's calibration folder ($TAPEOUT_CALIBRATION,
default ~/.local/share/tapeout/calibration), then the same name shipped beside the device specs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tapeout.errors import BadInput
from tapeout.paths import confined

SCHEMA = "tapeout.calibration/1"


@dataclass
class Record:
    """One measured build: what the roofline says per class, what the profiler measured per class."""

    model: str                  # project name: the unit left out together
    precision: str              # the build profile's precision
    source: str                 # the build dir it came from
    created: str
    p50_s: float
    tails: dict[str, float]     # p90/p50, p99/p50
    roof_s: dict[str, float]    # class@precision -> roofline seconds
    measured_s: dict[str, float]  # class -> profiler seconds per inference, scaled to the p50
    kernels: int

    def roof_by_class(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, seconds in self.roof_s.items():
            cls = key.split("@")[0]
            out[cls] = out.get(cls, 0.0) + seconds
        return out


@dataclass
class Fit:
    efficiency: dict[str, float]        # "class@precision" (build precision) and "class" -> factor
    fixed_s: float
    per_kernel_s: float
    tails: dict[str, float]

    def predict(self, roof_s: dict[str, float], kernels: int, precision: str) -> float:
        total = self.fixed_s + self.per_kernel_s * kernels
        for key, seconds in roof_s.items():
            total += seconds / self.factor(key.split("@")[0], precision)
        return total

    def factor(self, cls: str, precision: str) -> float:
        return self.efficiency.get(f"{cls}@{precision}") or self.efficiency.get(cls) or self.efficiency.get("*", 1.0)


def fit(records: list[Record]) -> Fit:
    pooled: dict[str, list[float]] = {}
    for r in records:
        roofs = r.roof_by_class()
        for cls in set(roofs) | set(r.measured_s):
            roof, measured = roofs.get(cls, 0.0), r.measured_s.get(cls, 0.0)
            if roof <= 0:
                continue   # the profiler timed ops the model has no kernel of (layout reorders): overhead
            for key in (f"{cls}@{r.precision}", cls, "*"):
                entry = pooled.setdefault(key, [0.0, 0.0])
                entry[0] += roof
                entry[1] += measured
    efficiency = {k: roof / measured for k, (roof, measured) in pooled.items() if measured > 0}
    partial = Fit(efficiency, 0.0, 0.0, {})
    residual = np.array([r.p50_s - partial.predict(r.roof_s, 0, r.precision) for r in records])
    counts = np.array([float(r.kernels) for r in records])
    fixed, per_kernel = _nonnegative_line(counts, residual, 1 / np.array([r.p50_s for r in records]))
    tails = {q: float(np.median([r.tails[q] for r in records if q in r.tails] or [1.0])) for q in ("p90", "p99")}
    return Fit(efficiency, fixed, per_kernel, tails)


def _nonnegative_line(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """a + b·x fitted to y by weighted least squares with a, b ≥ 0 (the candidate active sets). The
    weights are 1 / measured p50, so the error minimised is relative: a 20 µs model counts as much as a
    20 ms one, as it does in the ±15 % target."""
    def solve(columns: list[np.ndarray]) -> np.ndarray:
        a = np.stack([c * w for c in columns], axis=1)
        return np.linalg.lstsq(a, y * w, rcond=None)[0]

    ones = np.ones_like(x)
    candidates = [(0.0, 0.0), (float(solve([ones])[0]), 0.0), (0.0, float(solve([x])[0]))]
    if len(x) >= 2 and np.ptp(x) > 0:
        a, b = solve([ones, x])
        candidates.append((float(a), float(b)))
    best, best_err = (0.0, 0.0), float("inf")
    for a, b in candidates:
        a, b = max(a, 0.0), max(b, 0.0)
        err = float(np.sum(((a + b * x - y) * w) ** 2))
        if err < best_err:
            best, best_err = (a, b), err
    return best


@dataclass
class Calibration:
    device: str
    target: str
    kind: str
    roof: dict[str, Any]                 # the roof the records were computed against (Roof.to_json())
    records: list[Record]
    fit: Fit
    held_out: list[dict[str, Any]] = field(default_factory=list)   # per build: predicted, measured, error
    created: str = ""
    tapeout: str = ""

    @property
    def band(self) -> tuple[float, float] | None:
        """Relative error range of the held-out predictions: (lowest, highest) of predicted/measured - 1."""
        errors = [h["error"] for h in self.held_out]
        if len(errors) < 2:
            return None
        return float(min(errors)), float(max(errors))

    def within(self, tolerance: float = 0.15) -> tuple[int, int]:
        return sum(abs(h["error"]) <= tolerance for h in self.held_out), len(self.held_out)

    def summary(self) -> str:
        models = sorted({r.model for r in self.records})
        band = self.band
        hit, total = self.within()
        return (f"{len(self.records)} measured builds of {len(models)} models ({', '.join(models)})"
                + (f"; held-out error {band[0]:+.0%} to {band[1]:+.0%}, {hit}/{total} within ±15 %" if band else
                   "; too few models to hold one out: no error band"))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "device": self.device, "target": self.target, "kind": self.kind, "roof": self.roof,
            "created": self.created, "tapeout": self.tapeout,
            "fit": {"efficiency": self.fit.efficiency, "fixed_us": self.fit.fixed_s * 1e6,
                    "per_kernel_us": self.fit.per_kernel_s * 1e6, "tails": self.fit.tails},
            "band": list(self.band) if self.band else None,
            "held_out": self.held_out,
            "records": [vars(r) for r in self.records],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str) -> Calibration:
        try:
            if data.get("schema") != SCHEMA:
                raise ValueError(f"schema is {data.get('schema')!r}, not {SCHEMA}")
            f = data["fit"]
            return cls(device=str(data["device"]), target=str(data["target"]), kind=str(data["kind"]),
                       roof=dict(data["roof"]), records=[Record(**r) for r in data["records"]],
                       fit=Fit({str(k): float(v) for k, v in f["efficiency"].items()}, float(f["fixed_us"]) / 1e6,
                               float(f["per_kernel_us"]) / 1e6, {str(k): float(v) for k, v in f["tails"].items()}),
                       held_out=list(data.get("held_out") or []), created=str(data.get("created", "")),
                       tapeout=str(data.get("tapeout", "")))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadInput(f"{where} is not a {SCHEMA} file ({type(exc).__name__}: {exc})",
                           fix="remake it with `tapeout calibrate`; calibrations are never edited by hand") from None


def held_out(records: list[Record]) -> list[dict[str, Any]]:
    """Leave each model out, fit on the rest, predict its builds: the only errors the band may come from."""
    out = []
    for model in sorted({r.model for r in records}):
        rest = [r for r in records if r.model != model]
        if not rest:
            continue
        f = fit(rest)
        for r in (r for r in records if r.model == model):
            predicted = f.predict(r.roof_s, r.kernels, r.precision)
            out.append({"model": model, "precision": r.precision, "source": r.source,
                        "predicted_ms": predicted * 1e3, "measured_ms": r.p50_s * 1e3,
                        "error": predicted / r.p50_s - 1})
    return out


# ---------------------------------------------------------------- where calibrations live


def user_folder() -> Path:
    return Path(os.environ.get("TAPEOUT_CALIBRATION") or Path.home() / ".local" / "share" / "tapeout" / "calibration")


def shipped_folder() -> Path:
    import importlib.resources

    return Path(str(importlib.resources.files("tapeout.profiles.devices"))) / "calibration"


def file_name(device: str, target: str) -> str:
    return f"{device}--{target}.json"


def find(device: str, target: str) -> tuple[Calibration, Path] | None:
    """The user's calibration for (device, target), else the shipped one, else None."""
    for folder in (user_folder(), shipped_folder()):
        path = confined(folder, file_name(device, target), "calibration file")
        if path.is_file():
            return load(path), path
    return None


def load(path: Path) -> Calibration:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"{path} is not readable JSON ({type(exc).__name__})",
                       fix="remake it with `tapeout calibrate`") from None
    return Calibration.from_json(data, str(path))


def make(found: list[tuple[Record, dict]], created: str, version: str) -> list[Calibration]:
    """One calibration per (device, target) among the records, each with its held-out errors."""
    groups: dict[tuple[str, str], list[tuple[Record, dict]]] = {}
    for record, meta in found:
        groups.setdefault((meta["device"], meta["target"]), []).append((record, meta))
    out = []
    for (device, target), items in sorted(groups.items()):
        records = [r for r, _ in items]
        meta = items[0][1]
        out.append(Calibration(device=device, target=target, kind=meta["kind"], roof=meta["roof"], records=records,
                               fit=fit(records), held_out=held_out(records), created=created, tapeout=version))
    return out


def save(cal: Calibration, folder: Path) -> Path:
    from tapeout import builddir

    folder.mkdir(parents=True, exist_ok=True)
    path = confined(folder, file_name(cal.device, cal.target), "calibration file")
    builddir.write_json(path, cal.to_json())
    return path
