"""Faults of the machine, not of the model: kills, SIGTERM, full disks, read-only mounts, paths that
cannot be written. Each asserts the exit code, the one line, and that nothing was lost: the previous
build intact, no complete-looking partial build, staging removed by the next build.

Full and read-only filesystems are real ones: a small tmpfs mounted in a user and mount namespace
(`unshare -rm`), so no root and no fake is needed; where the kernel refuses namespaces those tests skip.
"""

from __future__ import annotations

import os
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import SAMPLES, Result, one_line_error, run_cli
from tapeout.builds import staging
from tapeout.builds.reader import open_build
from tapeout.builds.staging import MANIFEST, StagedBuild, exchange, recover
from tapeout.core.errors import BadInput
from tapeout.core.files import output_file
from tapeout.core.hashing import sha256_file
from tapeout.records.golden import load_golden

DIGITS = SAMPLES / "digits-cnn"
pytestmark = pytest.mark.fuzz


def _namespaces_work() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_namespaces = pytest.mark.skipif(
    not _namespaces_work(),
    reason="`unshare -rm` (user and mount namespaces) "
    "is not permitted here: no small or read-only filesystem can be mounted",
)


LEFT = "--- left on the filesystem:"


def in_mount(mnt: Path, size: str, args: list, prepare: str = "", readonly: bool = False) -> Result:
    """`tapeout ARGS` with a fresh tmpfs of SIZE at MNT (prepared by PREPARE, then made read-only if asked).
    What is left on it afterwards ends stdout, after LEFT (the mount is gone when the namespace ends)."""
    mnt.mkdir(exist_ok=True)
    where = shlex.quote(str(mnt))
    script = f"mount -t tmpfs -o size={size} tmpfs {where} && {prepare or 'true'}"
    if readonly:
        script += f" && mount -o remount,ro {where}"
    script += (
        " && { "
        + shlex.join([sys.executable, "-m", "tapeout", *map(str, args)])
        + f"; rc=$?; echo '{LEFT}'; ls -A {where}; exit $rc; }}"
    )
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def left_on(result: Result) -> list[str]:
    return result.out.split(LEFT)[-1].split()


