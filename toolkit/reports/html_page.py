"""report.html: one self-contained file rendered from the same report model as report.md.

Figures are drawn by matplotlib (Agg) as inline SVG, their text as SVG text in the reader's own
sans-serif (selectable, a third of the size of glyph paths): no script, no font file, no network,
no CDN; the file opens offline in any browser. Each figure is a <figure id="fig-…"> so
tests (and readers' tools) can find it. Figures: the latency distribution with its percentiles,
their bounds and the budgets; time by op type; the slowest ops by bound; the roofline of the ops;
the estimate by kernel class; the sensitivity loop's steps; a generation's TTFT and TPOT; a stream's drift.
The text and tables are report.md's own, section by section, so the page shows everything report.md does
(markdown-it, which rich already brings, with raw HTML, links and images off). The comparison page for
`tapeout compare` has its table and the accuracy-latency Pareto chart.
"""

from __future__ import annotations

import html
import io
import re
from typing import Any

from tapeout.core import workload
from tapeout.records.report import Report

_BOUND_COLOURS = {"compute": "#1b9e77", "memory": "#d95f02", "overhead": "#7570b3", "unknown": "#999999"}
_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0;font-size:13px}td,th{border:1px solid #ddd;padding:3px 7px;text-align:left}
th{background:#f4f4f4}.pass{color:#1a7f37;font-weight:600}.fail{color:#cf222e;font-weight:600}
.inconclusive,.unmeasured,.estimated-pass,.estimated-fail{color:#9a6700;font-weight:600}
figure{margin:1em 0}figcaption{color:#555;font-size:13px}svg{max-width:100%;height:auto}.note{color:#555}
"""


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    matplotlib.rcParams.update(
        {
            "svg.fonttype": "none",
            "svg.hashsalt": "tapeout",
            "font.size": 9,
            "axes.spines.top": False,
            "axes.spines.right": False,
            # labels are the user's names (outputs, nodes, builds), text: `$x$` in one is not mathtext to parse
            "text.parse_math": False,
        }
    )
    import matplotlib.pyplot as plt

    return plt


def _log(ax, *axes: str) -> None:
    """A log scale labelled in plain text: matplotlib's default labels are mathtext ($10^{3}$), whose parser took
    a third of a report's render time. The same ticks, minor ones labelled where the range is narrow."""
    from matplotlib.ticker import LogFormatter

    for name in axes:
        axis = ax.xaxis if name == "x" else ax.yaxis
        (ax.set_xscale if name == "x" else ax.set_yscale)("log")
        axis.set_major_formatter(LogFormatter())
        axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    _plt().close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)  # RDF licence block: nothing to show


def _figure(fid: str, svg: str, caption: str) -> str:
    return f'<figure id="fig-{fid}">{svg}<figcaption>{html.escape(caption)}</figcaption></figure>'


def _table(header: list[str], rows: list[list[Any]], classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        body.append(
            "<tr>"
            + "".join(f"<td{cls if j == 4 else ''}>{html.escape(str(c))}</td>" for j, c in enumerate(row))
            + "</tr>"
        )
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


# ---------------------------------------------------------------- figures


def latency_figure(m: dict, budgets: list[dict]) -> str | None:
    hist, lat = m.get("latency_histogram"), m.get("latency_ms")
    if not hist or not lat:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    edges = hist["edges_ms"]
    for i, counts in enumerate(hist["counts"]):
        ax.stairs(counts, edges, label=f"process {i + 1}", alpha=0.8)
    _log(ax, "x")
    colours = {"p50": "#1b9e77", "p90": "#d95f02", "p99": "#7570b3"}
    for key, q in lat["quantiles"].items():
        ax.axvline(q["point"], color=colours.get(key, "k"), lw=1.2, label=f"{key} {q['point']:.4g} ms")
        upper = q["upper"] if q["upper"] is not None else edges[-1]
        ax.axvspan(q["lower"], upper, color=colours.get(key, "k"), alpha=0.12)
    for b in budgets:
        if b["budget"].startswith("latency_"):
            ax.axvline(b["limit"], color="#cf222e", ls="--", lw=1.2, label=f"{b['budget']} limit {b['limit']:g}")
    ax.set_xlabel("latency per inference, ms (log)")
    ax.set_ylabel("runs")
    ax.legend(fontsize=7, frameon=False, ncol=2)
    return _figure(
        "latency",
        _svg(fig),
        f"Latency distribution: {lat['count']} timed runs in {lat['repeats']} fresh "
        f"processes; lines are the percentiles, bands their {lat['confidence']:.0%} order-statistic bounds.",
    )


def _bars(labels: list[str], values: list[float], colour, xlabel: str):
    """Horizontal bars, one per label, tall enough for all of them."""
    fig, ax = _plt().subplots(figsize=(7.5, 0.25 * len(labels) + 0.8))
    ax.barh(labels, values, color=colour)
    ax.set_xlabel(xlabel)
    return fig, ax


def op_type_figure(prof: dict | None) -> str | None:
    if not prof or not prof.get("op_types"):
        return None
    rows = prof["op_types"][:15][::-1]
    fig, _ = _bars(
        [f"{r['op_type']} ({r['provider'].replace('ExecutionProvider', '')})" for r in rows],
        [r["total_us"] / prof["runs"] for r in rows],
        "#4c72b0",
        "µs per profiled run",
    )
    return _figure(
        "op-types",
        _svg(fig),
        f"Time by op type (profiler on, separate pass; {prof.get('method', '')}). "
        "Profiled runs are slower than timed ones: read the shares.",
    )


def ops_figure(b: dict | None) -> str | None:
    if not b or not b.get("ops"):
        return None
    ops = b["ops"][:15][::-1]
    fig, ax = _bars(
        [f"{o['node'][:40]} ({o['op_type']})" for o in ops],
        [o["mean_us"] for o in ops],
        [_BOUND_COLOURS.get(o["bound"], "#999") for o in ops],
        "µs per run (scaled to the timed p50)",
    )
    handles = [_plt().Rectangle((0, 0), 1, 1, color=c) for c in _BOUND_COLOURS.values()]
    ax.legend(handles, [f"{k}-bound" for k in _BOUND_COLOURS], fontsize=7, frameon=False)
    return _figure(
        "ops",
        _svg(fig),
        "The slowest ops (each a runtime kernel, fused as the runtime fused it), coloured by what bounds them.",
    )


def roofline_figure(b: dict | None) -> str | None:
    if not b or not b.get("ops"):
        return None
    points = [o for o in b["ops"] if o.get("intensity") and o.get("achieved_gflops")]
    roof = b["roof"]
    if not points or not roof.get("bandwidth_gbs"):
        return None
    plt = _plt()
    import numpy as np

    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    xs = np.geomspace(
        min(0.01, min(o["intensity"] for o in points)), max(1e4, max(o["intensity"] for o in points)), 200
    )
    for prec, tops in roof["peaks_tops"].items():
        ax.plot(xs, np.minimum(tops * 1e3, xs * roof["bandwidth_gbs"]), lw=1, label=f"roof {prec}")
    for bound, colour in _BOUND_COLOURS.items():
        sel = [o for o in points if o["bound"] == bound]
        if sel:
            ax.scatter(
                [o["intensity"] for o in sel],
                [o["achieved_gflops"] for o in sel],
                s=[max(8.0, 300 * o["share"]) for o in sel],
                color=colour,
                alpha=0.7,
                label=f"{bound}-bound ops",
            )
    _log(ax, "x", "y")
    ax.set_xlabel("arithmetic intensity, FLOP/byte")
    ax.set_ylabel("achieved GFLOP/s")
    ax.legend(fontsize=7, frameon=False)
    return _figure(
        "roofline",
        _svg(fig),
        f"Roofline: each op at its achieved rate (dot size: share of time) under "
        f"the roofs of {roof['name']} ({roof['source']}).",
    )


def estimate_figure(e: dict | None) -> str | None:
    if not e or not e.get("by_class"):
        return None
    plt = _plt()
    import numpy as np

    rows = e["by_class"]
    fig, ax = plt.subplots(figsize=(7.5, 2.8))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["roofline_us"] for r in rows], 0.4, label="roofline (lower bound)", color="#8da0cb")
    if e.get("predicted_ms"):
        ax.bar(x + 0.2, [r["predicted_us"] for r in rows], 0.4, label="calibrated prediction", color="#fc8d62")
    ax.set_xticks(x, [r["class"] for r in rows])
    _log(ax, "y")
    ax.set_ylabel("µs per inference")
    ax.legend(fontsize=7, frameon=False)
    return _figure("estimate", _svg(fig), f"Estimate for {e['device']} by kernel class. {e['method']}.")


def sensitivity_figure(q: dict | None) -> str | None:
    steps = ((q or {}).get("search") or {}).get("steps") or []
    if len(steps) < 2:  # the rule table's plan met the budget: there was no loop to draw
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 2.8))
    idx = [s["index"] for s in steps]
    ax.plot(idx, [s["metric"] for s in steps], marker="o", color="#4c72b0", label="metric")
    ax.set_xlabel("sensitivity-loop step")
    ax.set_ylabel("metric")
    lat = [(s["index"], s["latency_ms"]) for s in steps if s.get("latency_ms")]
    if lat:
        ax2 = ax.twinx()
        ax2.plot(*zip(*lat, strict=True), marker="s", color="#dd8452", label="quick latency ms")
        ax2.set_ylabel("quick latency, ms")
    for s in steps:
        if s.get("group"):
            ax.annotate(f"{s['group']}→{s['precision']}", (s["index"], s["metric"]), fontsize=6, rotation=20)
    return _figure(
        "sensitivity",
        _svg(fig),
        "The precision loop: each step moves the most sensitive group up the "
        "ladder; the metric and the quick latency after it. " + str((q.get("search") or {}).get("stopped", "")),
    )


