"""report.md's sections of a build's own steps, which a check has none of: the analysis, the precision plan and its
sensitivity loop, the graph passes, pruning, and a device-compiled target's engine."""

from __future__ import annotations

from tapeout.reports.cells import fmt, table


def analysis_section(a: dict | None) -> list[str]:
    if not a:
        return []
    best = a["families"][0]
    facts = {k: v for k, v in a["facts"].items() if v not in (None, 0, False, {}, 0.0)}
    return [
        "",
        "## Architecture",
        "",
        f"**{best['family']}** (confidence {best['confidence']:.2f}): {'; '.join(best['evidence'])}. "
        + ", ".join(f"{k} {v}" for k, v in facts.items())
        + ".",
        "",
        f"{fmt(a['params'] / 1e6, 4)} M parameters · {fmt(a['flops'] / 1e9, 4)} GFLOP per inference · "
        f"peak live activations {fmt(a['peak_activation_bytes'] / 2**20, 4)} MB (lower bound, before the runtime's "
        f"arenas) · {len(a['groups'])} fusion groups · roles: "
        + ", ".join(f"{k} {v}" for k, v in a["role_counts"].items())
        + ".",
    ]


def quantization_section(q: dict | None) -> list[str]:
    if not q:
        return []
    plan, search = q["plan"], q["search"]
    out = [
        "",
        "## Precision",
        "",
        f"{q['precision']} by the rule for **{plan['family']}** on `{plan['target']}`: method {plan['method']}, "
        f"{plan['quantized_groups']} of {plan['quantized_groups'] + plan['float_groups']} fusion groups quantized, "
        f"ladder {' → '.join(plan['ladder'])}. Model {fmt(q['quantized_bytes'] / 2**20)} MB "
        f"(FP32 {fmt(q['fp32_bytes'] / 2**20)} MB).",
    ]
    out += [f"\nNote: {n}" for n in [*plan.get("notes", []), *q.get("notes", [])]]
    for move in q.get("fallbacks") or []:
        out.append(
            f"\nMoved up because the quantizer failed on it: {move['group']} {move['from']} → {move['to']} "
            f"({move['why']})."
        )
    for name, c in (q.get("companions") or {}).items():
        if c.get("method") is None:
            out.append(f"\nThe {name} graph ({c['family']}): {c['kept_float']}.")
            continue
        rungs = ", ".join(f"{n} at {rung}" for rung, n in (c.get("rungs") or {}).items())
        out.append(
            f"\nThe {name} graph ({c['family']}): the rule's first plan by {c['method']}, {c['quantized_groups']} of "
            f"{c['groups']} groups quantized ({rungs})"
            + (f"; {len(c['fallbacks'])} moved up by the quantizer's failures" if c.get("fallbacks") else "")
            + "."
        )
    if q.get("quick_latency_ms"):
        lat = q["quick_latency_ms"]
        out.append(
            f"\nQuick in-process medians on this host: fp32 {fmt(lat['fp32'], 4)} ms, {q['precision']} "
            f"{fmt(lat['quantized'], 4)} ms ({lat['fp32'] / lat['quantized']:.2f}×)."
        )
    out += [
        "",
        f"Sensitivity loop: **{search['stopped']}** ({search['evaluations']} evaluation(s)"
        + (f"; candidates evaluated on {q['evaluated_on']}" if q.get("evaluated_on") else "")
        + ").",
    ]
    if search["steps"]:
        out += [
            "",
            *table(
                ["step", "action", "metric", "drop", "meets budget", "quick latency ms"],
                [
                    [
                        s["index"],
                        s["action"],
                        fmt(s["metric"], 6),
                        fmt(s["drop"], 4),
                        "yes" if s["meets_accuracy"] else "no",
                        fmt(s["latency_ms"], 4),
                    ]
                    for s in search["steps"]
                ],
            ),
        ]
        out.append(
            "\nQuick latency: median of 15 in-process runs, for comparing steps; the budgets are judged on the "
            "measurement above."
        )
    if search["ranking"]:
        out += [
            "",
            "Groups ranked by the error each introduces when quantized alone (relative squared output error):",
            "",
        ]
        out += table(
            ["group", "role", "relative error"],
            [[r["group"], r["role"], f"{r['relative_error']:.3g}"] for r in search["ranking"][:10]],
        )
    unranked = search.get("unranked") or []
    if unranked:
        reasons = ", ".join(sorted({u["skipped"] for u in unranked}))
        out.append(
            f"\n{len(unranked)} group(s) not ranked ({reasons}); the loop tried them after the ranked ones, "
            f"largest by MACs first: {', '.join(u['group'] for u in unranked[:10])}"
            f"{' …' if len(unranked) > 10 else ''}."
        )
    rows = [[g["group"], g["role"], g["precision"], g["reason"]] for g in plan["groups"]]
    out += ["", "Final plan:", "", *table(["group", "role", "precision", "why"], rows)]
    return out


