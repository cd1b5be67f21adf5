"""`report.md` (and `check.md`), rendered from the report (records.report.Report).

The Markdown is a pure function of the report, so `tapeout report BUILD_DIR` can re-render it anywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tapeout.core import workload
from tapeout.reports import generation
from tapeout.reports.build_sections import (
    analysis_section,
    engine_section,
    passes_section,
    pruning_section,
    quantization_section,
)
from tapeout.reports.cells import budget_rows, fmt, table, us

if TYPE_CHECKING:
    from tapeout.records.report import Report


def _latencytable(lat: dict) -> list[str]:
    rows = [
        [name, fmt(q["point"]), f"[{fmt(q['lower'])}, {fmt(q['upper'])}]", ", ".join(fmt(v) for v in q["per_repeat"])]
        for name, q in lat["quantiles"].items()
    ]
    return [
        *table(["percentile", "point", f"{lat['confidence']:.0%} bounds", "per process"], rows),
        "",
        f"{lat['count']} runs in {lat['repeats']} fresh processes · mean {fmt(lat['mean'])} ± {fmt(lat['stdev'])} · "
        f"min {fmt(lat['min'])} · max {fmt(lat['max'])} · CV {lat['cv']:.1%} · CV between processes "
        f"{lat['cv_between_repeats']:.1%}",
    ]


def render_markdown(report: Report) -> str:
    r = report.to_json()
    kind = r["kind"]
    out = [f"# tapeout {kind}: {r['project']['name']} → {r['profile']['name']}", ""]
    out.append(
        f"Target `{r['target']['name']}` {r['target'].get('version') or ''} · profile `{r['profile']['name']}` · "
        f"precision {r['profile']['precision']} · device {r['profile'].get('device') or 'this machine'} · "
        f"exit code **{r['exit_code']}** · {r['created']}"
    )
    dev = r.get("device")
    if dev and dev.get("reported"):
        out.append(
            f"\nMeasured on **{dev['reported']}**"
            + (
                f" ({dev['note']})"
                if dev.get("note")
                else f", as the profile's device spec `{dev['spec']}` says"
                if dev.get("matches")
                else ""
            )
            + "."
        )
    out += ["", "## Budgets", ""]
    if r["budgets"]:
        out += table(["budget", "limit", "measured", "bound", "verdict", "why"], budget_rows(r["budgets"]))
        ours = r["profile"].get("budgets_from_project")
        if ours:
            out += [
                "",
                f"From the project file: {', '.join(ours)}; the others from the profile `{r['profile']['name']}`.",
            ]
    else:
        out.append("No budgets declared.")

    w = r.get("workload")
    if w:
        out += workload.get(w["kind"]).markdown(w, r["target"].get("emulated"))
    m = r.get("measurement")
    if m:
        e2e = m.get("latency_e2e_ms")
        scope = workload.get(w["kind"]).call_scope if w else ""
        out += ["", "## Latency (ms, warm, profiler off)" + scope, ""]
        if r["target"].get("emulated"):
            out += [f"**Emulated**: {r['target']['emulated']}. These figures are never judged against the budgets.", ""]
        if e2e:
            out += [
                "Inputs and outputs resident in device memory (IOBinding), each run ended by a device sync; "
                "this is what the latency budgets judge.",
                "",
            ]
        out += _latencytable(m["latency_ms"])
        out[-1] += f" · warm-up runs {m['warmup_iters']}"
        if e2e:
            out += [
                "",
                "End to end, with the host→device input and device→host output copies:",
                "",
                *_latencytable(e2e),
            ]
        cold = m["cold_start_ms"]
        imports = m.get("runtime_import_ms") or []
        out += [
            "",
            f"Cold start (session creation + first inference): median {fmt(cold['median'])} ms, "
            f"worst {fmt(cold['max'])} ms over {len(cold['per_repeat'])} processes"
            + (f"; loading the runtime library before that: {fmt(max(imports))} ms at worst." if imports else "."),
        ]
        mem = m["memory_mb"]
        out += [
            "",
            "## Memory",
            "",
            f"Peak RSS of the inference process: **{fmt(mem['peak_rss'])} MB** "
            f"(before the session {fmt(mem['rss_before_session'])} MB, after creating it "
            f"{fmt(mem['rss_after_session'])} MB). Scope: {mem['scope']}.",
        ]
        if mem.get("device_peak") is not None:
            out.append(
                f"\nPeak GPU memory: **{fmt(mem['device_peak'])} MB** (per process: "
                f"{', '.join(fmt(v) for v in mem['device_peak_per_repeat'])}). Scope: {mem['device_scope']}."
            )
        out += _energy_section(m)
        for note in m.get("notes", []):
            out.append(f"\nNote: {note}")

    out += [
        "",
        "## Artifact",
        "",
        f"`{r['artifact']['main_file']}` in `artifact/`: "
        f"{fmt(r['artifact']['bytes'] / 2**20)} MB, sha256 `{r['artifact']['sha256'][:16]}…`",
    ]
    meta = r["artifact"].get("meta") or {}
    if meta.get("inference_precision"):  # what the runtime chose for float ops, not what the profile asked
        out[-1] += (
            f"; compiled for {', '.join(meta.get('execution_devices') or [meta.get('device', '?')])} with "
            f"inference precision **{meta['inference_precision']}** (the precision float ops ran in)"
        )

    out += engine_section(r.get("engine"))
    out += pruning_section(r.get("pruning"))
    out += ["", "## Parity with the golden reference", ""]
    out += table(
        ["output", "max-abs", "max-rel", "cosine", "within tolerance"],
        [
            [
                p["output"],
                fmt(p["max_abs"]),
                fmt(p["max_rel"]),
                f"{p['cosine']:.6f}",
                "yes" if p["within_tolerance"] else "NO",
            ]
            for p in r["parity"]
        ],
    )
    out.append(
        f"\n{r['golden']['samples']} golden samples from {r['golden']['source']}; reference: "
        f"{r['golden']['reference']}."
    )

    acc = r.get("accuracy")
    if acc:
        out += [
            "",
            "## Accuracy",
            "",
            f"{acc['metric']} ({acc['direction']} is better): reference "
            f"{fmt(acc['reference'], 6)}, artifact {fmt(acc['artifact'], 6)}, measured {acc['where']}.",
        ]

    out += _placement_section(r.get("placement"))
    out += analysis_section(r.get("analysis"))
    out += quantization_section(r.get("quantization"))
    out += passes_section(r.get("passes"))

    exp = r.get("export")
    if exp:
        out += ["", "## Export", ""]
        line = f"Exporter **{exp['exporter']}**, opset {exp['opset']}, IR version {exp['ir_version']}"
        if exp.get("dynamic_dims"):
            line += f", dynamic dims {', '.join(exp['dynamic_dims'])}"
        out.append(line + f", {fmt(exp['seconds'], 3)} s.")
        if exp.get("fallback_reason"):
            out.append(f"\nThe dynamo exporter failed ({exp['fallback_reason']}); TorchScript was used.")
        gen = exp.get("generation")
        if gen and gen.get("summary"):
            out.append(f"\n{gen['summary']}")
        elif gen:
            out.append(
                f"\nThe KV-cache graph was verified by {gen['method']}: {gen['prompts']} prompts × "
                f"{gen['tokens_per_prompt']} tokens, worst logit difference {fmt(gen['max_abs_logit_diff'])}, "
                f"{gen['near_ties']} near-ties."
            )
        if exp.get("parity"):
            out += ["", "Verified against torch on random inputs:", ""]
            out += table(
                ["output", "max-abs", "max-rel", "cosine"],
                [[p["output"], fmt(p["max_abs"]), fmt(p["max_rel"]), f"{p['cosine']:.6f}"] for p in exp["parity"]],
            )

    prof = (m or {}).get("op_profile")
    if prof and prof.get("op_types"):
        out += ["", "## Where the time goes (profiler on, separate pass)", ""]
        if prof.get("method"):
            out += [f"Times: {prof['method']}.", ""]
        out += table(
            ["op type", "provider", "calls/run", "µs/run", "share"],
            [
                [
                    t["op_type"],
                    t["provider"],
                    fmt(t["calls"] / prof["runs"], 3),
                    us(t["total_us"] / prof["runs"]),
                    f"{t['share']:.1%}",
                ]
                for t in prof["op_types"][:15]
            ],
        )
        if prof.get("overhead_share") is not None:
            out.append(
                f"\nKernels take {us(prof['mean_kernel_us'])} µs of a {us(prof['mean_run_us'])} µs "
                f"profiled run; the rest ({prof['overhead_share']:.0%}) is framework overhead and, mostly, the "
                "profiler's own cost between the ops: profiled runs are slower than the timed ones. How much "
                "of the timed run is outside the ops: the bottleneck section."
            )

    out += _bottleneck_section(r.get("bottlenecks"))
    out += _estimate_section(r.get("estimate"))
    if r.get("lint"):
        out += ["", "## Lint", ""] + [f"- {line}" for line in r["lint"]]
    host = r["host"]
    out += [
        "",
        "## Machine",
        "",
        f"{host['cpu']} · {host['physical_cores']} physical / {host['logical_cores']} "
        f"logical cores · {host['memory_gb']} GB · {host['os']} · flags {' '.join(host['cpu_flags']) or 'none'}",
    ]
    run = r.get("run")
    if run:
        slowest = sorted(run["steps"], key=lambda s: -s["seconds"])[:5]
        where = next(
            (s["name"] for s in run["steps"] if (s.get("peak_rss_mb") or 0) >= run["peak_rss_mb"]), None
        )  # the first step whose high-water mark is the run's: it reached the peak
        out.append(
            f"\nThis {kind} took {fmt(run['seconds'], 3)} s (slowest steps: "
            + ", ".join(f"{s['name']} {fmt(s['seconds'], 3)} s" for s in slowest)
            + f"); tapeout's peak memory {fmt(run['peak_rss_mb'], 4)} MB"
            + (f", reached in step {where}." if where else ".")
        )
    return "\n".join(out) + "\n"


def _energy_section(m: dict) -> list[str]:
    e = m.get("energy")
    if e:
        lo, hi = e["mj_bounds"]
        return [
            "",
            "## Energy and power",
            "",
            f"**{fmt(e['mj_per_inference'])} mJ per inference** [{fmt(lo)}, {fmt(hi)}] · average power "
            f"**{fmt(e['power_avg_w'])} W** [{fmt(e['power_bounds_w'][0])}, {fmt(e['power_bounds_w'][1])}] over "
            f"windows of {', '.join(fmt(w, 3) for w in e['window_s'])} s ({', '.join(map(str, e['runs']))} runs). "
            f"Meter: {e['meter']}; scope: {e['scope']}; method: {e['method']}. Bounds: the spread between "
            "processes, widened by the counter's granularity.",
        ]
    why = (m.get("unmeasured") or {}).get("energy")
    return ["", "## Energy and power", "", f"Not measured: {why}."] if why else []


def _placement_section(p: dict | None) -> list[str]:
    if not p:
        return []
    subgraphs = f", in {p['subgraphs']} subgraph(s)" if p.get("subgraphs") else ""
    out = [
        "",
        "## Placement",
        "",
        f"{p['on_accelerator']} of {p['total_nodes']} nodes on the {p['accelerator']} "
        f"({1 - p['off_share']:.1%}){subgraphs}, from {p.get('source') or 'the EP at compile'}.",
    ]
    if p["off"]:
        out += [
            "",
            *table(
                ["node", "op", "why not on the accelerator"], [[n["node"], n["op_type"], n["reason"]] for n in p["off"]]
            ),
        ]
    return out


def _estimate_section(e: dict | None) -> list[str]:
    if not e:
        return []
    out = ["", f"## Estimate for {e['device']}", "", f"Method: {e['method']}."]
    predicted = (e.get("predicted_ms") or {}).get("p50")
    line = f"Roofline lower bound **{fmt(e['lower_bound_ms'])} ms** over {e['kernels']} kernels"
    if predicted:
        line += f"; predicted p50 **{fmt(predicted['point'])} ms**" + (
            f" (band {fmt(predicted['low'])}–{fmt(predicted['high'])} ms)" if e.get("band") else ""
        )
    if e.get("measured_p50_ms") is not None:
        line += f"; measured p50 {fmt(e['measured_p50_ms'])} ms"
        if e.get("error") is not None:
            line += f", error {e['error']:+.1%}"
    out.append(f"\n{line}.")
    out.append(
        f"\n{e['calibration'] or 'No calibration for this device and target: this is a lower bound, which no measured run should beat; `tapeout calibrate` (docs/estimator.md) adds a prediction with its error band.'}"
    )
    out += [
        "",
        *table(
            ["class", "kernels", "GFLOP", "MB", "roofline µs", "predicted µs"],
            [
                [
                    c["class"],
                    str(c["kernels"]),
                    fmt(c["flops"] / 1e9, 3),
                    fmt(c["bytes"] / 2**20, 3),
                    us(c["roofline_us"]),
                    us(c["predicted_us"]),
                ]
                for c in e["by_class"]
            ],
        ),
    ]
    for note in e.get("notes") or []:
        out.append(f"\nNote: {note}")
    g = e.get("generation")
    if g:
        out += ["", f"### The generation loop on {g['device']}", "", f"Method: {g['method']}.", ""]
        out += table(generation.ESTIMATE_HEADER, generation.estimate_rows(g))
        out += ["", generation.estimate_note(g), "", "Priced from these calls:", ""]
        out += table(generation.PHASE_HEADER, generation.phase_rows(g))
    return out


def _bottleneck_section(b: dict | None) -> list[str]:
    if not b:
        return []
    roof = b["roof"]
    out = [
        "",
        "## Bottlenecks (per op against the roofline)",
        "",
        f"Roofs: {roof['source']}; bandwidth {fmt(roof['bandwidth_gbs'], 3)} GB/s; peaks "
        + ", ".join(f"{k} {fmt(v, 3)} T/s" for k, v in roof["peaks_tops"].items())
        + ".",
    ]
    shares = ", ".join(
        f"{k}-bound {v['share']:.0%} ({v['ops']} ops)"
        for k, v in sorted(b["by_bound"].items(), key=lambda kv: -kv[1]["share"])
    )
    outside = b.get("outside_ops_share")
    out.append(
        f"\nTime in ops: {shares}."
        + (f" Outside any op (framework, dispatch): {outside:.0%} of the run." if outside is not None else "")
    )
    out += [
        "",
        *table(
            ["op", "type", "prec", "µs", "share", "GFLOP/s", "GB/s", "of roof", "bound"],
            [
                [
                    o["node"],
                    o["op_type"],
                    o["precision"],
                    us(o["mean_us"]),
                    f"{o['share']:.1%}",
                    fmt(o["achieved_gflops"], 3),
                    fmt(o["achieved_gbs"], 3),
                    "—" if o["roof_share"] is None else f"{o['roof_share']:.1%}",
                    o["bound"],
                ]
                for o in b["ops"][:12]
            ],
        ),
    ]
    chains = b.get("fusible_chains") or []
    if chains:
        out += [
            "",
            f"Chains a fused kernel would collapse (saving {us(b['fusible_saving_us'])} µs per run at the "
            "bandwidth limit):",
            "",
        ]
        out += table(
            ["ops", "measured µs", "fused µs", "saving µs"],
            [
                [" → ".join(c["op_types"]), us(c["measured_us"]), us(c["fused_us"]), us(c["saving_us"])]
                for c in chains[:5]
            ],
        )
    out.append(f"\n{b['method']}.")
    return out
