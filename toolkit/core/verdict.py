"""A budget judged: its verdict (pass, fail, inconclusive, estimated-*, unmeasured), the value, the bound
that decided it and why.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Verdict(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    ESTIMATED_PASS = "estimated-pass"
    ESTIMATED_FAIL = "estimated-fail"
    UNMEASURED = "unmeasured"


@dataclass(frozen=True)
class BudgetResult:
    """One budget judged: the measured point value, the bound used to decide, and why."""

    budget: str
    limit: float
    unit: str
    verdict: Verdict
    measured: float | None = None
    bound: tuple[float, float] | None = None
    reason: str = ""
    carried: bool = False  # judged by the build, carried over by `check` (covered by the manifest's hashes)

    def to_json(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "limit": self.limit,
            "unit": self.unit,
            "verdict": self.verdict.value,
            "measured": self.measured,
            "bound": list(self.bound) if self.bound else None,
            "reason": self.reason,
            "carried": self.carried,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BudgetResult:
        bound = data.get("bound")
        return cls(
            budget=data["budget"],
            limit=data["limit"],
            unit=data["unit"],
            verdict=Verdict(data["verdict"]),
            measured=data.get("measured"),
            bound=tuple(bound) if bound else None,
            reason=data.get("reason", ""),
            carried=data.get("carried", False),
        )