def passes_rows(passes: list[dict]) -> list[list[str]]:
    return [
        [p["name"], p["stage"], p["outcome"], str(p["rewrites"]) if p["outcome"] == "applied" else "—", p["reason"]]
        for p in passes
    ]


PASSES_HEADER = ["pass", "stage", "outcome", "rewrites", "what it did, or why not"]


def passes_section(passes: list[dict] | None) -> list[str]:
    if not passes:
        return []
    return ["", "## Graph passes", "", *table(PASSES_HEADER, passes_rows(passes))]


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


def pruning_section(p: dict | None) -> list[str]:
    if not p:
        return []
    out = [
        "",
        "## Pruning",
        "",
        f"{', '.join(p['what'])} by {p['ratio']:.0%} ({pruning_how(p['what'], p['importance'], p['round_to'])}): FLOPs **−{p['flops_reduction']:.1%}** ({p['macs_before']:,.0f} → {p['macs_after']:,.0f} "
        f"MACs), parameters {p['params_before']:,} → {p['params_after']:,}.",
        "",
    ]
    rows = [
        [
            s["what"],
            f"{s['macs_before']:,.0f} → {s['macs_after']:,.0f}",
            f"{s['params_before']:,} → {s['params_after']:,}",
            ", ".join(f"{k} {v}" for k, v in list(s["widths"].items())[:6]) + (" …" if len(s["widths"]) > 6 else ""),
        ]
        for s in p["steps"]
    ]
    if rows:
        out += table(["step", "MACs", "parameters", "widths after"], rows)
    search = p.get("search")
    if search:
        out += [
            "",
            f"Latency-driven search ({search['method']}; limit {search['limit_ms']:g} ms): **{search['stopped']}**.",
            "",
        ]
        out += table(
            [
                "ratio",
                "estimated p50 ms" if search.get("estimated") else "quick latency ms",
                "metric",
                "MACs",
                "accepted",
            ],
            [
                [
                    f"{s['ratio']:.0%}",
                    f"{s['latency_ms']:.4g}",
                    fmt(s.get("metric")),
                    f"{s['macs']:,.0f}" if s.get("macs") else "—",
                    "yes" if s["accepted"] else "no",
                ]
                for s in search["steps"]
            ],
        )
    for s in p["steps"]:
        if s["what"] == "depth":
            out += [
                "",
                f"Depth: removed {', '.join(f'`{r}`' for r in s['removed'])} of {s['blocks']} blocks, those "
                "that change their input least (block influence, 1 − cos(in, out): "
                + ", ".join(f"{k} {v:.3g}" for k, v in s["influence"].items())
                + ").",
            ]
    if p.get("sparsity_2_4"):
        sp = p["sparsity_2_4"]
        out += [
            "",
            f"2:4 sparsity: {sp['layers']} layers, {sp['eligible_share']:.0%} of the weights eligible, "
            f"{sp['zeros_in_eligible']:.0%} of those zero (the sparse flag reaches targets with sparse kernels: "
            "TensorRT's sparse_weights)",
        ]
    out += ["", "Protected: " + "; ".join(f"`{k}` ({v})" for k, v in p["protected"].items())]
    r = p.get("recovery") or {}
    if r.get("steps"):
        out += [
            "",
            f"Recovery: {r['method']}, {r['steps']} steps in {r['seconds']:.1f} s ({r['stopped']}), loss "
            f"{r['loss_first']:.4g} → {r['loss_last']:.4g}, on {r.get('samples', '?')} inputs from "
            f"{p.get('recovery_data')}"
            + (f", {r['batch']} a step" + (", padding cut" if r.get("trimmed") else "") if "batch" in r else "")
            + "."
            + (f" Not used: {r['batching']}." if r.get("batching") else ""),
        ]
    elif r:
        out += ["", f"Recovery: {r['method']}" + (f" ({r['why']})" if r.get("why") else "") + "."]
    if p.get("metric_fp32") is not None:
        out += [
            "",
            f"The metric on the pruned FP32 model, before the precision step: **{p['metric_fp32']:.6g}** "
            "(the accuracy budgets compare the artifact with the unpruned teacher).",
        ]
    return out