def generation_figure(w: dict) -> str:
    """TTFT against prompt length (p50, p90) and time per output token against position (p50, p90 per bin)."""
    if not w.get("tpot_by_position"):
        return ""
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3))
    lengths = [int(n) for n in w["ttft_ms"]]
    for q, style in (("p50", "o-"), ("p90", "s--")):
        left.plot(lengths, [w["ttft_ms"][str(n)]["quantiles"][q]["point"] for n in lengths], style, label=q)
    left.set_xlabel("prompt tokens")
    left.set_ylabel("time to first token (ms)")
    left.legend(frameon=False)
    bins = w["tpot_by_position"]
    middle = [(b["from"] + b["to"]) / 2 for b in bins]
    right.plot(middle, [b["p50_ms"] for b in bins], "o-", label="p50")
    right.plot(middle, [b["p90_ms"] for b in bins], "s--", label="p90")
    right.set_xlabel("position in the sequence")
    right.set_ylabel("time per output token (ms)")
    right.set_ylim(bottom=0)
    right.legend(frameon=False)
    fig.tight_layout()
    return _figure(
        "generation",
        _svg(fig),
        "Time to first token against prompt length, and the decode step's time "
        "against the position it decodes (the KV cache grows with it).",
    )


def stream_figure(w: dict) -> str:
    """The streamed outputs' error against the chunk index (state drift shows as growth along the stream)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3))
    carried = set(w["settings"]["state"].values())
    for name, d in w["drift"]["outputs"].items():
        middle = [(b["from"] + b["to"]) / 2 for b in d["by_chunk"]]
        ax.plot(
            middle,
            [max(b["max_abs"], 1e-12) for b in d["by_chunk"]],
            "s--" if name in carried else "o-",
            label=name + (" (state)" if name in carried else ""),
        )
    ax.set_yscale("log")
    ax.set_xlabel("chunk in the golden stream")
    ax.set_ylabel("max |artifact − reference|")
    ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return _figure(
        "stream",
        _svg(fig),
        "Each output's largest difference from the FP32 reference along the golden "
        "stream, state carried on both sides: a precision error stays flat, state drift grows.",
    )


# Which of report.md's sections (by the start of their heading) each figure belongs under.
_FIGURES_UNDER = (
    ("Latency", "latency"),
    ("Where the time goes", "op-types"),
    ("Bottlenecks", "ops"),
    ("Bottlenecks", "roofline"),
    ("Estimate", "estimate"),
    ("Precision", "sensitivity"),
)


def _markdown():
    """report.md's own text as HTML: tables on; raw HTML, links and images off, so a name from the user's model
    is text and nothing on the page reaches the network."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").disable(["link", "image", "autolink"])


