"""A generate workload's figures as rows and lines: one source for the terminal, report.md and report.html."""

from __future__ import annotations

from tapeout.reports.cells import fmt, table


def interval(q: dict) -> str:
    """A quantile estimate as `point [lower, upper]`, an absent bound as —."""
    low, high = q.get("lower"), q.get("upper")
    return f"{q['point']:.3f} [{'—' if low is None else f'{low:.3f}'}, {'—' if high is None else f'{high:.3f}'}]"


def one_line(w: dict, estimate: dict | None = None) -> str:
    """The terminal's line: TTFT at each length, TPOT (and its multiple of the roofline's floor, where `estimate`,
    the report's generation estimate, priced this very host), tokens/s, KV cache, agreement."""
    ttft = " · ".join(f"TTFT@{n} p50 {s['quantiles']['p50']['point']:.2f} ms" for n, s in w["ttft_ms"].items())
    tpot = w["tpot_ms"]["quantiles"]
    tok = w["decode_tokens_per_s"]
    agree = w["agreement"]["share"]
    return (
        f"generate: {ttft} · TPOT p50 {interval(tpot['p50'])} p90 {tpot['p90']['point']:.3f} ms"
        f"{_floor(estimate)} · decode "
        f"{tok['point']:.0f} tok/s [{tok['lower']:.0f}, {tok['upper'] or float('inf'):.0f}] · KV cache "
        f"{w['memory_mb']['kv_cache']:.2f} MB at {w['layout']['max_context']} tokens"
        + ("" if agree is None else f" · greedy agreement {agree:.0%}")
    )


def _floor(estimate: dict | None) -> str:
    if not estimate or not str(estimate.get("device", "")).startswith("host-"):
        return ""
    row = next((r for r in estimate.get("measured") or [] if r["what"] == "TPOT p50"), None)
    if not row or not row.get("of_bound"):
        return ""
    return f" ({row['of_bound']:.1f}× the roofline's floor of {row['bound_ms']:.3g} ms)"


def ttft_rows(w: dict) -> list[list[str]]:
    return [
        [n, interval(s["quantiles"]["p50"]), interval(s["quantiles"]["p90"]), f"{w['prefill_tokens_per_s'][n]:.0f}"]
        for n, s in w["ttft_ms"].items()
    ]


def tpot_rows(w: dict) -> list[list[str]]:
    q = w["tpot_ms"]["quantiles"]
    tok = w["decode_tokens_per_s"]
    return [[name, interval(q[name])] for name in ("p50", "p90", "p99") if name in q] + [
        ["decode tokens/s", f"{tok['point']:.0f} [{tok['lower']:.0f}, {tok['upper'] or float('inf'):.0f}]"]
    ]


def position_rows(w: dict) -> list[list[str]]:
    return [
        [f"{b['from']}–{b['to']}", str(b["count"]), f"{b['p50_ms']:.3f}", f"{b['p90_ms']:.3f}"]
        for b in w["tpot_by_position"]
    ]


def memory_rows(w: dict) -> list[list[str]]:
    mem = w["memory_mb"]
    rows = [
        [name, f"{mem[key]:.2f}"]
        for name, key in (
            ("peak RSS", "peak_rss"),
            ("process baseline (interpreter, numpy)", "process_baseline"),
            ("weights (artifact files)", "weights"),
            ("KV cache at max_context", "kv_cache"),
            ("rest (runtime, arenas, activations)", "rest"),
        )
    ]
    device = mem.get("device")
    if device:  # a GPU target: the weights and the KV cache at max_context are in device memory
        rows += [
            [f"device: {name}", f"{device[key]:.2f}"]
            for name, key in (
                ("peak GPU memory", "peak"),
                ("weights", "weights"),
                ("KV cache at max_context", "kv_cache"),
                ("rest (CUDA context, arena, workspaces, activations)", "rest"),
            )
        ]
    return rows


