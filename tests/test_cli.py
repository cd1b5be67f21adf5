"""End to end through the real CLI: build and check digits-cnn, budgets that fail and pass, exit codes."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import SAMPLES, one_line_error, reseal, run_cli
from tapeout.builds.staging import is_build_dir
from tapeout.core import console
from tapeout.core.console import UI, on_sigint
from tapeout.core.hashing import sha256_file


def test_build_dir_is_complete(digits_build):
    for rel in ("artifact/model.onnx", "export/model.onnx", "golden.npz", "manifest.json", "report.json", "report.md"):
        assert (digits_build / rel).is_file(), rel
    assert not list(digits_build.parent.glob(".*partial*"))
    man = json.loads((digits_build / "manifest.json").read_text())
    assert man["schema"] == "tapeout.manifest/2"
    for rel, digest in man["artifact"]["files"].items():
        assert sha256_file(digits_build / "artifact" / rel) == digest
    assert man["versions"]["onnxruntime"] and man["versions"]["torch"]
    assert man["seeds"] == {"project": 0}
    assert man["profile"]["target"] == "onnxruntime" and man["options_resolved"]["graph_optimization"] == "all"
    assert man["model"]["weights_sha256"] and "model.py" in man["model"]["files"]

    report = json.loads((digits_build / "report.json").read_text())
    assert report["schema"] == "tapeout.report/2" and report["exit_code"] == 0
    lat = report["measurement"]["latency_ms"]
    assert lat["count"] == 120 and lat["repeats"] == 2
    p90 = lat["quantiles"]["p90"]
    assert p90["lower"] <= p90["point"] <= p90["upper"]
    mem = report["measurement"]["memory_mb"]
    assert 20 < mem["peak_rss"] < 2000 and mem["rss_after_session"] >= mem["rss_before_session"]
    assert all(c > 0 for c in report["measurement"]["cold_start_ms"]["per_repeat"])
    assert report["accuracy"]["reference"] > 0.95 and report["accuracy"]["artifact"] == report["accuracy"]["reference"]
    op_types = {t["op_type"] for t in report["measurement"]["op_profile"]["op_types"]}
    assert "Conv" in op_types
    assert "## Budgets" in (digits_build / "report.md").read_text()


def test_artifact_is_portable_across_cpus(digits_build):
    """No NCHWc layout ops in the saved artifact: their weight blocking is tied to the build CPU's vector
    width, and such a model computed garbage on an AVX-512 Xeon after a build on an AVX2 EPYC."""
    import onnx

    model = onnx.load(str(digits_build / "artifact" / "model.onnx"))
    assert not [n.op_type for n in model.graph.node if n.domain == "com.microsoft.nchwc"]
    meta = json.loads((digits_build / "manifest.json").read_text())["artifact"]["meta"]
    assert meta == {"saved_optimization": "extended", "load_optimization": "all"}


def test_check_passes_and_writes_check_json_and_junit(digits_build, tmp_path):
    junit = tmp_path / "check.xml"
    result = run_cli("check", digits_build, "--junit", junit)
    assert result.code == 0, result.err + result.out
    assert "parity_min_cosine" in result.out and "PASS" in result.out
    check = json.loads((digits_build / "check.json").read_text())
    assert check["kind"] == "check" and check["parity"][0]["within_tolerance"]
    xml = junit.read_text()
    assert 'tests="2" failures="0"' in xml  # one testcase per judged budget, none failing
    assert 'name="parity_min_cosine"' in xml and 'name="accuracy_max_drop"' in xml


def _profile_with_p90(tmp_path, fast_profile, limit_ms: float, name: str):
    path = tmp_path / f"{name}.toml"
    path.write_text(f'extends = "{fast_profile}"\n[budgets]\nlatency_p90_ms = {limit_ms}\n')
    return path


def test_latency_budget_far_below_the_measured_p90_fails_build_and_check(digits_build, tmp_path, fast_profile):
    # A quarter, not half: this shared VM drifts up to ~1.8× between minutes, and the p90 here was
    # measured by an earlier build. The half-p90 case of the issue was run by hand for both samples.
    p90 = json.loads((digits_build / "report.json").read_text())["measurement"]["latency_ms"]["quantiles"]["p90"][
        "point"
    ]
    tight = _profile_with_p90(tmp_path, fast_profile, p90 / 4, "tight")
    build = run_cli("build", SAMPLES / "digits-cnn", "--profile", tight, "--out", tmp_path / "tight", "--json")
    assert build.code == 1, build.err
    verdict = {b["budget"]: b["verdict"] for b in build.json()["budgets"]}
    assert verdict["latency_p90_ms"] == "fail"
    assert is_build_dir(tmp_path / "tight")  # a failed budget still leaves the complete evidence
    junit = tmp_path / "tight.xml"
    check = run_cli("check", tmp_path / "tight", "--json", "--junit", junit)
    assert check.code == 1
    xml = junit.read_text()
    assert 'failures="1"' in xml and '<failure message="fail: measured ' in xml and "lower bound" in xml
    assert '<property name="limit" value="' in xml and '<property name="measured" value="' in xml  # values too
    assert re.search(r'<testsuite [^>]* time="[0-9.]+" timestamp="', xml)
    assert {b["budget"]: b["verdict"] for b in check.json()["budgets"]}["latency_p90_ms"] == "fail"


def test_generous_latency_budget_passes_build_and_check(digits_build, tmp_path, fast_profile):
    p90 = json.loads((digits_build / "report.json").read_text())["measurement"]["latency_ms"]["quantiles"]["p90"][
        "point"
    ]
    generous = _profile_with_p90(tmp_path, fast_profile, max(p90 * 50, 5.0), "generous")
    build = run_cli("build", SAMPLES / "digits-cnn", "--profile", generous, "--out", tmp_path / "gen", "--json")
    assert build.code == 0, build.err
    assert run_cli("check", tmp_path / "gen").code == 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["build", "nowhere", "--profile", "cpu-fp32"], "no project file"),
        (["build", SAMPLES / "digits-cnn", "--profile", "no-such"], "unknown profile 'no-such'"),
        (
            ["build", SAMPLES / "digits-cnn", "--profile", "cpu-int9"],
            "unknown profile 'cpu-int9': did you mean 'cpu-int8'?",
        ),
        (
            ["build", SAMPLES / "digits-cnn", "--profile", "openvino-cpu-fp16"],
            "unknown profile 'openvino-cpu-fp16': did you mean 'openvino-cpu-fp32'?",
        ),
        (["check", SAMPLES / "digits-cnn"], "not a tapeout build dir"),
        (["check", "nowhere"], "not found"),
        (["report", "nowhere"], "not found"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, needle, tmp_path):
    result = run_cli(*args, cwd=tmp_path)
    assert result.code == 2
    assert needle in one_line_error(result)


def test_the_suites_forked_runner_answers_as_a_plain_python_m_tapeout(tmp_path, monkeypatch):
    """run_cli forks from tests/cli_zygote.py; a command through it and through a cold interpreter agree:
    exit code, stdout, stderr, working directory and environment."""
    project = tmp_path / "p"
    project.mkdir()
    (project / "tapeout.toml").write_text('[model]\nsource = "model.py:build"\n[[inputs]]\nname = "x"\nshape = [1]\n')
    (project / "model.py").write_text("import os\ndef build():\n    raise RuntimeError(os.environ['MARK'])\n")
    args = ("build", ".", "--profile", "cpu-fp32", "--out", tmp_path / "out")
    forked = run_cli(*args, cwd=project, env={"MARK": "from the environment"})
    monkeypatch.setenv("TAPEOUT_TEST_SUBPROCESS", "1")
    plain = run_cli(*args, cwd=project, env={"MARK": "from the environment"})
    assert forked.code == plain.code == 2, forked.err + plain.err
    assert "from the environment" in forked.err
    assert (forked.out, forked.err) == (plain.out, plain.err)


def test_bad_field_and_unknown_target_exit_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('extends = "cpu-fp32"\n[check]\nrepeats = 0\n')
    line = one_line_error(result := run_cli("build", SAMPLES / "digits-cnn", "--profile", bad))
    assert result.code == 2 and "check.repeats" in line and "greater than or equal to 1" in line
    bad.write_text('target = "tensorrt-llm"\n')
    line = one_line_error(result := run_cli("build", SAMPLES / "digits-cnn", "--profile", bad))
    assert result.code == 2 and "unknown target 'tensorrt-llm'" in line and "onnxruntime" in line


def test_check_refuses_a_tampered_artifact_and_an_unknown_backend(digits_build, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(digits_build, copy)
    (copy / "artifact" / "model.onnx").write_bytes(b"tampered")
    result = run_cli("check", copy)
    assert result.code == 2 and "differs from the one the build recorded" in one_line_error(result)

    shutil.rmtree(copy)
    shutil.copytree(digits_build, copy)
    man = json.loads((copy / "manifest.json").read_text())
    man["artifact"]["target"] = "qnn-htp"
    (copy / "manifest.json").write_text(json.dumps(man))
    result = run_cli("check", copy)
    assert result.code == 2 and "built for target 'qnn-htp'" in one_line_error(result)


def test_check_on_wrong_input_shapes_in_golden(digits_build, tmp_path):
    """Golden inputs that do not fit the artifact (e.g. a build dir assembled by hand) fail with one line."""
    copy = tmp_path / "copy"
    shutil.copytree(digits_build, copy)
    with np.load(copy / "golden.npz") as data:
        arrays = {k: data[k] for k in data.files}
    arrays["input.image"] = np.zeros((4, 1, 1, 8, 9), np.float32)
    np.savez(copy / "golden.npz", **arrays)
    man = json.loads((copy / "manifest.json").read_text())
    man["golden"]["sha256"] = sha256_file(copy / "golden.npz")
    (copy / "manifest.json").write_text(json.dumps(man))
    result = run_cli("check", copy)
    assert result.code == 2 and "rejected its inputs" in one_line_error(result)


def test_unavailable_target_exits_4(monkeypatch, capsys):
    """Our side of the contract: a backend whose probe fails makes build exit 4 with the install hint."""
    from tapeout import cli
    from tapeout.targets import ort_cpu
    from tapeout.targets.base import Probe

    monkeypatch.setattr(
        ort_cpu.OrtCpu,
        "probe",
        classmethod(lambda cls: Probe(False, reason="runtime missing", install_hint="pip install onnxruntime")),
    )
    monkeypatch.setattr(sys, "argv", ["tapeout", "build", str(SAMPLES / "digits-cnn"), "--profile", "cpu-fp32"])
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # restored after: main installs its own
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 4
    assert "not available here: runtime missing — pip install onnxruntime" in capsys.readouterr().err


def test_help_and_check_import_nothing_heavy():
    code = (
        "import sys, time; t = time.perf_counter()\n"
        "from tapeout import cli\nfrom tapeout.steps import flows\n"
        "sys.argv = ['tapeout', '--help']\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'onnxruntime', 'onnxscript', 'onnx_ir', 'sklearn') if m in sys.modules]\n"
        "print('HEAVY', heavy, round(time.perf_counter() - t, 2))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("HEAVY"))
    assert line.startswith("HEAVY []"), line
    assert float(line.split()[-1]) < 2.0  # generous for a loaded 2-core CI machine; ~0.4 s here


def test_the_command_line_starts_without_pydantic():
    # `tapeout --help`, `--version` and every command's start pay only for typer: each command imports its own
    code = "import sys\nimport tapeout.cli\nprint(sorted(m for m in ('pydantic', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_targets_profiles_and_report_commands(digits_build):
    targets = run_cli("targets", "--json").json()
    assert targets[0]["target"] == "onnxruntime" and targets[0]["available"]
    workloads = {t["target"]: t["workloads"] for t in targets}
    assert workloads["onnxruntime"] == ["forward", "generate", "stream", "transcribe"]
    assert workloads["qnn"] == ["forward", "generate", "stream"]  # qnn: a static cache; no encoder-decoder one yet
    assert workloads["tensorrt"] == ["forward"]
    listed = run_cli("profiles", "list", "--json").json()
    assert "cpu-fp32" in listed["profiles"] and "h100-sxm" in listed["devices"]
    import re

    rows = [line for line in run_cli("profiles", "list").out.splitlines() if not line.startswith("device specs")]
    columns = [re.match(r"(\S+\s+)(\S+\s+)\S", line) for line in rows]
    assert len(rows) == len(listed["profiles"]) and all(columns)
    # the target and description columns line up whatever the longest name
    assert len({(len(m[1]), len(m[1]) + len(m[2])) for m in columns}) == 1, rows
    shown = json.loads(run_cli("profiles", "show", "cpu-fp32").out)
    assert shown["check"]["iterations"] == 300 and shown["options"]["threads"] == 0
    (digits_build / "report.md").unlink()
    rendered = run_cli("report", digits_build)
    assert rendered.code == 0 and (digits_build / "report.md").is_file() and "## Latency" in rendered.out


def test_undecidable_latency_budget_doubles_sampling_then_exits_3(digits_build, tmp_path, fast_profile):
    """A pass would need the upper bound under 0.1 % of the limit and a fail the lower bound over it (50× the p90 an
    earlier build measured): neither happens on a loaded host or a quiet one, so the verdict is inconclusive, after
    one doubling."""
    p90 = json.loads((digits_build / "report.json").read_text())["measurement"]["latency_ms"]["quantiles"]["p90"][
        "point"
    ]
    profile = tmp_path / "undecidable.toml"
    profile.write_text(
        f'extends = "{fast_profile}"\n[budgets]\nlatency_p90_ms = {p90 * 50}\n[check]\nguard_band = 0.999\n'
    )
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", profile, "--out", tmp_path / "b", "--json")
    assert result.code == 3, result.err
    report = result.json()
    assert {b["budget"]: b["verdict"] for b in report["budgets"]}["latency_p90_ms"] == "inconclusive"
    assert report["measurement"]["latency_ms"]["count"] == 2 * 120
    assert "sampling was doubled once" in " ".join(report["measurement"]["notes"])


def test_check_runs_with_torch_unimportable(digits_build, tmp_path):
    """The device side needs the runtime and numpy only: shadow the host-side packages with ones that
    refuse to import (the inference processes inherit the path) and run a whole check."""
    blocked = tmp_path / "blocked"
    for name in ("torch", "transformers", "onnxscript", "sklearn"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is host-side only')\n")
    path = os.pathsep.join([str(blocked), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    result = run_cli("check", digits_build, "--iterations", "30", "--repeats", "1", env={"PYTHONPATH": path})
    assert result.code == 0, result.err + result.out
    assert "PASS" in result.out


def test_check_refuses_an_edited_report_an_old_schema_and_a_malformed_report(digits_build, tmp_path):
    """check carries verdicts from report.json only because the manifest hashes it: an edited verdict is
    refused; so is a build of the previous schema; `tapeout report` names a malformed report's problem."""
    copy = tmp_path / "b"
    shutil.copytree(digits_build, copy)
    report = json.loads((copy / "report.json").read_text())
    report["budgets"][-1]["verdict"] = "pass"
    (copy / "report.json").write_text(json.dumps(report))
    result = run_cli("check", copy)
    assert result.code == 2 and "build report" in one_line_error(result) and "sha256 mismatch" in result.err

    (copy / "report.json").write_text("{}")
    reseal(copy)  # a report whose hash the manifest holds, malformed: named, not a traceback
    rendered = run_cli("report", copy)
    assert rendered.code == 2 and "missing required field 'kind'" in one_line_error(rendered)

    man = json.loads((copy / "manifest.json").read_text())
    man["schema"] = "tapeout.manifest/1"
    (copy / "manifest.json").write_text(json.dumps(man))
    old = run_cli("check", copy)
    assert old.code == 2 and "tapeout.manifest/1" in one_line_error(old) and "rebuild" in old.err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "Usage"),
        (("nosuchcmd",), "No such command 'nosuchcmd'"),
        (("build", "samples/digits-cnn"), "Missing option '--profile'"),
        (("check", "somewhere", "--iterations", "0"), "Invalid value for '--iterations'"),
    ],
)
def test_usage_errors_exit_2_without_a_traceback(args, says):
    """typer >= 0.2x raises its vendored copy of click's exceptions: they are usage errors, not tapeout bugs."""
    result = run_cli(*args)
    assert result.code == 2 and says in result.err + result.out
    assert "Traceback" not in result.err and "internal error" not in result.err


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed interrupt, on purpose
def test_a_ctrl_c_that_python_drops_is_raised_at_the_next_step_boundary():
    """A KeyboardInterrupt raised while a weakref callback or finalizer runs is printed as "Exception ignored"
    and lost: a build ran on to exit 0 after a Ctrl-C that landed in importlib's module-lock callback. tapeout's
    handler remembers it, and the step that was running raises it when it ends."""
    import signal

    class LandsInAFinalizer:
        def __del__(self):
            on_sigint(signal.SIGINT, None)  # as if the signal arrived while this ran

    ui = UI()
    reached = False
    try:
        with pytest.raises(KeyboardInterrupt), ui.step("a step"):
            LandsInAFinalizer()  # collected at once: Python swallows the interrupt and goes on
            reached = True
        assert reached  # the step's own code ran on; the boundary raised it
        # and a failure it caused before the boundary (an import it cut short) reads as the interrupt: exit 130
        from tapeout import cli

        console._interrupt_pending = True
        with pytest.raises(SystemExit) as stopped:
            cli._after_ctrl_c()
        assert stopped.value.code == 130
    finally:
        console._interrupt_pending = False