def _sections(markdown: str) -> list[tuple[str, str]]:
    """report.md cut at its `## ` headings: (heading, body), the title and summary first with heading ""."""
    out: list[tuple[str, list[str]]] = [("", [])]
    for line in markdown.splitlines():
        if line.startswith("## "):
            out.append((line[3:], []))
        else:
            out[-1][1].append(line)
    return [(heading, "\n".join(body)) for heading, body in out]


def render(report: Report) -> str:
    """Everything report.md shows, section by section from its own text, with each figure under its section.
    The budget table keeps its verdict colours."""
    from tapeout.reports.cells import budget_rows
    from tapeout.reports.markdown import render_markdown

    r = report.to_json()
    m = r.get("measurement") or {}
    w = r.get("workload")
    figures = {
        "workload": workload.get(w["kind"]).html_figure(w) if w else "",
        "latency": latency_figure(m, r["budgets"]) if m else None,
        "op-types": op_type_figure(m.get("op_profile")),
        "ops": ops_figure(r.get("bottlenecks")),
        "roofline": roofline_figure(r.get("bottlenecks")),
        "estimate": estimate_figure(r.get("estimate")),
        "sensitivity": sensitivity_figure(r.get("quantization")),
    }
    md = _markdown()
    title = f"tapeout {r['kind']}: {r['project']['name']} → {r['profile']['name']}"
    parts = []
    for heading, body in _sections(render_markdown(report)):
        if heading == "Budgets" and r["budgets"]:
            parts.append(
                "<h2>Budgets</h2>"
                + _table(
                    ["budget", "limit", "measured", "bound", "verdict", "why"],
                    budget_rows(r["budgets"]),
                    [b["verdict"] for b in r["budgets"]],
                )
            )
            continue
        parts.append((f"<h2>{html.escape(heading)}</h2>" if heading else "") + md.render(body))
        for prefix, fid in ((workload.get(w["kind"]).heading, "workload"), *_FIGURES_UNDER) if w else _FIGURES_UNDER:
            if heading.startswith(prefix) and figures.get(fid):
                parts.append(figures.pop(fid))
    leftover = [f for f in figures.values() if f]  # a figure whose section report.md did not write
    if leftover:
        parts.append("<h2>Figures</h2>" + "".join(leftover))
    return _page(title, parts)


