"""Efficiency factors fitted from measured per-op profiles, per device and target, with their provenance.

A calibration is made from build (or check) dirs whose latency was measured on the device itself
(never through an emulator or a stand-in). For each one it records, per kernel class, the
roofline seconds of the model's kernels (`cost_units.py`) and the seconds the runtime's own profiler
spent in ops of that class (as recorded; scaled down to the timed p50 only where they add up to
more: `bottleneck.profiler_scale`).
The fit:

- per class and build precision, the measured seconds as (seconds per kernel) × kernels +
  (a multiple of) the roofline seconds: small kernels cost their dispatch, large ones approach
  the roof (the class pooled over precisions where fewer than two models measured a precision);
  a class whose roof is a limit its kernels cannot beat (`MIN_MULTIPLE`: the recurrent cell, its
  steps priced at the measured cache bandwidth) never fits a multiple under 1;
- outside the ops (framework time, and ops the runtime adds that the model has none of, such as
  layout reorders): a fixed part, a part per kernel, and a share of the time in ops (ONNX Runtime's
  CPU EP spends 4-13 % of a millisecond-scale run between its ops: thread-pool hand-offs and
  allocations that grow with the work, not with the kernel count);
- both by least squares on the relative error, every term non-negative;
- tails: the median p90/p50 and p99/p50 of the records, so p90 and p99 budgets can be estimated;
- the error band: every model left out in turn, the rest fitted, the left-out model's builds
  predicted. The band is the range of those errors, so it is never scored on what it was fitted to.

Where: `calibration/<device>--<target>.json` in the user's calibration folder ($TAPEOUT_CALIBRATION,
default ~/.local/share/tapeout/calibration), then the same name shipped beside the device specs
($TAPEOUT_SHIPPED_CALIBRATION in its place; empty: none). A CPU class's calibration (`cpu-intel-amx--openvino.json`,
`tapeout calibrate --class`) stands in for a host of that class that has none of its own.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from tapeout.core.errors import BadInput
from tapeout.core.files import write_json
from tapeout.core.paths import confined

SCHEMA = "tapeout.calibration/1"


class _FileModel(BaseModel):
    # a calibration file is read back and trusted for arithmetic: every field typed, nothing extra, no NaN
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Record(_FileModel):
    """One measured build: what the roofline says per class, what the profiler measured per class."""

    model: str  # project name: the unit left out together
    precision: str  # the build profile's precision
    source: str  # the build dir it came from
    created: str
    p50_s: float = Field(gt=0)
    tails: dict[str, float]  # p90/p50, p99/p50
    roof_s: dict[str, float]  # class@precision -> roofline seconds
    measured_s: dict[str, float]  # class -> profiler seconds per inference, capped at the p50
    kernels: int = Field(ge=0)
    counts: dict[str, int] = Field(default_factory=dict)  # class -> the model's kernel launches of that class

    def roof_by_class(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, seconds in self.roof_s.items():
            cls = key.split("@")[0]
            out[cls] = out.get(cls, 0.0) + seconds
        return out

    def outside_s(self) -> float:
        """The p50 less the ops of classes the model has kernels of: framework time, and ops the runtime
        adds that the model has none of (layout reorders)."""
        return self.p50_s - sum(v for cls, v in self.measured_s.items() if self.counts.get(cls))


@dataclass
class Fit:
    """Per class (and build precision): seconds per kernel plus a multiple of the roofline seconds; outside
    the ops, a fixed part, a part per kernel and a share of the ops' time."""

    per_class: dict[str, tuple[float, float]]  # "class@precision" and "class" -> (s per kernel, x roofline)
    fixed_s: float
    per_kernel_s: float
    tails: dict[str, float]
    outside_share: float = 0.0  # seconds outside the ops per second in them

    def terms(self, cls: str, precision: str) -> tuple[float, float]:
        return (
            self.per_class.get(f"{cls}@{precision}") or self.per_class.get(cls) or self.per_class.get("*") or (0.0, 1.0)
        )

    def kernel_s(self, cls: str, precision: str, roof_s: float, launches: int = 1) -> float:
        """One kernel's predicted seconds, its share of the outside-op time included."""
        per_kernel, multiple = self.terms(cls, precision)
        return self.per_kernel_s + (1 + self.outside_share) * (per_kernel * launches + multiple * roof_s)

    def predict(self, roof_s: dict[str, float], counts: dict[str, int], precision: str, kernels: int) -> float:
        """A build's p50: its classes' roofline seconds and launches (`counts`), and its `kernels`, each one dispatch
        outside the ops however many times it runs."""
        roofs: dict[str, float] = {}
        for key, seconds in roof_s.items():
            roofs[key.split("@")[0]] = roofs.get(key.split("@")[0], 0.0) + seconds
        ops = 0.0
        for cls, n in counts.items():
            per_kernel, multiple = self.terms(cls, precision)
            ops += per_kernel * n + multiple * roofs.get(cls, 0.0)
        return self.fixed_s + self.per_kernel_s * kernels + (1 + self.outside_share) * ops

    def efficiency(self) -> dict[str, float]:
        """Roofline time / time spent above the per-kernel cost: the share of the roof a class reaches."""
        return {k: (1 / m if m > 0 else None) for k, (_, m) in self.per_class.items()}  # None: no roofline term