def test_a_dropped_ctrl_c_prints_no_traceback_and_other_unraisables_still_print(capfd):
    """The Ctrl-C Python drops inside a finalizer (importlib's module-lock callback, in a build's first seconds) was
    printed as "Exception ignored in … Traceback", then the one line: the line alone now."""
    import signal

    class Lands:
        def __init__(self, exc):
            self.exc = exc

        def __del__(self):
            if self.exc is KeyboardInterrupt:
                on_sigint(signal.SIGINT, None)
            raise self.exc("a finalizer's own error")

    saved = sys.unraisablehook
    sys.unraisablehook = console.quiet_dropped_interrupt
    try:
        Lands(KeyboardInterrupt)
        assert "Traceback" not in capfd.readouterr().err
        Lands(ValueError)
        assert "ValueError: a finalizer's own error" in capfd.readouterr().err
    finally:
        sys.unraisablehook = saved
        console._interrupt_pending = False


def test_ctrl_c_exits_130_with_a_line(tmp_path):
    import signal
    import time

    # as from a terminal: a suite started in the background (nohup, `&`) passes SIGINT down ignored
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tapeout",
            "build",
            str(SAMPLES / "minilm"),
            "--profile",
            "cpu-fp32",
            "--out",
            str(tmp_path / "b"),
        ],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(4)  # inside the model load or the export
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err[-3000:]
    assert not (tmp_path / "b").exists() and not list(tmp_path.glob(".b.partial-*"))


