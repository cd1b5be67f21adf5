"""A stream workload's figures as rows and lines: one source for the terminal, report.md and report.html."""

from __future__ import annotations

from tapeout.reports.cells import table
from tapeout.reports.generation import cold_start_and_memory, interval


def one_line(w: dict) -> str:
    """The terminal's line: chunk time, real-time factor, deadline misses, drift."""
    q = w["chunk_ms"]["quantiles"]
    rtf, dl = w["real_time_factor"], w["deadline"]
    return (
        f"stream: chunk p50 {interval(q['p50'])} p99 {q['p99']['point']:.3f} ms · real-time factor {rtf['median']:.3f} "
        f"(slowest stream {rtf['slowest']:.3f}) · {dl['misses']}/{dl['chunks']} chunks over {dl['deadline_ms']:g} ms"
        f" · max |Δ| vs reference {w['drift']['max_abs_error']:.2e}"
        + (f" ({w['drift']['max_rel_error']:.2g} of its scale)" if "max_rel_error" in w["drift"] else "")
        + f" over {w['drift']['chunks']} chunks"
    )


def chunk_rows(w: dict) -> list[list[str]]:
    q, rtf, dl = w["chunk_ms"]["quantiles"], w["real_time_factor"], w["deadline"]
    return [[name, interval(q[name])] for name in ("p50", "p90", "p99") if name in q] + [
        [
            "real-time factor (median, fastest–slowest stream)",
            f"{rtf['median']:.4f} [{rtf['fastest']:.4f}, {rtf['slowest']:.4f}] over {rtf['streams']} streams",
        ],
        [f"chunks over the {dl['deadline_ms']:g} ms deadline", f"{dl['misses']} of {dl['chunks']} ({dl['share']:.2%})"],
    ]


def drift_rows(w: dict) -> list[list[str]]:
    """Per output: its error over the stream, at the start and in the last quarter (state drift grows along it)."""
    carried = set(w["settings"]["state"].values())
    return [
        [
            name + (" (state)" if name in carried else ""),
            f"{d['max_abs']:.3g}",
            f"{d['max_rel']:.2g}" if "max_rel" in d else "—",
            str(d["worst_chunk"]),
            f"{d['first_quarter_max']:.3g}",
            f"{d['last_quarter_max']:.3g}",
        ]
        for name, d in w["drift"]["outputs"].items()
    ]


def memory_rows(w: dict) -> list[list[str]]:
    mem = w["memory_mb"]
    rows = [
        [name, f"{mem[key]:.2f}" if abs(mem[key]) >= 0.01 else f"{mem[key]:.2g} ({mem[key] * 1024:.2g} KB)"]
        for name, key in (
            ("peak RSS", "peak_rss"),
            ("process baseline (interpreter, numpy)", "process_baseline"),
            ("weights (artifact files)", "weights"),
            ("carried state", "state"),
            ("rest (runtime, arenas, activations)", "rest"),
        )
    ]
    device = mem.get("device")
    if device:  # a GPU target: the weights and the carried state are in device memory
        rows += [
            [f"device: {name}", f"{device[key]:.2f}"]
            for name, key in (
                ("peak GPU memory", "peak"),
                ("weights", "weights"),
                ("carried state", "state"),
                ("rest (CUDA context, arena, workspaces, activations)", "rest"),
            )
        ]
    return rows


def settings_line(w: dict) -> str:
    st = w["settings"]
    state = ", ".join(f"{o} → {i}" for i, o in st["state"].items())
    return (
        f"{st['chunks']} chunks of {st['deadline_ms']:g} ms per stream, {st['trials']} timed streams per process, "
        f"state carried: {state}."
    )


def section(w: dict, emulated: str | None) -> list[str]:
    out = [
        "",
        "## Stream (chunk after chunk, state carried, fresh processes)",
        "",
        settings_line(w) + f" Times in ms, with their {w['chunk_ms']['confidence']:.0%} bounds.",
    ]
    if emulated:
        out += ["", f"**Emulated**: {emulated}. Timings never judged against the budgets; the outputs are."]
    out += ["", "Time per chunk:", ""]
    out += table(["", "ms"], chunk_rows(w))
    out += [
        "",
        "Streamed outputs against the FP32 reference over the golden stream (largest absolute difference; "
        "an error that grows from the first quarter to the last is state drift):",
        "",
    ]
    out += table(
        ["output", "max", "max ÷ largest magnitude", "at chunk", "first quarter", "last quarter"], drift_rows(w)
    )
    out += cold_start_and_memory(w, memory_rows(w))
    out += [f"\nNote: {note}" for note in w.get("notes", [])]
    return out


def diff_figures(w: dict, timed: bool) -> dict[str, tuple]:
    """`tapeout diff`'s figures of a stream: (point, low, high), low and high its noise range (None: exact). The
    drift is exact given the build, also through an emulator."""
    out: dict[str, tuple] = {}
    if timed:
        for key, q in w["chunk_ms"]["quantiles"].items():
            out[f"chunk {key} ms"] = (q["point"], q["lower"], q["upper"])
        rtf = w["real_time_factor"]
        out["real-time factor"] = (rtf["median"], rtf["fastest"], rtf["slowest"])
        out["deadline misses"] = (w["deadline"]["misses"], None, None)
        out["stream peak RSS MB"] = (w["memory_mb"]["peak_rss"], None, None)
    out["stream max |Δ| vs reference"] = (w["drift"]["max_abs_error"], None, None)
    return out


def headline(w: dict, emulated: str | None) -> dict:
    """`tapeout compare`'s figures of a stream: chunk p99 and the real-time factor (not through an emulator) and the
    streamed outputs' largest error (also through one: it computes what the device computes)."""
    timed = (
        {}
        if emulated
        else {
            "chunk_p99_ms": w["chunk_ms"]["quantiles"]["p99"]["point"],
            "real_time_factor": w["real_time_factor"]["median"],
            "deadline_misses": w["deadline"]["misses"],
        }
    )
    return {**timed, "max_abs_error": w["drift"]["max_abs_error"]}


def headline_cell(s: dict) -> str:
    timed = f"chunk p99 {s['chunk_p99_ms']:.3g} ms · RTF {s['real_time_factor']:.3g} · " if "chunk_p99_ms" in s else ""
    return f"{timed}max |Δ| {s['max_abs_error']:.2g}"
