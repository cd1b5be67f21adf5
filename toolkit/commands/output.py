"""How a build's or a check's result is printed: the verdict table and the latency line, or the report as JSON."""

from __future__ import annotations

import json

from tapeout.core import workload
from tapeout.core.console import UI
from tapeout.records.report import Report
from tapeout.reports.terminal import verdict_table


def show(report: Report, as_json: bool, title: str) -> int:
    """Print `report` and return its exit code."""
    data = report.to_json()
    ui = UI()
    if as_json:
        print_json(data)
        return report.exit_code
    ui.out.print(verdict_table(title, data["budgets"]))
    for name, lat in (
        ("latency", data["measurement"].get("latency_ms")),
        ("with host copies", data["measurement"].get("latency_e2e_ms")),
    ):
        if not lat:
            continue
        q = lat["quantiles"]
        ui.out.print(
            f"{name} p50 {q['p50']['point']:.3f} ms [{q['p50']['lower']:.3f}, {q['p50']['upper']:.3f}] · "
            f"p90 {q['p90']['point']:.3f} ms [{q['p90']['lower']:.3f}, {q['p90']['upper'] or float('inf'):.3f}] · "
            f"{lat['count']} runs / {lat['repeats']} processes"
            + (" · EMULATED: not the device's timings" if report.target.emulated else ""),
            markup=False,
        )
    if data.get("workload"):
        line = workload.get(data["workload"]["kind"]).one_line(data["workload"], data.get("estimate"))
        ui.out.print(line + (" · EMULATED: not the device's timings" if report.target.emulated else ""), markup=False)
    energy = data["measurement"].get("energy")
    if energy:
        ui.out.print(
            f"energy {energy['mj_per_inference']:.4g} mJ/inference · {energy['power_avg_w']:.4g} W average "
            f"({energy['meter']}: {energy['scope']})",
            markup=False,
        )
    ui.out.print(f"{report.kind} dir: {report.build_dir} · exit {report.exit_code}", markup=False)
    return report.exit_code


def print_json(data: object) -> None:
    print(json.dumps(data, indent=2, default=str))
