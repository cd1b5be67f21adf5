"""Output agreement between a reference and a candidate: max-abs, max-rel, cosine, per output."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class OutputParity:
    output: str
    max_abs: float
    max_rel: float
    cosine: float
    within_tolerance: bool

    def to_json(self) -> dict:
        return asdict(self)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    denom = np.linalg.norm(a64) * np.linalg.norm(b64)
    if denom == 0:
        return 1.0 if np.array_equal(a64, b64) else 0.0
    return float(np.dot(a64, b64) / denom)


def compare_one(name: str, reference: np.ndarray, actual: np.ndarray, atol: float, rtol: float) -> OutputParity:
    reference, actual = np.asarray(reference), np.asarray(actual)
    if reference.shape != actual.shape:
        return OutputParity(name, float("inf"), float("inf"), 0.0, False)
    ref, act = reference.astype(np.float64), actual.astype(np.float64)
    diff = np.abs(act - ref)
    significant = np.abs(ref) > atol  # relative error is meaningless next to zero
    max_rel = float((diff[significant] / np.abs(ref[significant])).max()) if significant.any() else 0.0
    ok = bool(np.all(diff <= atol + rtol * np.abs(ref))) and bool(np.isfinite(act).all())
    return OutputParity(name, float(diff.max()) if diff.size else 0.0, max_rel, cosine(act, ref), ok)


def compare(
    reference: list[dict[str, np.ndarray]], actual: list[dict[str, np.ndarray]], atol: float, rtol: float
) -> list[OutputParity]:
    """Per output, the worst over all samples (max errors, min cosine)."""
    results: dict[str, OutputParity] = {}
    for ref_sample, act_sample in zip(reference, actual, strict=True):
        for name, ref in ref_sample.items():
            one = compare_one(name, ref, act_sample[name], atol, rtol)
            prev = results.get(name)
            results[name] = (
                one
                if prev is None
                else OutputParity(
                    name,
                    max(prev.max_abs, one.max_abs),
                    max(prev.max_rel, one.max_rel),
                    min(prev.cosine, one.cosine),
                    prev.within_tolerance and one.within_tolerance,
                )
            )
    return list(results.values())


def worst(results: list[OutputParity]) -> OutputParity:
    return min(results, key=lambda r: (r.within_tolerance, r.cosine, -r.max_abs))
