"""`tapeout build -p A -p B`: every profile builds, the fastest that meets its budgets is kept, every row reported."""

import json

import pytest

from conftest import FAST_PROFILE, SAMPLES, one_line_error, run_cli

pytest.importorskip("openvino", reason="OpenVINO is in the [openvino] extra")


def _profiles(tmp_path):
    ort = tmp_path / "ort-int8.toml"
    ort.write_text(FAST_PROFILE.replace('extends = "cpu-fp32"', 'extends = "cpu-int8"'))
    ov = tmp_path / "ov-int8.toml"
    # the same budget as cpu-int8, so that the two are judged alike
    ov.write_text(
        FAST_PROFILE.replace('extends = "cpu-fp32"', 'extends = "openvino-cpu-int8"')
        + "[budgets]\naccuracy_max_drop = 0.005\n"
    )
    int4 = tmp_path / "ov-int4.toml"  # no INT4 rule for a CNN on OpenVINO: this candidate fails, the rest go on
    int4.write_text(FAST_PROFILE.replace('extends = "cpu-fp32"', 'extends = "openvino-cpu-int4"'))
    return ort, ov, int4


@pytest.mark.slow  # three builds; the fast subset keeps choose's refusals
def test_the_fastest_passing_build_is_chosen_and_every_candidate_is_reported(tmp_path):
    ort, ov, int4 = _profiles(tmp_path)
    out = tmp_path / "fastest"
    result = run_cli("build", SAMPLES / "digits-cnn", "-p", ort, "-p", ov, "-p", int4, "--out", out, "--json")
    assert result.code == 0, result.err
    choice = result.json()
    assert choice == json.loads((out / "choice.json").read_text())
    rows = {r["profile"]: r for r in choice["candidates"]}
    assert list(rows) == ["ort-int8", "ov-int8", "ov-int4"]
    assert rows["ov-int4"]["exit_code"] == 2 and "no int4 rule for a cnn model on openvino" in rows["ov-int4"]["error"]
    timed = [rows["ort-int8"], rows["ov-int8"]]
    assert all(r["exit_code"] == 0 and (out / r["profile"] / "report.json").is_file() for r in timed)
    fastest = min(timed, key=lambda r: r["p50_ms"]["point"])
    assert choice["chosen"] == fastest["profile"] and choice["chosen_build_dir"] == str(out / fastest["profile"])
    assert {r["target"] for r in timed} == {"onnxruntime", "openvino"}
    # one export for both: their runtimes take the same opset and IR version
    assert result.err.count("export to ONNX and verify against torch") == 1, result.err
    assert "export shared with candidate ort-int8" in result.err
    exported = [(out / r["profile"] / "export" / "model.onnx").read_bytes() for r in timed]
    assert exported[0] == exported[1]
    # and one FP32 reference metric: the same export and project files give the same figure, computed once
    assert result.err.count("evaluate top1 on the FP32 reference") == 1, result.err
    assert result.err.count("as this process computed it for the same export and project files") == 2, result.err
    assert rows["ort-int8"]["accuracy"]["reference"] == rows["ov-int8"]["accuracy"]["reference"]
    assert not any("different budgets" in n for n in choice["notes"])  # same budget given to both
    md = (out / "choice.md").read_text()
    assert f"Chosen: **{fastest['profile']}**" in md and "| ort-int8 | onnxruntime | int8 |" in md
    assert "| ov-int8 | openvino | int8 |" in md and "error: no int4 rule" in md
    # the chosen build dir is a build dir like any other: check takes it
    check = run_cli("check", out / fastest["profile"], "--json")
    assert check.code == 0, check.err


def test_a_bad_profile_among_several_fails_before_any_build(tmp_path):
    ort, _, _ = _profiles(tmp_path)
    out = tmp_path / "fastest"
    result = run_cli("build", SAMPLES / "digits-cnn", "-p", ort, "-p", "openvino-cpu-int9", "--out", out)
    assert result.code == 2 and "openvino-cpu-int9" in one_line_error(result)
    assert not out.exists()
    twice = run_cli("build", SAMPLES / "digits-cnn", "-p", ort, "-p", ort, "--out", out)
    assert twice.code == 2 and "profiles given twice: ort-int8" in one_line_error(twice)


def test_no_candidate_qualifies_says_so_with_the_candidates_exit_code(tmp_path):
    _, _, int4 = _profiles(tmp_path)
    other = tmp_path / "ov-int4-b.toml"
    other.write_text(int4.read_text())
    out = tmp_path / "fastest"
    result = run_cli("build", SAMPLES / "digits-cnn", "-p", int4, "-p", other, "--out", out)
    assert result.code == 2, result.err
    choice = json.loads((out / "choice.json").read_text())
    assert choice["chosen"] is None and choice["notes"] == [
        "no candidate met all of its budgets with a measured latency"
    ]
    assert "**No candidate qualifies** (exit 2)" in (out / "choice.md").read_text()
