"""`tapeout compare`, `tapeout diff` and report.html, on real builds of digits-cnn.

The HTML is parsed (every tag closed where HTML requires it, every figure present), checked to be
self-contained (no script, no external reference), and rendered in headless Chromium with a
screenshot where Chromium is installed (skipped where it is not).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import SAMPLES, HtmlText, html_shows_everything, one_line_error, reseal, run_cli
from tapeout.reports.compare import recommend

FIGURES = {"fig-latency", "fig-op-types", "fig-ops", "fig-roofline", "fig-estimate"}
_VOID = {
    "meta",
    "br",
    "img",
    "hr",
    "link",
    "input",
    "path",
    "use",
    "rect",
    "circle",
    "line",
    "stop",
    "polyline",
    "polygon",
    "ellipse",
    "image",
}


class _Checker(HTMLParser):
    """Tag balance (SVG's self-closed elements excepted), ids, and every URL-bearing attribute."""

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.ids: set[str] = set()
        self.urls: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        for key in ("src", "href", "xlink:href"):
            if attrs.get(key) and not attrs[key].startswith("#"):
                self.urls.append(attrs[key])
        if tag not in _VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.add(tag)
        attrs = dict(attrs)
        for key in ("src", "href", "xlink:href"):
            if attrs.get(key) and not attrs[key].startswith("#"):
                self.urls.append(attrs[key])

    def handle_endtag(self, tag):
        if tag in _VOID:
            return
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()


def _parse(path: Path) -> _Checker:
    checker = _Checker()
    checker.feed(path.read_text())
    checker.close()
    assert not checker.stack, f"unclosed: {checker.stack}"
    return checker


@pytest.fixture(scope="module")
def two_builds(digits_build, digits_int8_build):
    return digits_build, digits_int8_build


def test_report_html_is_self_contained_with_every_figure(digits_build):
    page = digits_build / "report.html"
    checker = _parse(page)
    assert checker.ids >= FIGURES, FIGURES - checker.ids
    assert "script" not in checker.tags and not checker.urls, checker.urls
    assert "<metadata>" not in page.read_text()
    assert checker.tags >= {"svg", "table", "figure"}


def test_report_html_shows_everything_report_md_shows(digits_build):
    html_shows_everything(digits_build)


def test_text_from_the_users_model_stays_text_on_the_page(digits_build):
    """Names come from the user's files: on the page they are text, never markup, a link or an image to fetch."""
    from tapeout.builds.reader import open_build
    from tapeout.reports import html_page

    report = open_build(digits_build).report
    hostile = "<script>alert(1)</script> ![x](http://example.invalid/x.png) [y](http://example.invalid/) <b>z</b>"
    report = report.model_copy(update={"project": report.project.model_copy(update={"name": hostile})})
    page = html_page.render(report)
    checker = _Checker()
    checker.feed(page)
    assert "script" not in checker.tags and "b" not in checker.tags and not checker.urls, checker.urls
    text = HtmlText()
    text.feed(page)
    assert hostile in "".join(text.parts)


def test_a_name_with_mathtext_syntax_is_drawn_as_text():
    """Figure labels are the user's names (an output, an op type from a plug-in): `$` in one is text, where
    matplotlib's mathtext parser raised on it and the report ended with an internal error."""
    from tapeout.reports import html_page

    figure = html_page.op_type_figure(
        {"op_types": [{"op_type": "a$\\frac{$b", "provider": "CPUExecutionProvider", "total_us": 5.0}], "runs": 1}
    )
    assert figure is not None and "a$\\frac{$b" in figure


def test_compare_table_marks_every_figure_and_recommends(two_builds, tmp_path):
    fp32, int8 = two_builds
    page = tmp_path / "compare.html"
    result = run_cli("compare", fp32, int8, "--json", "--html", page)
    assert result.code == 0, result.err
    data = result.json()
    assert [r["precision"] for r in data["rows"]] == ["fp32", "int8"]
    for r in data["rows"]:
        assert r["latency_status"] == "measured" and r["latency_ms"]["p50"]["lower"] <= r["latency_ms"]["p50"]["point"]
        assert r["accuracy"]["metric"] == "top1" and r["artifact_mb"] > 0
    assert len(data["recommended"]) == 1 and data["recommended"][0] in (str(fp32), str(int8))
    assert data["pareto"] and set(data["pareto"]) <= {str(fp32), str(int8)}
    assert "fig-pareto" in _parse(page).ids
    # the points carry numbers, the caption names their builds: names side by side overlapped in the figure
    caption = page.read_text().split('id="fig-pareto"', 1)[1].split("<figcaption>", 1)[1].split("</figcaption>", 1)[0]
    assert " 1 digits-cnn/" in caption and " · 2 digits-cnn/" in caption
    text = run_cli("compare", fp32, int8)
    assert "recommendation:" in text.out and "measured" in text.out
    narrow = run_cli("compare", fp32, int8, env={"COLUMNS": "100"})  # a CI log's width: each build named whole
    assert all(f"{r['project']}/{r['profile']}" in narrow.out for r in data["rows"]), narrow.out
    assert max(len(line) for line in narrow.out.splitlines()) <= 100


def test_compare_an_emulated_build_is_estimated_never_measured(two_builds, tmp_path):
    """A TensorRT build here has no engine: its row is estimated (the L4's roofline bound), never a measurement."""
    profile = tmp_path / "trt.toml"
    profile.write_text(
        'extends = "tensorrt-fp16"\ndevice = "l4"\n[check]\niterations = 20\nrepeats = 1\nwarmup_min_s = 0.05\n'
    )
    trt = tmp_path / "trt"
    built = run_cli("build", SAMPLES / "digits-cnn", "-p", profile, "-o", trt)
    assert built.code == 0, built.err
    data = run_cli("compare", two_builds[0], trt, "--json").json()
    row = next(r for r in data["rows"] if r["target"] == "tensorrt")
    assert row["latency_status"] == "estimated" and row["latency_ms"]["p50"]["point"] is None
    assert row["latency_ms"]["p50"]["lower"] > 0 and row["peak_rss_mb"] is None
    assert data["recommended"] == [str(two_builds[0])]


def test_compare_project_with_profiles_and_bad_input(two_builds, tmp_path):
    # a copy of the project without builds: the sample's own build/ holds whatever the README's command left there
    project = tmp_path / "digits-cnn"
    shutil.copytree(SAMPLES / "digits-cnn", project, ignore=shutil.ignore_patterns("build"))
    missing = run_cli("compare", project, "-p", "cpu-fp32")
    assert missing.code == 2 and "tapeout build" in one_line_error(missing)
    not_build = run_cli("compare", tmp_path)
    assert not_build.code == 2 and "not a build dir" in one_line_error(not_build)
    broken = tmp_path / "broken"
    shutil.copytree(two_builds[0], broken)
    (broken / "report.json").write_text("{")
    bad = run_cli("compare", broken)
    assert bad.code == 2 and "report.json" in one_line_error(bad)


def test_diff_says_what_moved_beyond_its_noise(two_builds, tmp_path):
    fp32, int8 = two_builds
    same = run_cli("diff", fp32, fp32, "--json").json()
    assert same and not any(r["moved"] for r in same)
    rows = {r["figure"]: r for r in run_cli("diff", fp32, int8, "--json").json()}
    assert rows["artifact MB"]["moved"] and rows["artifact MB"]["change"] < -0.5  # INT8 weights are a quarter
    assert "latency p50 ms" in rows and rows["latency p50 ms"]["why"]
    for machine in ("host copy bandwidth GB/s", "host FP32 matmul GFLOP/s"):  # measured beside each timing
        assert rows[machine]["a"] > 0 and rows[machine]["b"] > 0 and "machine" in rows[machine]["why"]
    assert not any(r["moved"] for r in same if r["figure"].startswith("host "))
    # the machine's memory at 40 % of its speed, every sample, at B's measurement: flagged, whatever the latency did
    drifted = tmp_path / "drifted"
    shutil.copytree(int8, drifted)
    report = json.loads((drifted / "report.json").read_text())
    state = report["measurement"]["host_state"]
    state["bandwidth_gbs"] *= 0.4
    state["bandwidth_gbs_range"] = [v * 0.4 for v in state["bandwidth_gbs_range"]]
    (drifted / "report.json").write_text(json.dumps(report))
    reseal(drifted)  # as a build measured on the drifted machine would have written it
    moved = {r["figure"]: r for r in run_cli("diff", int8, drifted, "--json").json()}
    assert (
        moved["host copy bandwidth GB/s"]["moved"]
        and "may be the machine's" in moved["host copy bandwidth GB/s"]["why"]
    )
    assert not moved["host FP32 matmul GFLOP/s"]["moved"]
    unchecked = tmp_path / "unchecked"  # the shared build may have been checked by another test
    shutil.copytree(fp32, unchecked)
    (unchecked / "check.json").unlink(missing_ok=True)
    no_check = run_cli("diff", unchecked)
    assert no_check.code == 2 and "check.json" in one_line_error(no_check)


def test_diff_of_a_build_and_its_check(two_builds, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(two_builds[0], copy)
    checked = run_cli("check", copy, "--iterations", "60", "--repeats", "2")
    assert checked.code == 0, checked.err
    assert (copy / "check.html").is_file() and json.loads((copy / "check.json").read_text())["estimate"]
    rows = run_cli("diff", copy, "--json").json()
    assert {r["figure"] for r in rows} >= {"latency p50 ms", "artifact MB"}
    assert not next(r for r in rows if r["figure"] == "artifact MB")["moved"]


@pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")), reason="no Chromium here")
def test_report_html_renders_in_headless_chromium(digits_build, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    shot = tmp_path / "report.png"
    run = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1200,3000",
            f"--screenshot={shot}",
            (two := digits_build / "report.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.is_file() and shot.stat().st_size > 20_000, run.stderr[-2000:]
    # a rendered page with figures is far from one flat colour
    from PIL import Image

    colours = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is None or len(colours) > 50, f"{two} rendered nearly blank"
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", two.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert len(re.findall(r"<figure id=\"fig-", dom)) >= len(FIGURES)


def test_an_emulated_timing_is_never_recommended():
    """An emulated build with no estimate shows the emulator's p50, labelled; it ranks nothing."""

    def row(name, status, p50):
        return {
            "build_dir": name,
            "profile": name,
            "project": "p",
            "latency_status": status,
            "failed": [],
            "unsettled": [],
            "accuracy": None,
            "latency_ms": {"p50": {"point": p50, "lower": p50, "upper": p50}},
        }

    best, why = recommend([row("qnn", "emulated", 0.01), row("cpu", "measured", 1.0)])
    assert best["build_dir"] == "cpu" and "measured" in why
    assert recommend([row("qnn", "emulated", 0.01)])[0] is None


def test_generation_builds_without_a_metric_are_ranked_by_their_time_per_token():
    """A generate project with no metric exits 0 (its accuracy budget unmeasured): compare recommends as build -p
    A -p B chooses, by the time per token, and names what stayed unmeasured; a failed budget still rules a build out."""

    def row(name, tpot, failed=()):
        return {
            "build_dir": name,
            "profile": name,
            "project": "lm",
            "latency_status": "measured",
            "failed": list(failed),
            "unsettled": ["accuracy_max_drop"],
            "accuracy": None,
            "latency_ms": {},
            "generate": {"tpot_p50_ms": tpot},
            "stream": None,
        }

    best, why = recommend([row("cpu-int8", 2.0), row("cpu-int4", 1.5), row("fast-but-wrong", 0.5, ["kv_cache_mb"])])
    assert best["build_dir"] == "cpu-int4"
    assert "time per token p50 (1.5 ms" in why and "unmeasured: accuracy_max_drop" in why
