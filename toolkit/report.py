"""Reports: `report.json` (versioned schema, docs/report-schema.md) and `report.md` rendered from it.

The Markdown is a pure function of the JSON, so `tapeout report BUILD_DIR` can re-render it anywhere.
"""

from __future__ import annotations

from typing import Any

SCHEMA = "tapeout.report/1"

_MARK = {"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE", "unmeasured": "UNMEASURED",
         "estimated-pass": "EST. PASS", "estimated-fail": "EST. FAIL"}


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def us(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def budget_rows(budgets: list[dict]) -> list[list[str]]:
    rows = []
    for b in budgets:
        bound = b.get("bound")
        rows.append([
            b["budget"], f"{fmt(b['limit'])} {b['unit']}", fmt(b.get("measured")),
            f"[{fmt(bound[0])}, {fmt(bound[1])}]" if bound else "—", _MARK[b["verdict"]], b.get("reason", ""),
        ])
    return rows


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines


def render_markdown(report: dict) -> str:
    r = report
    kind = r.get("kind", "build")
    out = [f"# tapeout {kind}: {r['project']['name']} → {r['profile']['name']}", ""]
    out.append(f"Target `{r['target']['name']}` {r['target'].get('version') or ''} · profile `{r['profile']['name']}` · "
               f"precision {r['profile']['precision']} · device {r['profile'].get('device') or 'this machine'} · "
               f"exit code **{r['exit_code']}** · {r['created']}")
    out += ["", "## Budgets", ""]
    if r["budgets"]:
        out += _table(["budget", "limit", "measured", "bound", "verdict", "why"], budget_rows(r["budgets"]))
    else:
        out.append("No budgets declared.")

    m = r.get("measurement")
    if m:
        lat = m["latency_ms"]
        out += ["", "## Latency (ms, warm, profiler off)", ""]
        rows = [[name, fmt(q["point"]), f"[{fmt(q['lower'])}, {fmt(q['upper'])}]",
                 ", ".join(fmt(v) for v in q["per_repeat"])] for name, q in lat["quantiles"].items()]
        out += _table(["percentile", "point", f"{lat['confidence']:.0%} bounds", "per process"], rows)
        out += ["", f"{lat['count']} runs in {lat['repeats']} fresh processes · mean {fmt(lat['mean'])} ± "
                f"{fmt(lat['stdev'])} · min {fmt(lat['min'])} · max {fmt(lat['max'])} · CV {lat['cv']:.1%} · "
                f"CV between processes {lat['cv_between_repeats']:.1%} · warm-up runs {m['warmup_iters']}"]
        cold = m["cold_start_ms"]
        imports = m.get("runtime_import_ms") or []
        out += ["", f"Cold start (session creation + first inference): median {fmt(cold['median'])} ms, "
                f"worst {fmt(cold['max'])} ms over {len(cold['per_repeat'])} processes"
                + (f"; loading the runtime library before that: {fmt(max(imports))} ms at worst." if imports else ".")]
        mem = m["memory_mb"]
        out += ["", "## Memory", "", f"Peak RSS of the inference process: **{fmt(mem['peak_rss'])} MB** "
                f"(before the session {fmt(mem['rss_before_session'])} MB, after creating it "
                f"{fmt(mem['rss_after_session'])} MB). Scope: {mem['scope']}."]
        for note in m.get("notes", []):
            out.append(f"\nNote: {note}")

    out += ["", "## Artifact", "", f"`{r['artifact']['main_file']}` in `artifact/`: "
            f"{fmt(r['artifact']['bytes'] / 2**20)} MB, sha256 `{r['artifact']['sha256'][:16]}…`"]

    out += ["", "## Parity with the golden reference", ""]
    out += _table(["output", "max-abs", "max-rel", "cosine", "within tolerance"],
                  [[p["output"], fmt(p["max_abs"]), fmt(p["max_rel"]), f"{p['cosine']:.6f}",
                    "yes" if p["within_tolerance"] else "NO"] for p in r["parity"]])
    out.append(f"\n{r['golden']['samples']} golden samples from {r['golden']['source']}; reference: "
               f"{r['golden']['reference']}.")

    acc = r.get("accuracy")
    if acc:
        out += ["", "## Accuracy", "", f"{acc['metric']} ({acc['direction']} is better): reference "
                f"{fmt(acc['reference'], 6)}, artifact {fmt(acc['artifact'], 6)}, measured {acc['where']}."]

    exp = r.get("export")
    if exp:
        out += ["", "## Export", ""]
        line = f"Exporter **{exp['exporter']}**, opset {exp['opset']}, IR version {exp['ir_version']}"
        if exp.get("dynamic_dims"):
            line += f", dynamic dims {', '.join(exp['dynamic_dims'])}"
        out.append(line + f", {fmt(exp['seconds'], 3)} s.")
        if exp.get("fallback_reason"):
            out.append(f"\nThe dynamo exporter failed ({exp['fallback_reason']}); TorchScript was used.")
        if exp.get("parity"):
            out += ["", "Verified against torch on random inputs:", ""]
            out += _table(["output", "max-abs", "max-rel", "cosine"],
                          [[p["output"], fmt(p["max_abs"]), fmt(p["max_rel"]), f"{p['cosine']:.6f}"] for p in exp["parity"]])

    prof = (m or {}).get("op_profile")
    if prof and prof.get("op_types"):
        out += ["", "## Where the time goes (profiler on, separate pass)", ""]
        out += _table(["op type", "provider", "calls/run", "µs/run", "share"],
                      [[t["op_type"], t["provider"], fmt(t["calls"] / prof["runs"], 3),
                        us(t["total_us"] / prof["runs"]), f"{t['share']:.1%}"] for t in prof["op_types"][:15]])
        if prof.get("overhead_share") is not None:
            out.append(f"\nKernels take {us(prof['mean_kernel_us'])} µs of a {us(prof['mean_run_us'])} µs "
                       f"profiled run; the rest ({prof['overhead_share']:.0%}) is framework overhead. Profiled runs are "
                       "slower than the timed ones; read shares, not absolute times.")

    if r.get("lint"):
        out += ["", "## Lint", ""] + [f"- {line}" for line in r["lint"]]
    host = r["host"]
    out += ["", "## Machine", "", f"{host['cpu']} · {host['physical_cores']} physical / {host['logical_cores']} "
            f"logical cores · {host['memory_gb']} GB · {host['os']} · flags {' '.join(host['cpu_flags']) or 'none'}"]
    return "\n".join(out) + "\n"