def agreement_line(w: dict) -> str:
    a = w["agreement"]
    if a["share"] is None:
        return "Greedy agreement: not read."
    diverged = [f for f in a["first_divergence"] if f is not None]
    return (
        f"Greedy agreement with the torch reference: **{a['share']:.1%}** of {a['tokens']} tokens × {a['prompts']} "
        f"prompts reproduced before the first divergence; {a['prompts'] - len(diverged)} prompts match throughout"
        + (f", first divergences at {diverged}" if diverged else "")
        + "."
    )


# ---------------------------------------------------------------- the estimate of the loop (estimation/generation.py)

ESTIMATE_HEADER = ["figure", "roofline bound", "predicted", "measured p50", "estimate's error"]
PHASE_HEADER = ["call", "GFLOP", "MB read and written", "memory-bound share", "bound ms", "predicted ms"]


def _triple(t: dict | None) -> str:
    return "—" if not t else f"{t['point']:.4g} [{t['low']:.4g}, {t['high']:.4g}]"


def estimate_rows(g: dict) -> list[list[str]]:
    """Each priced figure: its roofline bound, the calibrated prediction with its band, and this run's measurement
    with the estimate's error against it where the build measured the loop."""
    measured = {m["what"]: m for m in g.get("measured") or []}

    def seen(what: str) -> list[str]:
        m = measured.get(what)
        if not m or m.get("measured_ms") is None:
            return ["—", "—"]
        floor = f"; {m['of_bound']:.1f}× the floor" if m.get("of_bound") else ""
        return [
            f"{m['measured_ms']:.4g}{floor}",
            "—" if m["error"] is None else f"{m['error']:+.1%} (of the {m['of']})",
        ]

    rows = [
        [f"TTFT@{n} ms", f"≥ {e['lower_bound']:.4g}", _triple(e["predicted"]), *seen(f"TTFT@{n} p50")]
        for n, e in g["ttft_ms"].items()
    ]
    tpot = g["tpot_ms"]
    for q in ("p50", "p90", "p99"):
        bound = tpot["lower_bound"].get(q)
        if bound is None:
            continue
        rows.append(
            [
                f"TPOT {q} ms",
                f"≥ {bound:.4g}",
                _triple((tpot["predicted"] or {}).get(q)),
                *(seen("TPOT p50") if q == "p50" else ["—", "—"]),
            ]
        )
    tok = g["decode_tokens_per_s"]
    if tok["upper_bound"]:
        rows.append(["decode tokens/s", f"≤ {tok['upper_bound']:.0f}", _triple(tok["predicted"]), "—", "—"])
    return rows


def phase_rows(g: dict) -> list[list[str]]:
    """The calls the loop was priced from: each prompt's prefill and the decode steps the line runs through."""
    calls = [*(e["phase"] for e in g["ttft_ms"].values()), *g["decode_steps"]]
    return [
        [
            f"prefill of {p['seq']}" if p["kind"] == "prefill" else f"decode at position {p['past']}",
            f"{p['gflop']:.4g}",
            f"{p['mb']:.4g}",
            f"{p['memory_bound_share']:.0%}",
            f"{p['lower_bound_ms']:.4g}",
            "—" if p["predicted_ms"] is None else f"{p['predicted_ms']:.4g}",
        ]
        for p in calls
    ]


def estimate_note(g: dict) -> str:
    """Where the band comes from, or that there is none."""
    if g.get("band"):
        lo, hi = g["band"]
        return f"Band {lo:+.0%}…{hi:+.0%}: {g['band_from']}. {g['calibration']}."
    if g.get("calibration"):
        return f"{g['calibration']}; no band (too few models to hold one out)."
    return (
        "No calibration for this device and target: the bounds alone, which a loop on the device can only be "
        "slower than (unless its weights stay in a cache between calls)."
    )


