"""A transcribe workload's figures as rows and lines: one source for the terminal, report.md and report.html."""

from __future__ import annotations

from tapeout.reports.cells import table
from tapeout.reports.generation import cold_start_and_memory, interval


def one_line(w: dict) -> str:
    """The terminal's line: the encoder, TTFT, TPOT, the real-time factor per clip length, agreement."""
    q = w["encoder_ms"]["quantiles"]
    rtf = " · ".join(f"RTF@{s} s {v['quantiles']['p50']['point']:.3f}" for s, v in w["real_time_factor"].items())
    agree = w["agreement"]["share"]
    return (
        f"transcribe: encoder p50 {interval(q['p50'])} ms · TTFT p50 {w['ttft_ms']['quantiles']['p50']['point']:.2f} "
        f"ms · TPOT p50 {w['tpot_ms']['quantiles']['p50']['point']:.3f} ms · {rtf}"
        + ("" if agree is None else f" · greedy agreement {agree:.0%}")
    )


def latency_rows(w: dict) -> list[list[str]]:
    rows = []
    for name, key in (("encoder", "encoder_ms"), ("time to first token", "ttft_ms"), ("time per token", "tpot_ms")):
        q = w[key]["quantiles"]
        rows.append([name, interval(q["p50"]), interval(q["p90"])])
    return rows


def clip_rows(w: dict) -> list[list[str]]:
    return [
        [
            f"{seconds} s",
            str(w["tokens"][seconds]),
            interval(total["quantiles"]["p50"]),
            interval(total["quantiles"]["p90"]),
            interval(w["real_time_factor"][seconds]["quantiles"]["p50"]),
            interval(w["real_time_factor"][seconds]["quantiles"]["p90"]),
        ]
        for seconds, total in w["total_ms"].items()
    ]


def memory_rows(w: dict) -> list[list[str]]:
    mem = w["memory_mb"]
    return [
        [name, f"{mem[key]:.2f}"]
        for name, key in (
            ("peak RSS", "peak_rss"),
            ("process baseline (interpreter, numpy)", "process_baseline"),
            ("weights (both graphs' files)", "weights"),
            ("self-attention cache at max_target", "self_cache"),
            ("cross-attention cache", "cross_cache"),
            ("rest (runtime, arenas, activations)", "rest"),
        )
    ]


def agreement_line(w: dict) -> str:
    a = w["agreement"]
    if a["share"] is None:
        return "Greedy agreement: not measured."
    diverged = [f"clip {i} at token {d}" for i, d in enumerate(a["first_divergence"]) if d is not None]
    where = f"; first divergence: {', '.join(diverged)}" if diverged else "; no clip diverged"
    return (
        f"Greedy agreement with the torch model over {a['clips']} golden clips × up to {a['tokens']} tokens: "
        f"{a['share']:.1%} ({a['what']}){where}."
    )


def section(w: dict, emulated: str | None) -> list[str]:
    lay, st = w["layout"], w["settings"]
    out = [
        "",
        "## Transcription (the encoder once, then decode over the self and cross caches, fresh processes)",
        "",
        f"{lay['layers']} decoder layers, {lay['heads']} heads × {lay['head_dim']}, vocabulary {lay['vocab']}; the "
        f"encoder over {lay['mel_bins']} mel bins × {lay['frames']} frames ({lay['source']} positions to attend), "
        f"max_target {lay['max_target']}; {st['tokens_per_s']:g} tokens per second of audio, {st['trials']} timed "
        f"transcriptions per clip length per process. Times in ms, p50/p90 with their "
        f"{w['tpot_ms']['confidence']:.0%} bounds.",
    ]
    if emulated:
        out += ["", f"**Emulated**: {emulated}. Never judged against the budgets."]
    out += ["", "Parts of a transcription:", ""]
    out += table(["", "p50", "p90"], latency_rows(w))
    out += ["", "Each clip length end to end (the real-time factor is the total over the clip's length):", ""]
    out += table(["clip", "tokens", "total p50", "total p90", "RTF p50", "RTF p90"], clip_rows(w))
    out += cold_start_and_memory(w, memory_rows(w))
    out += ["", agreement_line(w)]
    out += [f"\nNote: {note}" for note in w.get("notes", [])]
    return out


def diff_figures(w: dict, timed: bool) -> dict[str, tuple]:
    """`tapeout diff`'s figures of a transcription: (point, low, high), low and high its noise range (None: exact);
    the timings only where they are the device's."""
    out: dict[str, tuple] = {}
    if timed:
        for name, key in (("encoder", "encoder_ms"), ("TTFT", "ttft_ms"), ("TPOT", "tpot_ms")):
            q = w[key]["quantiles"]["p50"]
            out[f"{name} p50 ms"] = (q["point"], q["lower"], q["upper"])
        for seconds, summary in w["real_time_factor"].items():
            q = summary["quantiles"]["p50"]
            out[f"RTF p50 @{seconds} s"] = (q["point"], q["lower"], q["upper"])
        out["transcribe peak RSS MB"] = (w["memory_mb"]["peak_rss"], None, None)
    if w["agreement"]["share"] is not None:
        out["greedy agreement"] = (w["agreement"]["share"], None, None)
    return out


def headline(w: dict, emulated: str | None) -> dict | None:
    """`tapeout compare`'s figures: the encoder, TPOT and the real-time factor at the longest clip (p50); none
    through an emulator (all timed)."""
    if emulated:
        return None
    longest = max(w["real_time_factor"], key=float)
    return {
        "encoder_p50_ms": w["encoder_ms"]["quantiles"]["p50"]["point"],
        "tpot_p50_ms": w["tpot_ms"]["quantiles"]["p50"]["point"],
        "rtf_p50": w["real_time_factor"][longest]["quantiles"]["p50"]["point"],
        "clip_s": float(longest),
        "agreement": w["agreement"]["share"],
    }


def headline_cell(h: dict) -> str:
    agreement = "" if h.get("agreement") is None else f" · greedy agreement {h['agreement']:.0%}"
    return (
        f"encoder {h['encoder_p50_ms']:.3g} ms · TPOT {h['tpot_p50_ms']:.3g} ms · RTF@{h['clip_s']:g} s "
        f"{h['rtf_p50']:.3f}{agreement}"
    )