# Classes whose roof is a limit the kernels cannot beat, so the fitted multiple may not go under it. The
# recurrent cell's steps are priced at the cache bandwidth measured for its weights' size, not DRAM's:
# without the floor, models whose time per step was all dispatch (LSTMs of hidden 32-64, their roof per
# step a constant share of it) fitted 1 µs a step and no roofline term, and a hidden-256 LSTM whose
# weights take 12 µs a step to stream from L2 was predicted at a ninth of its time.
MIN_MULTIPLE = {"recurrent": 1.0}


def fit(records: list[Record]) -> Fit:
    rows: dict[str, list[tuple[float, float, float, float]]] = {}
    models: dict[str, set[str]] = {}
    for r in records:
        roofs = r.roof_by_class()
        for cls, n in r.counts.items():
            if not n:
                continue
            for key in (f"{cls}@{r.precision}", cls, "*"):
                rows.setdefault(key, []).append(
                    (float(n), roofs.get(cls, 0.0), r.measured_s.get(cls, 0.0), 1 / r.p50_s)
                )
                models.setdefault(key, set()).add(r.model)
    per_class = {}
    for key, data in rows.items():
        if len(models[key]) < 2 and "@" in key:
            continue  # one model says nothing general about this precision: the class's pooled fit stands in
        n, roof, measured, w = (np.array(col) for col in zip(*data, strict=True))
        floor = MIN_MULTIPLE.get(key.split("@")[0], 0.0)
        per_launch, multiple = _nonnegative([n, roof], measured - floor * roof, w)
        per_class[key] = (per_launch, multiple + floor)
    outside = np.array([r.outside_s() for r in records])
    # per kernel, not per launch: a runtime dispatches an LSTM once however many steps it runs (OpenVINO's toy LSTM,
    # 3 kernels and 49 steps, had been priced 49 dispatches outside its ops: +41 %, now +20 %)
    counts = np.array([float(r.kernels) for r in records])
    in_ops = np.array([r.p50_s - r.outside_s() for r in records])
    weights = 1 / np.array([r.p50_s for r in records])
    fixed, per_kernel, share = _nonnegative([np.ones_like(counts), counts, in_ops], outside, weights)
    tails = {q: float(np.median([r.tails[q] for r in records if q in r.tails] or [1.0])) for q in ("p90", "p99")}
    return Fit(per_class, fixed, per_kernel, tails, share)


