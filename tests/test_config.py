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


def test_budgets_in_the_project_file_merge_under_the_profiles_and_say_which_they_added(tmp_path):
    from tapeout.steps.setup import with_project_budgets

    write(tmp_path, "tapeout.toml", PROJECT + "[budgets]\nlatency_p50_ms = 3\naccuracy_max_drop = 0.5\n")
    profile, added = with_project_budgets(load_profile("cpu-fp32"), load_project(tmp_path))
    assert profile.budgets.latency_p50_ms == 3
    assert profile.budgets.accuracy_max_drop == 0.001  # the profile's own wins where both set it
    assert added == ("latency_p50_ms",)
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
