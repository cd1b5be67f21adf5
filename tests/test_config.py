"""Profile, project and device-spec validation: every error names the file, the field and the fix."""

from pathlib import Path

import pytest

from tapeout.core.config import list_devices, list_profiles, load_device, load_project
from tapeout.core.errors import BadInput
from tapeout.core.profile_schema import Profile
from tapeout.steps.setup import load_profile


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(fn, *args) -> str:
    with pytest.raises(BadInput) as info:
        fn(*args)
    return str(info.value)


def test_shipped_profiles_and_devices_validate():
    assert "cpu-fp32" in list_profiles()
    for name in list_profiles():
        assert isinstance(load_profile(name), Profile)
    devices = list_devices()
    assert len(devices) >= 3
    for name in devices:
        spec = load_device(name)
        numbers = [spec.memory_gb, spec.memory_bandwidth_gbs, *spec.peak_dense_tops.values()]
        assert all(n.source.startswith("https://") for n in numbers)
    kinds = {load_device(d).kind for d in devices}
    assert {"gpu", "soc"} <= kinds


def test_extends_merges_tables(tmp_path):
    path = write(tmp_path, "mine.toml", 'extends = "cpu-fp32"\n[budgets]\nlatency_p90_ms = 5\n[check]\nrepeats = 5\n')
    profile = load_profile(str(path))
    assert profile.name == "mine" and profile.target == "onnxruntime"
    assert profile.budgets.latency_p90_ms == 5
    assert profile.budgets.accuracy_max_drop == 0.001  # inherited
    assert profile.check.repeats == 5 and profile.check.iterations == 300
    assert profile.options["graph_optimization"] == "all"


def test_unknown_field_lists_allowed_fields(tmp_path):
    path = write(tmp_path, "typo.toml", 'extends = "cpu-fp32"\n[budgets]\nlatency_p95_ms = 5\n')
    msg = error_of(load_profile, str(path))
    assert str(path) in msg and "budgets.latency_p95_ms" in msg and "latency_p90_ms" in msg


def test_bad_enum_lists_allowed_values(tmp_path):
    path = write(tmp_path, "opt.toml", 'extends = "cpu-fp32"\n[options]\ngraph_optimization = "max"\n')
    msg = error_of(load_profile, str(path))
    assert "options.graph_optimization" in msg and "'all'" in msg and "'max'" in msg


def test_negative_budget_rejected(tmp_path):
    path = write(tmp_path, "neg.toml", 'extends = "cpu-fp32"\n[budgets]\ncold_start_ms = -1\n')
    msg = error_of(load_profile, str(path))
    assert "budgets.cold_start_ms" in msg and "greater than 0" in msg


def test_too_few_iterations_for_p99(tmp_path):
    path = write(
        tmp_path,
        "p99.toml",
        'extends = "cpu-fp32"\n[budgets]\nlatency_p99_ms = 5\n[check]\niterations = 50\nrepeats = 2\n',
    )
    assert "at least 299" in error_of(load_profile, str(path))


def test_unknown_target_device_and_profile(tmp_path):
    target = write(tmp_path, "t.toml", 'target = "tensorrtt"\n')
    assert "field 'target'" in error_of(load_profile, str(target)) and "onnxruntime" in error_of(
        load_profile, str(target)
    )
    device = write(tmp_path, "d.toml", 'extends = "cpu-fp32"\ndevice = "pixel-99"\n')
    msg = error_of(load_profile, str(device))
    assert "pixel-99" in msg and "h100-sxm" in msg
    msg = error_of(load_profile, "no-such-profile")
    assert "no-such-profile" in msg and "cpu-fp32" in msg


def test_extends_cycle(tmp_path):
    write(tmp_path, "a.toml", 'extends = "b.toml"\n')
    write(tmp_path, "b.toml", 'extends = "a.toml"\n')
    assert "cycle" in error_of(load_profile, str(tmp_path / "a.toml"))


def test_malformed_toml_names_the_file(tmp_path):
    path = write(tmp_path, "broken.toml", 'target = "onnxruntime\n')
    msg = error_of(load_profile, str(path))
    assert str(path) in msg and "not valid TOML" in msg


def test_project_symbolic_dim_needs_a_value(tmp_path):
    write(tmp_path, "tapeout.toml", '[model]\nsource = "m.onnx"\n[[inputs]]\nname = "x"\nshape = ["batch", 3]\n')
    msg = error_of(load_project, tmp_path)
    assert "batch" in msg and "[dims]" in msg


def test_project_missing_source_and_bad_dtype(tmp_path):
    write(tmp_path, "tapeout.toml", '[model]\nname = "x"\n[[inputs]]\nname = "x"\nshape = [1]\n')
    assert "missing required field 'model.source'" in error_of(load_project, tmp_path)
    write(
        tmp_path, "tapeout.toml", '[model]\nsource = "m.onnx"\n[[inputs]]\nname = "x"\nshape = [1]\ndtype = "float"\n'
    )
    msg = error_of(load_project, tmp_path)
    assert "inputs.0.dtype" in msg and "'float32'" in msg