def _nonnegative(columns: list[np.ndarray], y: np.ndarray, w: np.ndarray) -> tuple[float, ...]:
    """Σ c_i·x_i fitted to y by weighted least squares with every c_i ≥ 0 (every active set: two or
    three terms). The weights are 1 / the build's measured p50, so the error minimised is relative: a
    20 µs model counts as much as a 20 ms one, as it does in the ±15 % target."""
    x = np.stack(columns, axis=1)
    best, best_err = (0.0,) * len(columns), float("inf")
    for active in itertools.product((False, True), repeat=len(columns)):
        picked = [i for i, on in enumerate(active) if on]
        if len(picked) > len(y):
            continue
        c = np.zeros(len(columns))
        if picked:
            c[picked] = np.linalg.lstsq(x[:, picked] * w[:, None], y * w, rcond=None)[0]
        if (c < 0).any():
            continue
        err = float(np.sum(((x @ c - y) * w) ** 2))
        if err < best_err:
            best, best_err = tuple(float(v) for v in c), err
    return best


@dataclass
class Calibration:
    device: str
    target: str
    kind: str
    roof: dict[str, Any]  # the roof the records were computed against (Roof.to_json())
    records: list[Record]
    fit: Fit
    held_out: list[dict[str, Any]] = field(default_factory=list)  # per build: predicted, measured, error
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
        return f"{len(self.records)} measured builds of {len(models)} models ({', '.join(models)})" + (
            f"; held-out error {band[0]:+.0%} to {band[1]:+.0%}, {hit}/{total} within ±15 %"
            if band
            else "; too few models to hold one out: no error band"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "device": self.device,
            "target": self.target,
            "kind": self.kind,
            "roof": self.roof,
            "created": self.created,
            "tapeout": self.tapeout,
            "fit": {
                "per_class": {
                    k: {"per_kernel_us": a * 1e6, "roofline_multiple": m} for k, (a, m) in self.fit.per_class.items()
                },
                "efficiency": self.fit.efficiency(),
                "fixed_us": self.fit.fixed_s * 1e6,
                "per_kernel_us": self.fit.per_kernel_s * 1e6,
                "outside_share": self.fit.outside_share,
                "tails": self.fit.tails,
            },
            "band": list(self.band) if self.band else None,
            "held_out": self.held_out,
            "records": [r.model_dump() for r in self.records],
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> Calibration:
        from pydantic import ValidationError

        from tapeout.core.config import describe_validation_error

        try:
            f = CalibrationFile.model_validate(data)
        except ValidationError as exc:
            detail = describe_validation_error(Path(where), CalibrationFile, exc)
            raise BadInput(f"not a {SCHEMA} file: {detail}", fix=_REMAKE) from None
        return cls(
            device=f.device,
            target=f.target,
            kind=f.kind,
            roof=f.roof.model_dump(exclude_none=True),
            records=f.records,
            fit=Fit(
                {k: (v.per_kernel_us / 1e6, v.roofline_multiple) for k, v in f.fit.per_class.items()},
                f.fit.fixed_us / 1e6,
                f.fit.per_kernel_us / 1e6,
                f.fit.tails,
                f.fit.outside_share,
            ),
            held_out=f.held_out,
            created=f.created,
            tapeout=f.tapeout,
        )


_REMAKE = "remake it with `tapeout calibrate`; calibrations are never edited by hand"


class _ClassTerms(_FileModel):
    per_kernel_us: float = Field(ge=0)
    roofline_multiple: float = Field(ge=0)


class _FitRecord(_FileModel):
    per_class: dict[str, _ClassTerms]
    efficiency: dict[str, float | None]  # written for readers; the fit is per_class
    fixed_us: float = Field(ge=0)
    per_kernel_us: float = Field(ge=0)
    outside_share: float = Field(0.0, ge=0)  # absent from files written before it was fitted
    tails: dict[str, float]


class _RoofRecord(_FileModel):
    """The roof the records were priced against (`Roof.to_json`): estimates with the file use it again."""

    name: str = ""
    kind: str = ""
    # bounded far above any device (tens of thousands of TOPS, tens of TB/s) and far below float's range
    peaks_tops: dict[str, Annotated[float, Field(gt=0, le=1e6)]] = Field(default_factory=dict)
    bandwidth_gbs: float | None = Field(None, gt=0, le=1e6)
    source: str = ""
    notes: list[str] = Field(default_factory=list)
    # absent from files written before the host's cache bandwidth was measured
    cache_bandwidth_gbs: list[tuple[PositiveInt, Annotated[float, Field(gt=0, le=1e6)]]] | None = None
    # written by earlier versions, read and ignored: a reorder's strided loop, one thread's read stream
    strided: dict[str, Any] | None = None
    stream_gbs: float | None = Field(None, gt=0)


class CalibrationFile(_FileModel):
    """`tapeout.calibration/1`, as `Calibration.to_json` writes it."""

    schema_id: Literal["tapeout.calibration/1"] = Field(alias="schema")
    device: str
    target: str
    kind: str
    roof: _RoofRecord
    created: str = ""
    tapeout: str = ""
    fit: _FitRecord
    band: list[float] | None = None
    held_out: list[dict[str, Any]] = Field(default_factory=list)
    records: list[Record]


def held_out(records: list[Record]) -> list[dict[str, Any]]:
    """Leave each model out, fit on the rest, predict its builds: the only errors the band may come from."""
    out = []
    for model in sorted({r.model for r in records}):
        rest = [r for r in records if r.model != model]
        if not rest:
            continue
        f = fit(rest)
        for r in (r for r in records if r.model == model):
            predicted = f.predict(r.roof_s, r.counts, r.precision, r.kernels)
            out.append(
                {
                    "model": model,
                    "precision": r.precision,
                    "source": r.source,
                    "predicted_ms": predicted * 1e3,
                    "measured_ms": r.p50_s * 1e3,
                    "error": predicted / r.p50_s - 1,
                }
            )
    return out


# ---------------------------------------------------------------- where calibrations live


def user_folder() -> Path:
    return Path(os.environ.get("TAPEOUT_CALIBRATION") or Path.home() / ".local" / "share" / "tapeout" / "calibration")


def shipped_folder() -> Path | None:
    """The calibrations shipped with tapeout; $TAPEOUT_SHIPPED_CALIBRATION in their place (empty: none, so a test
    suite's estimates do not depend on what ships)."""
    import importlib.resources

    if "TAPEOUT_SHIPPED_CALIBRATION" in os.environ:
        return Path(os.environ["TAPEOUT_SHIPPED_CALIBRATION"]) if os.environ["TAPEOUT_SHIPPED_CALIBRATION"] else None
    return Path(str(importlib.resources.files("tapeout.profiles.devices"))) / "calibration"


def file_name(device: str, target: str) -> str:
    return f"{device}--{target}.json"


def find(device: str, target: str) -> tuple[Calibration, Path] | None:
    """The user's calibration for (device, target), else the shipped one, else None."""
    for folder in (user_folder(), shipped_folder()):
        if folder is None:
            continue
        path = confined(folder, file_name(device, target), "calibration file")
        if path.is_file():
            return load(path), path
    return None


def load(path: Path) -> Calibration:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadInput(f"{path} is not readable JSON ({type(exc).__name__})", fix=_REMAKE) from None
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
        out.append(
            Calibration(
                device=device,
                target=target,
                kind=meta["kind"],
                roof=meta["roof"],
                records=records,
                fit=fit(records),
                held_out=held_out(records),
                created=created,
                tapeout=version,
            )
        )
    return out


def save(cal: Calibration, folder: Path) -> Path:

    folder.mkdir(parents=True, exist_ok=True)
    path = confined(folder, file_name(cal.device, cal.target), "calibration file")
    write_json(path, cal.to_json())
    return path