def engine_section(e: dict | None) -> list[str]:
    """A device-compiled target's engine: built or reused and why, its key, and its layers by precision."""
    if not e:
        return []
    key = e["key"]
    out = [
        "",
        "## Engine",
        "",
        (
            f"**Built** in {e['seconds']:.1f} s: {e['reason']}"
            if e["action"] == "built"
            else f"**Reused**: {e['reason']}"
        )
        + f". File `{e['file']}`.",
        "",
        "Cache key: " + " · ".join(f"{k.removesuffix('_sha256')} {_short_hash(v)}" for k, v in key.items()),
    ]
    summary = e.get("summary") or {}
    fused = summary.get("fused_kernels")
    if fused:  # aoti-cuda: the substitution pass's decisions on this GPU
        out += [
            "",
            f"Fused kernels: {fused['substituted']} of {len(fused['decisions'])} chains substituted "
            f"({fused['timings']})"
            + (
                f"; Inductor failed on the kernels' program: {fused['compile_failed']}"
                if fused.get("compile_failed")
                else ""
            ),
        ]
        rows = [
            [
                d["kernel"],
                d["where"][:50],
                d["case"],
                d["dtype"],
                "—" if d["kernel_ms"] is None else f"{d['kernel_ms']:.4f}",
                "—" if d["inductor_ms"] is None else f"{d['inductor_ms']:.4f}",
                "yes" if d["substituted"] else "no",
                d["reason"],
            ]
            for d in fused["decisions"][:25]
        ]
        if rows:
            out += [
                "",
                *table(["kernel", "where", "case", "dtype", "kernel ms", "Inductor ms", "substituted", "why"], rows),
            ]
        if len(fused["decisions"]) > len(rows):
            out += ["", f"(the first {len(rows)} of {len(fused['decisions'])} decisions; report.json holds them all)"]
    if summary.get("precisions"):
        out += [
            "",
            "Layers by precision: "
            + ", ".join(f"{k} {v}" for k, v in summary["precisions"].items())
            + (f" ({summary['layers']} layers after fusion)" if summary.get("layers") else ""),
        ]
    if summary.get("sparse_weights") is not None:
        sparse = summary.get("sparse_layers") or []
        out += [
            "",
            f"Sparse weights requested: {len(sparse)} layer(s) chose sparse kernels"
            + (f": {', '.join(sparse[:10])}" if sparse else ""),
        ]
    if e.get("layers"):
        rows = [
            [
                layer.get("name", "")[:60],
                layer.get("type", ""),
                layer.get("precision", ""),
                str(layer.get("tactic", ""))[:40],
            ]
            for layer in e["layers"][:25]
        ]
        out += ["", *table(["layer", "type", "precision", "tactic"], rows)]
        if len(e["layers"]) > 25:
            out += ["", f"… and {len(e['layers']) - 25} more in report.json"]
    return out


def _short_hash(value) -> str:
    text = str(value)
    return text[:12] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text