def _side_dirs(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


# ---------------------------------------------------------------- kills


def test_kill_9_at_random_points_never_leaves_a_broken_build_and_the_next_build_cleans_up(
    digits_build, tmp_path, fast_profile
):
    out = tmp_path / "digits"
    subprocess.run(["cp", "-a", str(digits_build), str(out)], check=True)
    before = sha256_file(out / MANIFEST)
    rng = random.Random(9)
    outcomes = []
    for delay in sorted(rng.uniform(0.2, 6.0) for _ in range(6)):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tapeout", "build", str(DIGITS), "-p", str(fast_profile), "-o", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        proc.kill()
        proc.wait()
        # whatever the moment: the build dir is whole (every hash verifies), the old one or a new one
        opened = open_build(out)
        opened.artifact(), opened.report, opened.structure()  # every file it records verifies
        assert load_golden(opened.golden())[1]
        outcomes.append("old" if sha256_file(out / MANIFEST) == before else "new")
        leftovers = [p for p in out.parent.iterdir() if p != out and not p.name.startswith(f".{out.name}.partial-")]
        assert not leftovers, leftovers
    assert "old" in outcomes, outcomes  # at least one kill landed mid-build
    result = run_cli("build", DIGITS, "-p", fast_profile, "-o", out)
    assert result.code == 0, result.err
    assert _side_dirs(out) == []  # the dead builds' staging is gone


def test_sigterm_unwinds_like_ctrl_c_and_keeps_the_previous_build(digits_build, tmp_path, fast_profile):
    out = tmp_path / "digits"
    subprocess.run(["cp", "-a", str(digits_build), str(out)], check=True)
    before = sha256_file(out / MANIFEST)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tapeout", "build", str(DIGITS), "-p", str(fast_profile), "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not _side_dirs(out) and time.monotonic() < deadline:  # staging exists: the build is under way
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "terminated (SIGTERM)" in err and "Traceback" not in err
    assert sha256_file(out / MANIFEST) == before
    assert _side_dirs(out) == []  # unwound: staging removed by the build itself


def test_a_sigterm_that_lands_in_python_run_by_a_c_extension_still_exits_143(tmp_path):
    # C extensions run Python through PyRun_* (pybind11's exec); a KeyboardInterrupt leaving one makes CPython end
    # a `-m` process by SIGINT (-2) whatever it exits with. This lands the SIGTERM there on purpose.
    (tmp_path / "landing.py").write_text(
        "import ctypes, signal, sys\n"
        "from tapeout import cli\n"
        "signal.signal(signal.SIGTERM, cli._on_sigterm)\n"
        "ctypes.pythonapi.PyRun_SimpleString(b'import os, signal, time; os.kill(os.getpid(), signal.SIGTERM); "
        "time.sleep(5)')\n"
        "cli._interrupted()\n"
    )
    done = subprocess.run([sys.executable, "-m", "landing"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 143, done.stderr
    assert "terminated (SIGTERM)" in done.stderr


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_build_set_aside_by_a_killed_two_rename_replace_is_put_back(tmp_path):
    # filesystems without renameat2(RENAME_EXCHANGE) replace in two renames; a kill between them leaves
    # the old build as .NAME.old-PID and no NAME: the next build restores it before anything else
    final = tmp_path / "b"
    aside = tmp_path / f".b.old-{_dead_pid()}"
    aside.mkdir()
    (aside / MANIFEST).write_text("{}")
    stale = tmp_path / f".b.partial-{_dead_pid()}"
    stale.mkdir()
    done = recover(final)
    assert (final / MANIFEST).is_file() and not aside.exists() and not stale.exists()
    assert any("put back" in line for line in done) and any("removed" in line for line in done)


def test_a_live_builds_staging_is_left_alone(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        theirs = tmp_path / f".b.partial-{sleeper.pid}"
        theirs.mkdir()
        assert recover(tmp_path / "b") == [] and theirs.is_dir()
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_replace_puts_the_new_build_in_place_either_way(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(staging, "exchange", lambda a, b: False)
    final = tmp_path / "b"
    for generation in ("old", "new"):
        with StagedBuild(final) as stage:
            (stage / "which").write_text(generation)
            (stage / MANIFEST).write_text("{}")
    assert (final / "which").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_exchange_swaps_two_directories_atomically(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("a")
    (b / "x").write_text("b")
    if not exchange(a, b):
        pytest.skip("this kernel or filesystem has no renameat2(RENAME_EXCHANGE); the two-rename path is tested above")
    assert (a / "x").read_text() == "b" and (b / "x").read_text() == "a"


# ---------------------------------------------------------------- paths that cannot be written


@pytest.mark.parametrize("case", ["out-is-a-file", "out-under-a-file", "name-too-long", "out-is-another-dir"])
def test_an_out_that_cannot_be_a_build_dir_is_one_line_before_any_work(tmp_path, fast_profile, case):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    out, says = {
        "out-is-a-file": (afile, "is a file"),
        "out-under-a-file": (afile / "b", "which is a file"),
        "name-too-long": (tmp_path / ("x" * 300), "choose a shorter --out name"),
        "out-is-another-dir": (other, "is not a tapeout build dir"),
    }[case]
    result = run_cli("build", DIGITS, "-p", fast_profile, "-o", out)
    assert result.code == 2
    assert says in one_line_error(result)
    assert "load model" not in result.err  # refused before the model was touched
    assert afile.read_text() == "mine" and (other / "keep.txt").read_text() == "mine"


def test_junit_into_a_missing_folder_is_created_and_a_bad_one_refused_before_the_check(digits_build, tmp_path):
    (digits_build / "check.json").unlink(missing_ok=True)
    junit = tmp_path / "reports" / "ci" / "junit.xml"
    assert run_cli("check", digits_build, "--junit", junit).code == 0
    assert junit.is_file()
    (digits_build / "check.json").unlink()
    for bad, says in ((tmp_path, "is a directory"), (junit / "x.xml", "which is a file")):
        result = run_cli("check", digits_build, "--junit", bad)
        assert result.code == 2 and says in one_line_error(result)
        assert not (digits_build / "check.json").exists()  # nothing ran: no check.json without its JUnit file


def test_output_file_refuses_what_it_cannot_write(tmp_path):
    (tmp_path / "f").write_text("x")
    for path, says in (
        (tmp_path, "is a directory"),
        (tmp_path / "f" / "x.xml", "which is a file"),
        (tmp_path / ("y" * 300), "too long"),
    ):
        with pytest.raises(BadInput, match=says):
            output_file(path, "--junit")


@needs_namespaces
@pytest.mark.parametrize("command", ["build-default-out", "build-out", "export", "check", "junit"])
def test_a_read_only_filesystem_is_one_line_naming_the_path(digits_build, tmp_path, fast_profile, command):
    mnt = tmp_path / "mnt"
    prepare = f"cp -r {DIGITS} {mnt}/proj && rm -rf {mnt}/proj/build && cp -r {digits_build} {mnt}/b"
    args, says = {
        "build-default-out": (["build", mnt / "proj", "-p", fast_profile], "read-only"),
        "build-out": (["build", DIGITS, "-p", fast_profile, "-o", mnt / "new"], "read-only"),
        "export": (["export", mnt / "proj"], "Read-only file system"),
        "check": (["check", mnt / "b"], "copy the build dir somewhere writable"),
        "junit": (["check", digits_build, "--junit", mnt / "j.xml"], "read-only"),
    }[command]
    result = in_mount(mnt, "64m", args, prepare, readonly=True)
    assert result.code == 2, result.err
    line = one_line_error(result)
    assert says in line and str(mnt) in line
    assert "measure" not in result.err  # refused before the work


@needs_namespaces
def test_report_on_a_read_only_build_dir_still_renders(digits_build, tmp_path):
    mnt = tmp_path / "mnt"
    result = in_mount(mnt, "64m", ["report", mnt / "b"], f"cp -r {digits_build} {mnt}/b", readonly=True)
    assert result.code == 0 and "# tapeout build" in result.out and "not written" in result.err


@needs_namespaces
@pytest.mark.parametrize("size", ["8k", "96k", "200k", "300k"])
def test_a_full_disk_is_named_as_such_and_leaves_nothing(tmp_path, fast_profile, size):
    # the sizes land the fault in different writers: the staging dir, the exported model (onnx.save),
    # and onnxruntime's optimized-model write, which it reports as "Protobuf serialization failed"
    mnt = tmp_path / "mnt"
    result = in_mount(mnt, size, ["build", DIGITS, "-p", fast_profile, "-o", mnt / "b"])
    if result.code == 0:
        pytest.skip(f"the build fitted in {size} on this machine")
    assert result.code == 2, result.err
    assert "no space left on the disk holding" in one_line_error(result)
    assert left_on(result) == []  # no build dir, no staging


@needs_namespaces
def test_a_full_disk_during_export_leaves_no_half_written_model(tmp_path):
    mnt = tmp_path / "mnt"
    result = in_mount(mnt, "64k", ["export", DIGITS, "-o", mnt / "m.onnx"], f"touch {mnt}/mine")
    assert result.code == 2 and "no space left" in one_line_error(result)
    assert left_on(result) == ["mine"]


# ---------------------------------------------------------------- output streams


def test_json_keeps_stdout_machine_readable_and_progress_on_stderr(digits_build):
    result = run_cli("check", digits_build, "--json")
    assert result.code == 0
    assert result.json()["kind"] == "check"
    assert "measure onnxruntime" in result.err  # a long check is not mute


def test_strict_failures_are_counted_in_junit_too(tmp_path, fast_profile):
    profile = tmp_path / "power.toml"  # RAPL is absent in VMs and containers: power stays unmeasured
    profile.write_text(f'extends = "{fast_profile}"\n[budgets]\npower_avg_w = 1000\n')
    out = tmp_path / "b"
    assert run_cli("build", DIGITS, "-p", profile, "-o", out).code == 0
    report = (out / "report.json").read_text()
    if '"power_avg_w"' not in report or '"unmeasured"' not in report:
        pytest.skip("this machine measures CPU power (RAPL is readable): no unmeasured budget to count")
    for strict, code, failures in ((False, 0, 0), (True, 1, 1)):
        junit = tmp_path / f"strict-{strict}.xml"
        result = run_cli("check", out, "--junit", junit, *(["--strict"] if strict else []))
        assert result.code == code, result.err
        assert f'failures="{failures}"' in junit.read_text()
        assert ("(--strict)" in junit.read_text()) is strict
