"""`report.md` (and `check.md`), rendered from the report (records.report.Report).

The Markdown is a pure function of the report, so `tapeout report BUILD_DIR` can re-render it anywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tapeout.reports import generation, streaming

if TYPE_CHECKING:
    from tapeout.records.report import Report

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
            f"[{fmt(bound[0])}, {fmt(bound[1])}]" if bound else "—", _MARK[b["verdict"]],
            ("carried from the build: " if b.get("carried") else "") + b.get("reason", ""),
        ])
    return rows


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines


def _latency_table(lat: dict) -> list[str]:
    rows = [[name, fmt(q["point"]), f"[{fmt(q['lower'])}, {fmt(q['upper'])}]",
             ", ".join(fmt(v) for v in q["per_repeat"])] for name, q in lat["quantiles"].items()]
    return [*_table(["percentile", "point", f"{lat['confidence']:.0%} bounds", "per process"], rows), "",
            f"{lat['count']} runs in {lat['repeats']} fresh processes · mean {fmt(lat['mean'])} ± {fmt(lat['stdev'])} · "
            f"min {fmt(lat['min'])} · max {fmt(lat['max'])} · CV {lat['cv']:.1%} · CV between processes "
            f"{lat['cv_between_repeats']:.1%}"]


def render_markdown(report: Report) -> str:
    r = report.to_json()
    kind = r["kind"]
    out = [f"# tapeout {kind}: {r['project']['name']} → {r['profile']['name']}", ""]
    out.append(f"Target `{r['target']['name']}` {r['target'].get('version') or ''} · profile `{r['profile']['name']}` · "
               f"precision {r['profile']['precision']} · device {r['profile'].get('device') or 'this machine'} · "
               f"exit code **{r['exit_code']}** · {r['created']}")
    dev = r.get("device")
    if dev and dev.get("reported"):
        out.append(f"\nMeasured on **{dev['reported']}**" + (f" ({dev['note']})" if dev.get("note") else
                                                              f", as the profile's device spec `{dev['spec']}` says" if dev.get("matches") else "") + ".")
    out += ["", "## Budgets", ""]
    if r["budgets"]:
        out += _table(["budget", "limit", "measured", "bound", "verdict", "why"], budget_rows(r["budgets"]))
        ours = r["profile"].get("budgets_from_project")
        if ours:
            out += ["", f"From the project file: {', '.join(ours)}; the others from the profile "
                    f"`{r['profile']['name']}`."]
    else:
        out.append("No budgets declared.")

    w = r.get("workload")
    if w:
        section = _stream_section if w.get("kind") == "stream" else _generation_section
        out += section(w, r["target"].get("emulated"))
    m = r.get("measurement")
    if m:
        e2e = m.get("latency_e2e_ms")
        scope = {"generate": ": one decode step at the maximum context",
                 "stream": ": one chunk, on the golden inputs' state (the stream above carries it)"}
        out += ["", "## Latency (ms, warm, profiler off)" + scope.get((w or {}).get("kind"), ""), ""]
        if r["target"].get("emulated"):
            out += [f"**Emulated**: {r['target']['emulated']}. These figures are never judged against the budgets.", ""]
        if e2e:
            out += ["Inputs and outputs resident in device memory (IOBinding), each run ended by a device sync; "
                    "this is what the latency budgets judge.", ""]
        out += _latency_table(m["latency_ms"])
        out[-1] += f" · warm-up runs {m['warmup_iters']}"
        if e2e:
            out += ["", "End to end, with the host→device input and device→host output copies:", "", *_latency_table(e2e)]
        cold = m["cold_start_ms"]
        imports = m.get("runtime_import_ms") or []
        out += ["", f"Cold start (session creation + first inference): median {fmt(cold['median'])} ms, "
                f"worst {fmt(cold['max'])} ms over {len(cold['per_repeat'])} processes"
                + (f"; loading the runtime library before that: {fmt(max(imports))} ms at worst." if imports else ".")]
        mem = m["memory_mb"]
        out += ["", "## Memory", "", f"Peak RSS of the inference process: **{fmt(mem['peak_rss'])} MB** "
                f"(before the session {fmt(mem['rss_before_session'])} MB, after creating it "
                f"{fmt(mem['rss_after_session'])} MB). Scope: {mem['scope']}."]
        if mem.get("device_peak") is not None:
            out.append(f"\nPeak GPU memory: **{fmt(mem['device_peak'])} MB** (per process: "
                       f"{', '.join(fmt(v) for v in mem['device_peak_per_repeat'])}). Scope: {mem['device_scope']}.")
        out += _energy_section(m)
        for note in m.get("notes", []):
            out.append(f"\nNote: {note}")

    out += ["", "## Artifact", "", f"`{r['artifact']['main_file']}` in `artifact/`: "
            f"{fmt(r['artifact']['bytes'] / 2**20)} MB, sha256 `{r['artifact']['sha256'][:16]}…`"]
    meta = r["artifact"].get("meta") or {}
    if meta.get("inference_precision"):  # what the runtime chose for float ops, not what the profile asked
        out[-1] += (f"; compiled for {', '.join(meta.get('execution_devices') or [meta.get('device', '?')])} with "
                    f"inference precision **{meta['inference_precision']}** (the precision float ops ran in)")

    out += _engine_section(r.get("engine"))
    out += _pruning_section(r.get("pruning"))
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

    out += _placement_section(r.get("placement"))
    out += _analysis_section(r.get("analysis"))
    out += _quantization_section(r.get("quantization"))
    out += _passes_section(r.get("passes"))

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
        if gen:
            out.append(f"\nThe KV-cache graph was verified by {gen['method']}: {gen['prompts']} prompts × "
                       f"{gen['tokens_per_prompt']} tokens, worst logit difference {fmt(gen['max_abs_logit_diff'])}, "
                       f"{gen['near_ties']} near-ties.")
        if exp.get("parity"):
            out += ["", "Verified against torch on random inputs:", ""]
            out += _table(["output", "max-abs", "max-rel", "cosine"],
                          [[p["output"], fmt(p["max_abs"]), fmt(p["max_rel"]), f"{p['cosine']:.6f}"] for p in exp["parity"]])

    prof = (m or {}).get("op_profile")
    if prof and prof.get("op_types"):
        out += ["", "## Where the time goes (profiler on, separate pass)", ""]
        if prof.get("method"):
            out += [f"Times: {prof['method']}.", ""]
        out += _table(["op type", "provider", "calls/run", "µs/run", "share"],
                      [[t["op_type"], t["provider"], fmt(t["calls"] / prof["runs"], 3),
                        us(t["total_us"] / prof["runs"]), f"{t['share']:.1%}"] for t in prof["op_types"][:15]])
        if prof.get("overhead_share") is not None:
            out.append(f"\nKernels take {us(prof['mean_kernel_us'])} µs of a {us(prof['mean_run_us'])} µs "
                       f"profiled run; the rest ({prof['overhead_share']:.0%}) is framework overhead and, mostly, the "
                       "profiler's own cost between the ops: profiled runs are slower than the timed ones. How much "
                       "of the timed run is outside the ops: the bottleneck section.")

    out += _bottleneck_section(r.get("bottlenecks"))
    out += _estimate_section(r.get("estimate"))
    if r.get("lint"):
        out += ["", "## Lint", ""] + [f"- {line}" for line in r["lint"]]
    host = r["host"]
    out += ["", "## Machine", "", f"{host['cpu']} · {host['physical_cores']} physical / {host['logical_cores']} "
            f"logical cores · {host['memory_gb']} GB · {host['os']} · flags {' '.join(host['cpu_flags']) or 'none'}"]
    run = r.get("run")
    if run:
        slowest = sorted(run["steps"], key=lambda s: -s["seconds"])[:5]
        out.append(f"\nThis {kind} took {fmt(run['seconds'], 3)} s (slowest steps: "
                   + ", ".join(f"{s['name']} {fmt(s['seconds'], 3)} s" for s in slowest)
                   + f"); tapeout's peak memory {fmt(run['peak_rss_mb'], 4)} MB.")
    return "\n".join(out) + "\n"


def _generation_section(w: dict, emulated: str | None) -> list[str]:
    lay, st = w["layout"], w["settings"]
    out = ["", "## Generation (prefill + decode over the KV cache, fresh processes)", "",
           f"{lay['layers']} layers, {lay['kv_heads']} KV heads × {lay['head_dim']}, vocabulary {lay['vocab']}; batch "
           f"{st['batch']}, {st['new_tokens']} new tokens, {st['trials']} timed generations per length per process, "
           f"max_context {lay['max_context']}. Times in ms, p50/p90 with their {w['tpot_ms']['confidence']:.0%} bounds."]
    if emulated:
        out += ["", f"**Emulated**: {emulated}. Never judged against the budgets."]
    out += ["", "Time to first token (prefill + choosing the token):", ""]
    out += _table(["prompt tokens", "p50", "p90", "prefill tokens/s"], generation.ttft_rows(w))
    out += ["", "Time per output token (one decode step):", ""]
    out += _table(["", "ms"], generation.tpot_rows(w))
    out += ["", "Time per output token against the position in the sequence:", ""]
    out += _table(["positions", "steps", "p50", "p90"], generation.position_rows(w))
    cold = w["cold_start_ms"]
    out += ["", f"Cold start ({cold['what']}): median {fmt(cold['median'])} ms, worst {fmt(cold['max'])} ms.", "",
            "Memory (MB):", ""]
    out += _table(["part", "MB"], generation.memory_rows(w))
    out += ["", f"Scope: {w['memory_mb']['scope']}.", "", generation.agreement_line(w)]
    out += [f"\nNote: {note}" for note in w.get("notes", [])]
    return out


def _stream_section(w: dict, emulated: str | None) -> list[str]:
    out = ["", "## Stream (chunk after chunk, state carried, fresh processes)", "", streaming.settings_line(w) +
           f" Times in ms, with their {w['chunk_ms']['confidence']:.0%} bounds."]
    if emulated:
        out += ["", f"**Emulated**: {emulated}. Timings never judged against the budgets; the outputs are."]
    out += ["", "Time per chunk:", ""]
    out += _table(["", "ms"], streaming.chunk_rows(w))
    out += ["", "Streamed outputs against the FP32 reference over the golden stream (largest absolute difference; "
            "an error that grows from the first quarter to the last is state drift):", ""]
    out += _table(["output", "max", "at chunk", "first quarter", "last quarter"], streaming.drift_rows(w))
    cold = w["cold_start_ms"]
    out += ["", f"Cold start ({cold['what']}): median {fmt(cold['median'])} ms, worst {fmt(cold['max'])} ms.", "",
            "Memory (MB):", ""]
    out += _table(["part", "MB"], streaming.memory_rows(w))
    out += ["", f"Scope: {w['memory_mb']['scope']}."]
    out += [f"\nNote: {note}" for note in w.get("notes", [])]
    return out


def _energy_section(m: dict) -> list[str]:
    e = m.get("energy")
    if e:
        lo, hi = e["mj_bounds"]
        return ["", "## Energy and power", "",
                f"**{fmt(e['mj_per_inference'])} mJ per inference** [{fmt(lo)}, {fmt(hi)}] · average power "
                f"**{fmt(e['power_avg_w'])} W** [{fmt(e['power_bounds_w'][0])}, {fmt(e['power_bounds_w'][1])}] over "
                f"windows of {', '.join(fmt(w, 3) for w in e['window_s'])} s ({', '.join(map(str, e['runs']))} runs). "
                f"Meter: {e['meter']}; scope: {e['scope']}; method: {e['method']}. Bounds: the spread between "
                "processes, widened by the counter's granularity."]
    why = (m.get("unmeasured") or {}).get("energy")
    return ["", "## Energy and power", "", f"Not measured: {why}."] if why else []


def _analysis_section(a: dict | None) -> list[str]:
    if not a:
        return []
    best = a["families"][0]
    facts = {k: v for k, v in a["facts"].items() if v not in (None, 0, False, {}, 0.0)}
    return ["", "## Architecture", "",
            f"**{best['family']}** (confidence {best['confidence']:.2f}): {'; '.join(best['evidence'])}. "
            + ", ".join(f"{k} {v}" for k, v in facts.items()) + ".",
            "", f"{fmt(a['params'] / 1e6, 4)} M parameters · {fmt(a['flops'] / 1e9, 4)} GFLOP per inference · "
            f"peak live activations {fmt(a['peak_activation_bytes'] / 2**20, 4)} MB (lower bound, before the runtime's "
            f"arenas) · {len(a['groups'])} fusion groups · roles: "
            + ", ".join(f"{k} {v}" for k, v in a["role_counts"].items()) + "."]


def _quantization_section(q: dict | None) -> list[str]:
    if not q:
        return []
    plan, search = q["plan"], q["search"]
    out = ["", "## Precision", "",
           f"{q['precision']} by the rule for **{plan['family']}** on `{plan['target']}`: method {plan['method']}, "
           f"{plan['quantized_groups']} of {plan['quantized_groups'] + plan['float_groups']} fusion groups quantized, "
           f"ladder {' → '.join(plan['ladder'])}. Model {fmt(q['quantized_bytes'] / 2**20)} MB "
           f"(FP32 {fmt(q['fp32_bytes'] / 2**20)} MB)."]
    out += [f"\nNote: {n}" for n in [*plan.get("notes", []), *q.get("notes", [])]]
    for move in q.get("fallbacks") or []:
        out.append(f"\nMoved up because the quantizer failed on it: {move['group']} {move['from']} → {move['to']} "
                   f"({move['why']}).")
    if q.get("quick_latency_ms"):
        lat = q["quick_latency_ms"]
        out.append(f"\nQuick in-process medians on this host: fp32 {fmt(lat['fp32'], 4)} ms, {q['precision']} "
                   f"{fmt(lat['quantized'], 4)} ms ({lat['fp32'] / lat['quantized']:.2f}×).")
    out += ["", f"Sensitivity loop: **{search['stopped']}** ({search['evaluations']} evaluation(s)"
            + (f"; candidates evaluated on {q['evaluated_on']}" if q.get("evaluated_on") else "") + ")."]
    if search["steps"]:
        out += ["", *_table(["step", "action", "metric", "drop", "meets budget", "quick latency ms"],
                            [[s["index"], s["action"], fmt(s["metric"], 6), fmt(s["drop"], 4),
                              "yes" if s["meets_accuracy"] else "no", fmt(s["latency_ms"], 4)] for s in search["steps"]])]
        out.append("\nQuick latency: median of 15 in-process runs, for comparing steps; the budgets are judged on the "
                   "measurement above.")
    if search["ranking"]:
        out += ["", "Groups ranked by the error each introduces when quantized alone (relative squared output error):", ""]
        out += _table(["group", "role", "relative error"],
                      [[r["group"], r["role"], f"{r['relative_error']:.3g}"] for r in search["ranking"][:10]])
    unranked = search.get("unranked") or []
    if unranked:
        reasons = ", ".join(sorted({u["skipped"] for u in unranked}))
        out.append(f"\n{len(unranked)} group(s) not ranked ({reasons}); the loop tried them after the ranked ones, "
                   f"largest by MACs first: {', '.join(u['group'] for u in unranked[:10])}"
                   f"{' …' if len(unranked) > 10 else ''}.")
    rows = [[g["group"], g["role"], g["precision"], g["reason"]] for g in plan["groups"]]
    out += ["", "Final plan:", "", *_table(["group", "role", "precision", "why"], rows)]
    return out


def passes_rows(passes: list[dict]) -> list[list[str]]:
    return [[p["name"], p["stage"], p["outcome"], str(p["rewrites"]) if p["outcome"] == "applied" else "—", p["reason"]]
            for p in passes]


PASSES_HEADER = ["pass", "stage", "outcome", "rewrites", "what it did, or why not"]


def _passes_section(passes: list[dict] | None) -> list[str]:
    if not passes:
        return []
    return ["", "## Graph passes", "", *_table(PASSES_HEADER, passes_rows(passes))]


def pruning_how(what: list[str], importance: str, round_to: int) -> str:
    """How the pruned units were chosen (the build's progress line and the report): importance and channel multiple
    for widths, block influence for depth, magnitude for 2:4."""
    how = []
    if set(what) & {"channels", "heads", "mlp"}:
        how.append(f"{importance} importance, channel counts a multiple of {round_to}")
    if "depth" in what:
        how.append("blocks by their influence on the calibration inputs")
    if "2:4" in what:
        how.append("2:4 by weight magnitude")
    return "; ".join(how)


def _pruning_section(p: dict | None) -> list[str]:
    if not p:
        return []
    out = ["", "## Pruning", "",
           f"{', '.join(p['what'])} by {p['ratio']:.0%} ({pruning_how(p['what'], p['importance'], p['round_to'])}): FLOPs **−{p['flops_reduction']:.1%}** ({p['macs_before']:,.0f} → {p['macs_after']:,.0f} "
           f"MACs), parameters {p['params_before']:,} → {p['params_after']:,}.", ""]
    rows = [[s["what"], f"{s['macs_before']:,.0f} → {s['macs_after']:,.0f}", f"{s['params_before']:,} → {s['params_after']:,}",
             ", ".join(f"{k} {v}" for k, v in list(s["widths"].items())[:6]) + (" …" if len(s["widths"]) > 6 else "")]
            for s in p["steps"]]
    if rows:
        out += _table(["step", "MACs", "parameters", "widths after"], rows)
    search = p.get("search")
    if search:
        out += ["", f"Latency-driven search ({search['method']}; limit {search['limit_ms']:g} ms): **{search['stopped']}**.", ""]
        out += _table(["ratio", "estimated p50 ms" if search.get("estimated") else "quick latency ms", "metric",
                       "MACs", "accepted"],
                      [[f"{s['ratio']:.0%}", f"{s['latency_ms']:.4g}", fmt(s.get("metric")),
                        f"{s['macs']:,.0f}" if s.get("macs") else "—", "yes" if s["accepted"] else "no"]
                       for s in search["steps"]])
    for s in p["steps"]:
        if s["what"] == "depth":
            out += ["", f"Depth: removed {', '.join(f'`{r}`' for r in s['removed'])} of {s['blocks']} blocks, those "
                    "that change their input least (block influence, 1 − cos(in, out): "
                    + ", ".join(f"{k} {v:.3g}" for k, v in s["influence"].items()) + ")."]
    if p.get("sparsity_2_4"):
        sp = p["sparsity_2_4"]
        out += ["", f"2:4 sparsity: {sp['layers']} layers, {sp['eligible_share']:.0%} of the weights eligible, "
                f"{sp['zeros_in_eligible']:.0%} of those zero (the sparse flag reaches targets with sparse kernels: "
                "TensorRT's sparse_weights)"]
    out += ["", "Protected: " + "; ".join(f"`{k}` ({v})" for k, v in p["protected"].items())]
    r = p.get("recovery") or {}
    if r.get("steps"):
        out += ["", f"Recovery: {r['method']}, {r['steps']} steps in {r['seconds']:.1f} s ({r['stopped']}), loss "
                f"{r['loss_first']:.4g} → {r['loss_last']:.4g}, on {r.get('samples', '?')} inputs from "
                f"{p.get('recovery_data')}"
                + (f", {r['batch']} a step" + (", padding cut" if r.get("trimmed") else "") if "batch" in r else "")
                + "." + (f" Not used: {r['batching']}." if r.get("batching") else "")]
    elif r:
        out += ["", f"Recovery: {r['method']}" + (f" ({r['why']})" if r.get("why") else "") + "."]
    if p.get("metric_fp32") is not None:
        out += ["", f"The metric on the pruned FP32 model, before the precision step: **{p['metric_fp32']:.6g}** "
                "(the accuracy budgets compare the artifact with the unpruned teacher)."]
    return out


def _engine_section(e: dict | None) -> list[str]:
    """A device-compiled target's engine: built or reused and why, its key, and its layers by precision."""
    if not e:
        return []
    key = e["key"]
    out = ["", "## Engine", "",
           (f"**Built** in {e['seconds']:.1f} s: {e['reason']}" if e["action"] == "built"
            else f"**Reused**: {e['reason']}") + f". File `{e['file']}`.", "",
           "Cache key: " + " · ".join(f"{k.removesuffix('_sha256')} {_short_hash(v)}" for k, v in key.items())]
    summary = e.get("summary") or {}
    fused = summary.get("fused_kernels")
    if fused:  # aoti-cuda: the substitution pass's decisions on this GPU
        out += ["", f"Fused kernels: {fused['substituted']} of {len(fused['decisions'])} chains substituted "
                f"({fused['timings']})" + (f"; Inductor failed on the kernels' program: {fused['compile_failed']}"
                                           if fused.get("compile_failed") else "")]
        rows = [[d["kernel"], d["where"][:50], d["case"], d["dtype"],
                 "—" if d["kernel_ms"] is None else f"{d['kernel_ms']:.4f}",
                 "—" if d["inductor_ms"] is None else f"{d['inductor_ms']:.4f}",
                 "yes" if d["substituted"] else "no", d["reason"]] for d in fused["decisions"][:25]]
        if rows:
            out += ["", *_table(["kernel", "where", "case", "dtype", "kernel ms", "Inductor ms", "substituted", "why"],
                                rows)]
        if len(fused["decisions"]) > len(rows):
            out += ["", f"(the first {len(rows)} of {len(fused['decisions'])} decisions; report.json holds them all)"]
    if summary.get("precisions"):
        out += ["", "Layers by precision: " + ", ".join(f"{k} {v}" for k, v in summary["precisions"].items())
                + (f" ({summary['layers']} layers after fusion)" if summary.get("layers") else "")]
    if summary.get("sparse_weights") is not None:
        sparse = summary.get("sparse_layers") or []
        out += ["", f"Sparse weights requested: {len(sparse)} layer(s) chose sparse kernels"
                + (f": {', '.join(sparse[:10])}" if sparse else "")]
    if e.get("layers"):
        rows = [[layer.get("name", "")[:60], layer.get("type", ""), layer.get("precision", ""),
                 str(layer.get("tactic", ""))[:40]] for layer in e["layers"][:25]]
        out += ["", *_table(["layer", "type", "precision", "tactic"], rows)]
        if len(e["layers"]) > 25:
            out += ["", f"… and {len(e['layers']) - 25} more in report.json"]
    return out


def _short_hash(value) -> str:
    text = str(value)
    return text[:12] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text


def _placement_section(p: dict | None) -> list[str]:
    if not p:
        return []
    subgraphs = f", in {p['subgraphs']} subgraph(s)" if p.get("subgraphs") else ""
    out = ["", "## Placement", "", f"{p['on_accelerator']} of {p['total_nodes']} nodes on the {p['accelerator']} "
           f"({1 - p['off_share']:.1%}){subgraphs}, from {p.get('source') or 'the EP at compile'}."]
    if p["off"]:
        out += ["", *_table(["node", "op", "why not on the accelerator"], [[n["node"], n["op_type"], n["reason"]] for n in p["off"]])]
    return out


def _estimate_section(e: dict | None) -> list[str]:
    if not e:
        return []
    out = ["", f"## Estimate for {e['device']}", "", f"Method: {e['method']}."]
    predicted = (e.get("predicted_ms") or {}).get("p50")
    line = f"Roofline lower bound **{fmt(e['lower_bound_ms'])} ms** over {e['kernels']} kernels"
    if predicted:
        line += (f"; predicted p50 **{fmt(predicted['point'])} ms**"
                 + (f" (band {fmt(predicted['low'])}–{fmt(predicted['high'])} ms)" if e.get("band") else ""))
    if e.get("measured_p50_ms") is not None:
        line += f"; measured p50 {fmt(e['measured_p50_ms'])} ms"
        if e.get("error") is not None:
            line += f", error {e['error']:+.1%}"
    out.append(f"\n{line}.")
    out.append(f"\n{e['calibration'] or 'No calibration for this device and target: this is a lower bound, which no measured run should beat; `tapeout calibrate` (docs/estimator.md) adds a prediction with its error band.'}")
    out += ["", *_table(["class", "kernels", "GFLOP", "MB", "roofline µs", "predicted µs"],
                        [[c["class"], str(c["kernels"]), fmt(c["flops"] / 1e9, 3), fmt(c["bytes"] / 2**20, 3),
                          us(c["roofline_us"]), us(c["predicted_us"])] for c in e["by_class"]])]
    for note in e.get("notes") or []:
        out.append(f"\nNote: {note}")
    g = e.get("generation")
    if g:
        out += ["", f"### The generation loop on {g['device']}", "", f"Method: {g['method']}.", ""]
        out += _table(generation.ESTIMATE_HEADER, generation.estimate_rows(g))
        out += ["", generation.estimate_note(g), "", "Priced from these calls:", ""]
        out += _table(generation.PHASE_HEADER, generation.phase_rows(g))
    return out


def _bottleneck_section(b: dict | None) -> list[str]:
    if not b:
        return []
    roof = b["roof"]
    out = ["", "## Bottlenecks (per op against the roofline)", "",
           f"Roofs: {roof['source']}; bandwidth {fmt(roof['bandwidth_gbs'], 3)} GB/s; peaks "
           + ", ".join(f"{k} {fmt(v, 3)} T/s" for k, v in roof["peaks_tops"].items()) + "."]
    shares = ", ".join(f"{k}-bound {v['share']:.0%} ({v['ops']} ops)" for k, v in
                       sorted(b["by_bound"].items(), key=lambda kv: -kv[1]["share"]))
    outside = b.get("outside_ops_share")
    out.append(f"\nTime in ops: {shares}." + (f" Outside any op (framework, dispatch): {outside:.0%} of the run."
                                               if outside is not None else ""))
    out += ["", *_table(["op", "type", "prec", "µs", "share", "GFLOP/s", "GB/s", "of roof", "bound"],
                        [[o["node"], o["op_type"], o["precision"], us(o["mean_us"]), f"{o['share']:.1%}",
                          fmt(o["achieved_gflops"], 3), fmt(o["achieved_gbs"], 3),
                          "—" if o["roof_share"] is None else f"{o['roof_share']:.1%}", o["bound"]]
                         for o in b["ops"][:12]])]
    chains = b.get("fusible_chains") or []
    if chains:
        out += ["", f"Chains a fused kernel would collapse (saving {us(b['fusible_saving_us'])} µs per run at the "
                "bandwidth limit):", ""]
        out += _table(["ops", "measured µs", "fused µs", "saving µs"],
                      [[" → ".join(c["op_types"]), us(c["measured_us"]), us(c["fused_us"]), us(c["saving_us"])]
                       for c in chains[:5]])
    out.append(f"\n{b['method']}.")
    return out