def section(w: dict, emulated: str | None) -> list[str]:
    lay, st = w["layout"], w["settings"]
    out = [
        "",
        "## Generation (prefill + decode over the KV cache, fresh processes)",
        "",
        f"{lay['layers']} layers, {lay['kv_heads']} KV heads × {lay['head_dim']}, vocabulary {lay['vocab']}; batch "
        f"{st['batch']}, {st['new_tokens']} new tokens, {st['trials']} timed generations per length per process, "
        f"max_context {lay['max_context']}. Times in ms, p50/p90 with their {w['tpot_ms']['confidence']:.0%} bounds.",
    ]
    if emulated:
        out += ["", f"**Emulated**: {emulated}. Never judged against the budgets."]
    out += ["", "Time to first token (prefill + choosing the token):", ""]
    out += table(["prompt tokens", "p50", "p90", "prefill tokens/s"], ttft_rows(w))
    out += ["", "Time per output token (one decode step):", ""]
    out += table(["", "ms"], tpot_rows(w))
    out += ["", "Time per output token against the position in the sequence:", ""]
    out += table(["positions", "steps", "p50", "p90"], position_rows(w))
    out += cold_start_and_memory(w, memory_rows(w))
    out += ["", agreement_line(w)]
    out += [f"\nNote: {note}" for note in w.get("notes", [])]
    return out


def cold_start_and_memory(w: dict, memory: list[list[str]]) -> list[str]:
    """A loop section's cold start, its memory table (`memory`: the loop's own rows) and what the memory covers."""
    cold = w["cold_start_ms"]
    return [
        "",
        f"Cold start ({cold['what']}): median {fmt(cold['median'])} ms, worst {fmt(cold['max'])} ms.",
        "",
        "Memory (MB):",
        "",
        *table(["part", "MB"], memory),
        "",
        f"Scope: {w['memory_mb']['scope']}.",
    ]


def diff_figures(w: dict, timed: bool) -> dict[str, tuple]:
    """`tapeout diff`'s figures of a generation: (point, low, high), low and high its noise range (None: exact);
    all timed, so none through an emulator."""
    out: dict[str, tuple] = {}
    if not timed:
        return out
    for length, summary in w["ttft_ms"].items():
        q = summary["quantiles"]["p50"]
        out[f"TTFT p50 ms @{length}"] = (q["point"], q["lower"], q["upper"])
    for key, q in w["tpot_ms"]["quantiles"].items():
        out[f"TPOT {key} ms"] = (q["point"], q["lower"], q["upper"])
    tok = w["decode_tokens_per_s"]
    out["decode tokens/s"] = (tok["point"], tok["lower"], tok["upper"])
    out["generate peak RSS MB"] = (w["memory_mb"]["peak_rss"], None, None)
    if w["agreement"]["share"] is not None:
        out["greedy agreement"] = (w["agreement"]["share"], None, None)
    return out


def headline(w: dict, emulated: str | None) -> dict | None:
    """`tapeout compare`'s figures of a generation: TTFT p50 at the longest prompt, TPOT p50, decode tokens/s;
    none through an emulator (all timed)."""
    if emulated:
        return None
    longest = max(w["ttft_ms"], key=int)
    return {
        "ttft_p50_ms": w["ttft_ms"][longest]["quantiles"]["p50"]["point"],
        "prompt": int(longest),
        "tpot_p50_ms": w["tpot_ms"]["quantiles"]["p50"]["point"],
        "decode_tokens_per_s": w["decode_tokens_per_s"]["point"],
        "agreement": w["agreement"]["share"],
    }


def headline_cell(g: dict) -> str:
    agreement = "" if g.get("agreement") is None else f" · greedy agreement {g['agreement']:.0%}"
    return (
        f"TTFT@{g['prompt']} {g['ttft_p50_ms']:.3g} ms · TPOT {g['tpot_p50_ms']:.3g} ms · "
        f"{g['decode_tokens_per_s']:.0f} tok/s{agreement}"
    )