def test_a_rank_0_input_builds_checks_and_calibrates(tmp_path, fast_profile):
    # a scalar input (a gain, a sample rate): random, golden and calibration samples are 0-d arrays,
    # not numpy scalars, which ONNX Runtime refused ("Unable to handle object of type numpy.float32")
    project = tmp_path / "scalar"
    project.mkdir()
    (project / "model.py").write_text(
        "import torch\n\n\nclass Scaled(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        torch.manual_seed(0)\n        self.lin = torch.nn.Linear(16, 4)\n\n"
        "    def forward(self, x, gain):\n        return self.lin(x) * gain\n\n\ndef build():\n    return Scaled().eval()\n"
    )
    rng = np.random.default_rng(0)
    np.savez(
        project / "cal.npz", x=rng.random((8, 1, 16), dtype=np.float32), gain=rng.uniform(0.5, 2, 8).astype(np.float32)
    )
    (project / "tapeout.toml").write_text(
        '[model]\nsource = "model.py:build"\n\n[[inputs]]\nname = "x"\nshape = [1, 16]\n\n'
        '[[inputs]]\nname = "gain"\nshape = []\nrange = [0.5, 2.0]\n\n'
        '[calibration]\ndata = "cal.npz"\n'
    )
    out = tmp_path / "b"
    build = run_cli("build", project, "--profile", fast_profile, "--out", out)
    assert build.code == 0, build.err
    golden = np.load(out / "golden.npz")
    assert golden["input.gain"].shape == (4,)  # four samples of a scalar, taken from the calibration data
    np.testing.assert_array_equal(golden["input.gain"], np.load(project / "cal.npz")["gain"][:4])
    assert run_cli("check", out).code == 0