def test_a_misspelt_key_is_named_with_its_likely_spelling_before_the_field_it_leaves_missing(tmp_path):
    write(tmp_path, "tapeout.toml", '[model]\nsorce = "m.onnx"\n[[inputs]]\nname = "x"\nshape = [1]\n')
    msg = error_of(load_project, tmp_path)
    assert "unknown field 'model.sorce': did you mean 'source'?" in msg and "missing" not in msg


PROJECT = '[model]\nsource = "m.onnx"\n[[inputs]]\nname = "x"\nshape = [1]\n'


def test_budgets_in_the_project_file_win_over_a_shipped_default_not_over_the_users_own_profile(tmp_path):
    """The model's owner declares its budgets in the project file: they replace a shipped profile's defaults (a
    floor such as cpu-int8's greedy agreement) and are named in the report; a profile file of the user's own, or
    one extending it, keeps what it sets."""
    from tapeout.steps.setup import with_project_budgets

    write(tmp_path, "tapeout.toml", PROJECT + "[budgets]\nlatency_p50_ms = 3\naccuracy_max_drop = 0.5\n")
    profile, taken = with_project_budgets(load_profile("cpu-fp32"), load_project(tmp_path))
    assert profile.budgets.latency_p50_ms == 3 and profile.budgets.accuracy_max_drop == 0.5
    assert taken == ("accuracy_max_drop", "latency_p50_ms")
    mine = write(tmp_path, "mine.toml", 'extends = "cpu-fp32"\n[budgets]\naccuracy_max_drop = 0.002\n')
    theirs = write(tmp_path, "theirs.toml", 'extends = "mine.toml"\n[check]\nrepeats = 2\n')
    for own in (mine, theirs):
        profile, taken = with_project_budgets(load_profile(str(own)), load_project(tmp_path))
        assert profile.budgets.accuracy_max_drop == 0.002 and taken == ("latency_p50_ms",), own
    generate = load_profile("cpu-int8").for_workload("generate")
    write(tmp_path, "tapeout.toml", PROJECT + "[budgets]\ngreedy_min_agreement = 0.8\n")
    assert with_project_budgets(generate, load_project(tmp_path))[0].budgets.greedy_min_agreement == 0.8
    untouched = load_profile("cpu-int8")
    write(tmp_path, "tapeout.toml", PROJECT)
    assert with_project_budgets(untouched, load_project(tmp_path)) == (untouched, ())


def test_a_project_budget_the_profiles_samples_cannot_bound_is_one_line_naming_both(tmp_path):
    from tapeout.steps.setup import with_project_budgets

    write(tmp_path, "tapeout.toml", PROJECT + "[budgets]\nlatency_p99_ms = 3\n")
    few = write(tmp_path, "few.toml", 'extends = "cpu-fp32"\n[check]\niterations = 50\nrepeats = 2\n')
    msg = error_of(with_project_budgets, load_profile(str(few)), load_project(tmp_path))
    assert "tapeout.toml" in msg and "profile few" in msg and "p99" in msg and "check.iterations" in msg


def test_a_misspelt_budget_in_the_project_file_is_named_with_its_likely_spelling(tmp_path):
    write(tmp_path, "tapeout.toml", PROJECT + "[budgets]\nlatency_p50 = 3\n")
    msg = error_of(load_project, tmp_path)
    assert "unknown field 'budgets.latency_p50': did you mean 'latency_p50_ms'?" in msg


def test_missing_project_dir(tmp_path):
    assert "no project file" in error_of(load_project, tmp_path / "nowhere")


def test_every_precision_is_in_the_name_of_a_shipped_profile_beside_its_shorter_alias():
    names = list_profiles()
    for fp32 in ("cpu-fp32", "openvino-cpu-fp32", "cuda-fp32", "aoti-cpu-fp32"):
        assert fp32 in names
    alias, full = load_profile("openvino-cpu"), load_profile("openvino-cpu-fp32")
    assert alias.model_dump(exclude={"name", "description"}) == full.model_dump(exclude={"name", "description"})


