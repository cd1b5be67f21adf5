"""`check --junit FILE`: one testcase per budget, for CI systems."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING
from xml.sax.saxutils import escape, quoteattr

from tapeout.core.verdict import Verdict
from tapeout.records.report import Report

if TYPE_CHECKING:  # annotations only: the registry imports a backend when `check` creates one
    pass


def junit_xml(report: Report, strict: bool = False, seconds: float | None = None) -> str:
    """One testcase per budget, with its limit, measured value and bound as properties and in the message.
    Fail and inconclusive are failures; unmeasured and estimated are skipped, or failures under --strict
    (the file agrees with the exit code)."""
    from tapeout.reports.cells import budget_rows

    soft = {Verdict.UNMEASURED, Verdict.ESTIMATED_PASS, Verdict.ESTIMATED_FAIL}
    cases, failures, skipped = [], 0, 0
    for b, row in zip(report.budgets, budget_rows([b.to_json() for b in report.budgets]), strict=True):
        _, limit, measured, bound, _, why = row
        value = (
            "not measured" if b.measured is None else f"measured {measured}" + (f", bound {bound}" if b.bound else "")
        )
        summary = f"{b.verdict.value}: {value}, limit {limit}" + (f"; {why}" if why else "")
        props = {
            "limit": b.limit,
            "unit": b.unit,
            "measured": b.measured,
            "verdict": b.verdict.value,
            "bound_lower": b.bound[0] if b.bound else None,
            "bound_upper": b.bound[1] if b.bound else None,
            "carried": b.carried,
        }
        body = (
            "<properties>"
            + "".join(
                f"<property name={quoteattr(k)} value={quoteattr(str(v))}/>" for k, v in props.items() if v is not None
            )
            + "</properties>"
        )
        if b.verdict in (Verdict.FAIL, Verdict.INCONCLUSIVE) or (strict and b.verdict in soft):
            failures += 1
            why_failed = " (--strict)" if b.verdict in soft else ""
            body += (
                f"<failure message={quoteattr(summary + why_failed)} type={quoteattr(b.verdict.value)}>"
                f"{escape(json.dumps(b.to_json()))}</failure>"
            )
        elif b.verdict in soft:
            skipped += 1
            body += f"<skipped message={quoteattr(summary)}/>"
        else:
            body += f"<system-out>{escape(summary)}</system-out>"
        cases.append(f'    <testcase classname="tapeout.check" name={quoteattr(b.budget)}>{body}</testcase>')
    suite = quoteattr(f"tapeout check {report.project.name} ({report.profile.name})")
    timing = f' time="{seconds:.3f}"' if seconds is not None else ""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuite name={suite} tests="{len(cases)}" failures="{failures}" errors="0" '
        f'skipped="{skipped}"{timing} timestamp={quoteattr(str(report.created))}>\n'
        + "\n".join(cases)
        + "\n</testsuite>\n"
    )
