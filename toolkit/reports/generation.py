"""A generate workload's figures as rows and lines: one source for the terminal, report.md and report.html."""

from __future__ import annotations


def interval(q: dict) -> str:
    """A quantile estimate as `point [lower, upper]`, an absent bound as —."""
    low, high = q.get("lower"), q.get("upper")
    return f"{q['point']:.3f} [{'—' if low is None else f'{low:.3f}'}, {'—' if high is None else f'{high:.3f}'}]"


def one_line(w: dict) -> str:
    """The terminal's line: TTFT at each length, TPOT, tokens/s, KV cache, agreement."""
    ttft = " · ".join(f"TTFT@{n} p50 {s['quantiles']['p50']['point']:.2f} ms" for n, s in w["ttft_ms"].items())
    tpot = w["tpot_ms"]["quantiles"]
    tok = w["decode_tokens_per_s"]
    agree = w["agreement"]["share"]
    return (f"generate: {ttft} · TPOT p50 {interval(tpot['p50'])} p90 {tpot['p90']['point']:.3f} ms · decode "
            f"{tok['point']:.0f} tok/s [{tok['lower']:.0f}, {tok['upper'] or float('inf'):.0f}] · KV cache "
            f"{w['memory_mb']['kv_cache']:.2f} MB at {w['layout']['max_context']} tokens"
            + ("" if agree is None else f" · greedy agreement {agree:.0%}"))


def ttft_rows(w: dict) -> list[list[str]]:
    return [[n, interval(s["quantiles"]["p50"]), interval(s["quantiles"]["p90"]), f"{w['prefill_tokens_per_s'][n]:.0f}"]
            for n, s in w["ttft_ms"].items()]


def tpot_rows(w: dict) -> list[list[str]]:
    q = w["tpot_ms"]["quantiles"]
    tok = w["decode_tokens_per_s"]
    return [[name, interval(q[name])] for name in ("p50", "p90", "p99") if name in q] + [
        ["decode tokens/s", f"{tok['point']:.0f} [{tok['lower']:.0f}, {tok['upper'] or float('inf'):.0f}]"]]


def position_rows(w: dict) -> list[list[str]]:
    return [[f"{b['from']}–{b['to']}", str(b["count"]), f"{b['p50_ms']:.3f}", f"{b['p90_ms']:.3f}"]
            for b in w["tpot_by_position"]]


def memory_rows(w: dict) -> list[list[str]]:
    mem = w["memory_mb"]
    return [[name, f"{mem[key]:.2f}"] for name, key in (
        ("peak RSS", "peak_rss"), ("process baseline (interpreter, numpy)", "process_baseline"),
        ("weights (artifact files)", "weights"), ("KV cache at max_context", "kv_cache"),
        ("rest (runtime, arenas, activations)", "rest"))]


def agreement_line(w: dict) -> str:
    a = w["agreement"]
    if a["share"] is None:
        return "Greedy agreement: not read."
    diverged = [f for f in a["first_divergence"] if f is not None]
    return (f"Greedy agreement with the torch reference: **{a['share']:.1%}** of {a['tokens']} tokens × {a['prompts']} "
            f"prompts reproduced before the first divergence; {a['prompts'] - len(diverged)} prompts match throughout"
            + (f", first divergences at {diverged}" if diverged else "") + ".")