def test_a_profiles_workload_tables_are_judged_only_where_that_workload_runs(tmp_path):
    """[budgets.generate] and its kin: a shipped profile can hold defaults for every workload without a forward build
    showing a generation budget it cannot measure; the table's budgets sit over the shared ones."""
    scoped = write(
        tmp_path,
        "scoped.toml",
        'extends = "cpu-fp32"\n[budgets]\naccuracy_max_drop = 0.5\n'
        "[budgets.generate]\ngreedy_min_agreement = 0.75\naccuracy_max_drop = 0.25\n"
        "[budgets.stream]\nstream_max_rel_error = 0.01\n",
    )
    profile = load_profile(str(scoped))
    generate = profile.for_workload("generate").budgets.model_dump(exclude_none=True)
    assert generate == {"accuracy_max_drop": 0.25, "greedy_min_agreement": 0.75}
    assert profile.for_workload("forward").budgets.model_dump(exclude_none=True) == {"accuracy_max_drop": 0.5}
    stream = profile.for_workload("stream").budgets.model_dump(exclude_none=True)
    assert stream == {"accuracy_max_drop": 0.5, "stream_max_rel_error": 0.01}
    # what a build records is what it judged: no workload's table is left in it
    assert "generate" not in profile.for_workload("stream").model_dump(exclude_none=True)["budgets"]


def test_a_misspelt_workload_table_or_budget_in_it_is_named_and_a_latency_in_it_needs_its_samples(tmp_path):
    typo = write(tmp_path, "typo.toml", 'extends = "cpu-fp32"\n[budgets.generat]\ngreedy_min_agreement = 0.5\n')
    assert "unknown field 'budgets.generat': did you mean 'generate'?" in error_of(load_profile, str(typo))
    inner = write(tmp_path, "inner.toml", 'extends = "cpu-fp32"\n[budgets.stream]\nstream_max_rel = 0.5\n')
    msg = error_of(load_profile, str(inner))
    assert "unknown field 'budgets.stream.stream_max_rel': did you mean 'stream_max_rel_error'?" in msg
    few = write(
        tmp_path,
        "few.toml",
        'extends = "cpu-fp32"\n[budgets.forward]\nlatency_p99_ms = 3\n[check]\niterations = 50\nrepeats = 2\n',
    )
    assert "cannot bound p99" in error_of(load_profile, str(few))


def test_a_child_profile_decides_a_budget_where_it_sets_it_shared_or_per_workload(tmp_path):
    """Set in a child's [budgets], a budget is the child's for every workload (the parent's per-workload defaults
    lose it); set in a child's [budgets.<kind>] only, it is decided kind by kind (the parent's shared value is gone
    where the child's table leaves it out): cpu-int8 judges a language model's perplexity relative to FP32, not in
    cpu-fp32's absolute units."""
    int8 = load_profile("cpu-int8")
    assert int8.for_workload("forward").budgets.accuracy_max_drop == 0.005
    generate = int8.for_workload("generate").budgets
    assert generate.accuracy_max_drop is None and generate.accuracy_max_rel_drop == 0.02
    assert generate.greedy_min_agreement == 0.25  # its own floor over cpu-fp32's 0.9
    child = write(tmp_path, "child.toml", 'extends = "cpu-int8"\n[budgets]\naccuracy_max_drop = 0.01\n')
    for kind in ("forward", "generate", "stream"):
        assert load_profile(str(child)).for_workload(kind).budgets.accuracy_max_drop == 0.01, kind
    agreement = write(tmp_path, "agree.toml", 'extends = "cpu-int8"\n[budgets]\ngreedy_min_agreement = 0.8\n')
    assert load_profile(str(agreement)).for_workload("generate").budgets.greedy_min_agreement == 0.8


def test_a_build_judges_its_own_workloads_table_and_records_no_other(tmp_path):
    """setup for a forward project: cpu-fp32's generation and stream defaults are not among its budgets, so no
    unmeasurable row shows; speech-vad's stream gets cpu-int8's stream table (its drift, its metric's units)."""
    from conftest import SAMPLES
    from tapeout.core.console import UI
    from tapeout.steps.setup import for_build

    write(tmp_path, "tapeout.toml", PROJECT)
    budgets = for_build(tmp_path, "cpu-fp32", UI()).profile.budgets.model_dump(exclude_none=True)
    assert budgets == {"accuracy_max_drop": 0.001}
    vad = for_build(SAMPLES / "speech-vad", "cpu-int8", UI()).profile.budgets.model_dump(exclude_none=True)
    assert vad == {"accuracy_max_drop": 0.005, "stream_max_rel_error": 0.05}


def test_the_default_budgets_table_in_the_docs_is_what_the_profiles_judge():
    import re

    from conftest import REPO

    text = (REPO / "docs" / "project-file.md").read_text()
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| (.+) \|$", text, flags=re.M)
    assert len(rows) >= 10
    for name, cells in rows:
        profile = load_profile(name)
        for kind, cell in zip(("forward", "generate", "stream"), cells.split(" | "), strict=True):
            shown = dict(re.findall(r"`(\w+)` ([0-9.e-]+)", cell))
            judged = profile.for_workload(kind).budgets.model_dump(exclude_none=True)
            assert {k: float(v) for k, v in shown.items()} == judged, (name, kind)