def render_compare(result: dict) -> str:
    from tapeout.reports.compare import HEADER, table_rows

    parts = [
        "<h1>tapeout compare</h1>",
        f"<p>Recommendation: {html.escape(result['why'])}.</p>",
        _table(HEADER, table_rows(result)),
    ]
    fig = pareto_figure(result)
    if fig:
        parts.append("<h2>Accuracy against latency</h2>" + fig)
    return _page("tapeout compare", parts)


def render_farm(data: dict) -> str:
    """The farm's page: its rows (where each step ran, how it ended), then per model the builds side by side, the
    Pareto front and the recommendation."""
    from tapeout.reports import farm
    from tapeout.reports.compare import HEADER, table_rows

    parts = [
        "<h1>tapeout farm</h1>",
        f"<p>{len(data['rows'])} rows on {len(data['nodes'])} node(s) in {data['seconds']:.0f} s; exit "
        f"{data['exit_code']}. Every figure below was read from a build dir verified against its manifest on the "
        "head.</p>",
        "<h2>Rows</h2>",
        _table(farm.HEADER, farm.table_rows(data)),
    ]
    result = data.get("compare")
    if result:
        parts.append(f"<h2>Builds side by side</h2><p>Recommendation: {html.escape(result['why'])}.</p>")
        for i, project in enumerate(dict.fromkeys(r["project"] for r in result["rows"])):
            group = {**result, "rows": [r for r in result["rows"] if r["project"] == project]}
            parts.append(f"<h3>{html.escape(project)}</h3>" + _table(HEADER, table_rows(group)))
            fig = pareto_figure(group, f"pareto-{i}")
            if fig:
                parts.append(fig)
    return _page("tapeout farm", parts)


def pareto_figure(result: dict, fid: str = "pareto") -> str | None:
    rows = [
        r
        for r in result["rows"]
        if r["accuracy"] and r["accuracy"]["artifact"] is not None and (r["latency_ms"].get("p50") or {}).get("point")
    ]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    markers = {"measured": "o", "estimated": "^", "emulated": "x"}
    for i, r in enumerate(rows, 1):
        p = r["latency_ms"]["p50"]
        upper = p["upper"] if p.get("upper") is not None else p["point"]
        on_front = r["build_dir"] in result["pareto"]
        ax.errorbar(
            [p["point"]],
            [r["accuracy"]["artifact"]],
            xerr=[[p["point"] - p["lower"]], [upper - p["point"]]],
            fmt=markers.get(r["latency_status"], "o"),
            color="#cf222e" if on_front else "#4c72b0",
            capsize=3,
        )
        # a number beside the point, its build named in the caption: names of builds close together overlapped
        ax.annotate(
            str(i),
            (p["point"], r["accuracy"]["artifact"]),
            fontsize=8,
            xytext=(4, 4 + 7 * ((i - 1) % 3)),
            textcoords="offset points",
        )
    _log(ax, "x")
    ax.set_xlabel("p50 latency, ms (log; bars: bounds)")
    ax.set_ylabel("accuracy metric")
    key = " · ".join(f"{i} {r['project']}/{r['profile']}" for i, r in enumerate(rows, 1))
    return _figure(
        fid,
        _svg(fig),
        f"Each build at its p50 (o measured, ▲ estimated, x emulated) and its metric; red: on the Pareto front. {key}.",
    )


def _page(title: str, parts: list[str]) -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n"
    )