def test_a_build_reports_each_steps_time_and_its_peak_memory(digits_build):
    """What the build itself cost, in the report and in report.md: every step that ran with its wall time, their sum,
    and tapeout's peak resident memory."""
    report = json.loads((digits_build / "report.json").read_text())
    run = report["run"]
    names = [s["name"] for s in run["steps"]]
    assert names[:2] == ["load", "export"] and "measure" in names and "report" not in names
    assert run["seconds"] == pytest.approx(sum(s["seconds"] for s in run["steps"]), abs=0.01)
    assert all(s["seconds"] >= 0 for s in run["steps"]) and 100 < run["peak_rss_mb"] < 20_000
    # each step's high-water mark: never falling, never above the run's; the first at the run's peak reached it
    marks = [s["peak_rss_mb"] for s in run["steps"]]
    assert marks == sorted(marks) and marks[0] > 100 and marks[-1] <= run["peak_rss_mb"]
    reached = next(s["name"] for s in run["steps"] if s["peak_rss_mb"] >= run["peak_rss_mb"])
    assert f"tapeout's peak memory {run['peak_rss_mb']:.4g} MB, reached in step {reached}." in (
        digits_build / "report.md"
    ).read_text().replace("\n", " ")


def test_a_long_step_in_a_pipe_prints_a_line_with_its_progress_until_it_ends():
    """Where there is no spinner (a pipe, a CI log), a running step says it is alive every few seconds with its
    latest progress, and stops before its own last line."""
    import io
    import time

    from rich.console import Console

    ui = UI(heartbeat_s=0.05)
    stream = io.StringIO()
    ui.err = Console(file=stream, highlight=False, width=200)  # not a terminal
    with ui.step("verify the KV-cache graph"):
        ui.progress(1, 4, "prompts")
        time.sleep(0.4)
    lines = stream.getvalue().splitlines()
    beats = [line for line in lines if line.startswith("…")]
    assert len(beats) >= 2 and all("verify the KV-cache graph: prompts 1/4 █████░" in b for b in beats), lines
    assert lines[-1].startswith("✓ verify the KV-cache graph") and len(beats) == len(lines) - 1
    time.sleep(0.2)
    assert stream.getvalue().splitlines() == lines  # the heartbeat ended with the step


def test_a_note_in_a_pipe_stays_one_line_whatever_its_length():
    import io

    from rich.console import Console

    ui = UI()
    stream = io.StringIO()
    ui.err = Console(file=stream, highlight=False, width=80)  # not a terminal, as rich sizes a pipe
    path = "/tmp/" + "x" * 150 + "/exports/entry"
    ui.note(f"export reused from the cache at {path}")
    assert stream.getvalue().splitlines() == [f"! export reused from the cache at {path}"]
