"""Fuzzing the files tapeout reads from other people: project files, profiles, build dirs (manifest,
report, golden), ONNX models and pickles. Hypothesis mutates valid files towards the edges (wrong types,
NaN and infinity, huge and negative numbers, path tricks, deep nesting, deleted keys); every outcome
must be a result or one line with exit 2 (or 4 for a missing toolchain), never a traceback, never exit
70, never code run from a data file.

Runs are derandomized (the same examples in CI as here) and sized to take about two minutes together
(each `check` example measures in a fresh process and renders its report: about 1.3 s).
Most properties run the real CLI entry point, `tapeout.cli.main`, in this process: the same exception
mapping as the command, without a Python start-up per example.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import math
import pickle
import shutil
import signal
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import SAMPLES, Result, one_line_error, run_cli
from tapeout import cli
from tapeout.core.config import load_project
from tapeout.core.errors import BadInput
from tapeout.core.feeds import random_feeds
from tapeout.steps.setup import load_profile

FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def fuzz(examples: int) -> settings:
    return settings(FUZZ, max_examples=examples)


DIGITS = SAMPLES / "digits-cnn"
pytestmark = pytest.mark.fuzz


def run_main(*args) -> Result:
    """`tapeout ARGS` through the real entry point, in this process."""
    out, err = io.StringIO(), io.StringIO()
    argv, on_term, on_int = sys.argv, signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    unraisable = sys.unraisablehook  # main installs its own with its Ctrl-C handler
    sys.argv = ["tapeout", *map(str, args)]
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                cli.main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_int)
        sys.unraisablehook = unraisable
    return Result(code, out.getvalue(), err.getvalue())


def assert_handled(result: Result, allowed=(0, 1, 2, 3, 4)) -> None:
    assert result.code in allowed, f"exit {result.code}\n{result.err[-3000:]}"
    assert "Traceback" not in result.err, result.err[-3000:]
    if result.code in (2, 4):
        one_line_error(result)


# ---------------------------------------------------------------- values at the edges

EDGES = st.sampled_from(
    [
        0,
        -1,
        1,
        2**31,
        2**62,
        10**15,
        -(2**63),
        float("inf"),
        float("-inf"),
        float("nan"),
        1e308,
        -1e308,
        1e-300,
        "",
        "..",
        "../../etc/passwd",
        "/etc/passwd",
        "a/b",
        "x" * 300,
        "\u0000",
        "model.py:build",
        "cpu-fp32",
        "batch",
        "float32",
        "int8",
        "onnxruntime",
        "fp16",
    ]
)
# half of all leaves are edge values: plain random ones rarely land on infinity or a path trick
SCALARS = st.one_of(
    EDGES,
    st.one_of(st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(), st.text(max_size=10)),
)
VALUES = st.one_of(
    SCALARS,
    st.recursive(
        SCALARS,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(min_size=1, max_size=8), inner, max_size=3),
        max_leaves=6,
    ),
)
DELETE = object()


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value if v is not None) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items() if v is not None) + "}"


def toml_string(text: str) -> str:
    # JSON's escapes for control characters are TOML's; non-ASCII stays raw (TOML has no surrogate pairs)
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_text(doc: dict) -> str:
    return "".join(f"{toml_string(k)} = {toml_value(v)}\n" for k, v in doc.items() if v is not None)


def mutated(doc, edits):
    """`doc` with each (path, value) applied: set, or deleted for DELETE; a missing step is created."""
    doc = copy.deepcopy(doc)
    for path, value in edits:
        node = doc
        for key in path[:-1]:
            if isinstance(node, list):
                key = key % len(node) if isinstance(key, int) and node else None
                if key is None:
                    break
            elif not isinstance(node.get(key), dict | list):
                node[key] = {}
            node = node[key]
        else:
            last = path[-1]
            if isinstance(node, list):
                if node and isinstance(last, int):
                    node[last % len(node)] = value if value is not DELETE else None
            elif value is DELETE:
                node.pop(last, None)
            else:
                node[last] = value
    return doc


NUMERIC_EDGES = st.sampled_from(
    [float("inf"), float("-inf"), float("nan"), 1e308, -1e308, 0, -1, 2**62, 10**15, 2**31, 0.5]
)


def _at(doc, path):
    for key in path:
        try:
            doc = doc[key]
        except (KeyError, IndexError, TypeError):
            return None
    return doc


@st.composite
def edits(draw, paths: list[tuple], base: dict, extra: st.SearchStrategy | None = None) -> list:
    """One to three edits of `base`: mostly at known paths (a number there is more often set to an edge
    number: NaN, infinity, huge, zero, negative), sometimes at a new key; or a deletion."""
    changes = []
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.integers(0, 3)):
            path = draw(st.sampled_from(paths))
        else:
            path = (draw(st.sampled_from([p[0] for p in paths])), draw(st.text(min_size=1, max_size=6)))
        original = _at(base, path)
        numeric = isinstance(original, int | float) and not isinstance(original, bool)
        if numeric and draw(st.integers(0, 9)) < 6:
            value = draw(NUMERIC_EDGES)
        else:
            value = draw(st.one_of(VALUES, st.just(DELETE), *([extra] if extra is not None else [])))
        changes.append((path, value))
    return changes


def written(file: Path, base: dict, changes: list) -> Path:
    file.write_text(toml_text(mutated(base, changes)))
    return file


def walk_floats(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from walk_floats(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from walk_floats(v)
    elif isinstance(value, float):
        yield value


# ---------------------------------------------------------------- project files

PROJECT = {
    "model": {"source": "model.py:build", "outputs": ["logits"]},
    "inputs": [{"name": "image", "shape": ["batch", 1, 8, 8], "dtype": "float32", "range": [0.0, 1.0]}],
    "dims": {"batch": 1},
    "calibration": {"data": "data/calibration.npz"},
    "evaluation": {"metric": "metric.py:top1", "direction": "higher", "name": "top1"},
    "export": {"opset": 20, "atol": 1e-4},
    "seed": 0,
    "golden_samples": 4,
}
PROJECT_PATHS = [
    ("model", "source"),
    ("model", "outputs"),
    ("inputs",),
    ("inputs", 0, "shape"),
    ("inputs", 0, "dtype"),
    ("inputs", 0, "range"),
    ("inputs", 0, "name"),
    ("dims", "batch"),
    ("dims",),
    ("calibration", "data"),
    ("evaluation", "direction"),
    ("export", "opset"),
    ("export", "atol"),
    ("export", "samples"),
    ("seed",),
    ("golden_samples",),
    ("inputs", 0, "range", 0),
    ("inputs", 0, "range", 1),
    ("inputs", 0, "shape", 0),
    ("inputs", 0, "shape", 2),
]


@fuzz(400)
@given(edits(PROJECT_PATHS, PROJECT))
def test_fuzzed_project_files_load_or_say_one_line(tmp_path, changes):
    file = written(tmp_path / "tapeout.toml", PROJECT, changes)
    try:
        project = load_project(file)
    except BadInput as exc:
        assert "\n" not in str(exc) and str(file) in str(exc)
        return
    # accepted: random inputs can be drawn inside every declared range, finite, of the declared shape
    assert all(math.isfinite(v) for v in walk_floats(project.model_dump()))
    shapes = [spec.concrete_shape(project.dims) for spec in project.inputs]
    if sum(math.prod(s) for s in shapes) <= 1 << 20:
        feeds = random_feeds(project.inputs, project.dims, np.random.default_rng(project.seed))
        for spec, shape in zip(project.inputs, shapes, strict=True):
            assert feeds[spec.name].shape == shape
            if spec.dtype.startswith("float"):
                assert np.isfinite(feeds[spec.name]).all()


@fuzz(60)
@given(st.integers(min_value=1, max_value=100_000), st.sampled_from("[{"))
def test_deeply_nested_toml_is_one_line(tmp_path, depth, bracket):
    file = tmp_path / "tapeout.toml"
    nested = "[" * depth + "1" + "]" * depth if bracket == "[" else "{b = " * depth + "1" + "}" * depth
    file.write_text(toml_text(PROJECT) + f"x = {nested}\n")
    with pytest.raises(BadInput) as caught:  # a small depth is an unknown field; a large one, too deep to parse
        load_project(file)
    assert "\n" not in str(caught.value)


# ---------------------------------------------------------------- profiles

PROFILE = {
    "extends": "cpu-fp32",
    "budgets": {"latency_p90_ms": 5.0, "peak_memory_mb": 512.0},
    "check": {
        "iterations": 300,
        "repeats": 3,
        "warmup_max_s": 10.0,
        "confidence": 0.95,
        "energy_window_s": 5.0,
        "parity": {"min_cosine": 0.9999},
    },
    "options": {"threads": 0},
    "quantization": {"block_size": 32},
}
PROFILE_PATHS = [
    ("target",),
    ("precision",),
    ("name",),
    ("device",),
    ("extends",),
    ("options", "threads"),
    ("options", "graph_optimization"),
    ("budgets", "latency_p90_ms"),
    ("budgets", "accuracy_max_drop"),
    ("budgets", "peak_memory_mb"),
    ("check", "iterations"),
    ("check", "repeats"),
    ("check", "warmup_max_s"),
    ("check", "confidence"),
    ("check", "energy_window_s"),
    ("check", "parity", "min_cosine"),
    ("quantization", "block_size"),
    ("quantization", "method"),
]


@fuzz(400)
@given(edits(PROFILE_PATHS, PROFILE))
def test_fuzzed_profiles_load_or_say_one_line(tmp_path, changes):
    file = written(tmp_path / "p.toml", PROFILE, changes)
    try:
        profile = load_profile(str(file))
    except BadInput as exc:
        assert "\n" not in str(exc)
        return
    dumped = profile.model_dump()
    assert all(math.isfinite(v) for v in walk_floats(dumped))
    assert profile.check.iterations * profile.check.repeats <= 20_000_000  # hours, not centuries
    assert "/" not in profile.name and not profile.name.startswith(".")


PLAN = {
    "farm": {"out": "out", "retries": 1},
    "build": [
        {"project": "toy-a", "profiles": ["cpu-fp32", "openvino-cpu-fp32"]},
        {"project": "toy-b", "profiles": ["cpu-int8"]},
    ],
    "devices": {"openvino-cpu-fp32": "intel-core-ultra-200v"},
}
PLAN_PATHS = [
    ("farm", "out"),
    ("farm", "retries"),
    ("build",),
    ("build", 0, "project"),
    ("build", 0, "profiles"),
    ("build", 0, "profiles", 0),
    ("build", 1, "project"),
    ("devices",),
    ("devices", "openvino-cpu-fp32"),
]


@pytest.fixture(scope="module")
def farm_root(tmp_path_factory) -> Path:
    from farm_matrix import toy_projects

    root = tmp_path_factory.mktemp("fuzz-plan")
    toy_projects(root)
    return root


def test_fuzzed_farm_plans_load_or_say_one_line_and_keep_their_builds_inside_out(farm_root):
    """A plan is read whole before Ray starts: every mutation loads, or is one BadInput line; a plan that loads puts
    every build dir under its out dir."""
    from tapeout.farm.plan import load_plan
    from tapeout.farm.results import build_dir

    tricky = st.sampled_from(["../..", "/etc", "toy-a/../toy-b", "cpu-fp32", "h100-sxm", "a b", "..", "."])
    outcomes = []

    @fuzz(200)
    @given(edits(PLAN_PATHS, PLAN, extra=tricky))
    def run(changes):
        file = written(farm_root / "plan.toml", PLAN, changes)
        try:
            plan = load_plan(file)
        except BadInput as exc:
            assert "\n" not in str(exc)
            outcomes.append("refused")
            return
        for job in plan.jobs:
            assert build_dir(plan, job).resolve().is_relative_to(plan.out)
        outcomes.append("loaded")

    run()
    assert outcomes.count("refused") >= len(outcomes) // 5 and "loaded" in outcomes  # not vacuous


def test_a_long_extends_chain_and_a_cycle_are_one_line(tmp_path):
    (tmp_path / "p0.toml").write_text('extends = "cpu-fp32"\n')
    for i in range(1, 200):
        (tmp_path / f"p{i}.toml").write_text(f'extends = "p{i - 1}.toml"\n')
    (tmp_path / "loop.toml").write_text('extends = "loop.toml"\n')
    for name, says in (("p199.toml", "chain is over"), ("loop.toml", "forms a cycle")):
        result = run_main("profiles", "show", tmp_path / name)
        assert result.code == 2 and says in one_line_error(result)


# ---------------------------------------------------------------- build dirs from elsewhere


@pytest.fixture(scope="module")
def secret(tmp_path_factory) -> Path:
    """A file outside every build dir. A manifest that names it, with its true hash, must still be refused."""
    path = tmp_path_factory.mktemp("outside") / "secret.bin"
    path.write_bytes(b"not yours" * 100)
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fresh_copy(digits_build: Path, into: Path) -> Path:
    if into.exists():
        shutil.rmtree(into)
    shutil.copytree(digits_build, into)
    return into


def _manifest_paths(doc, prefix=()):
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield (*prefix, key)
            yield from _manifest_paths(value, (*prefix, key))
    elif isinstance(doc, list) and doc:
        yield from _manifest_paths(doc[0], (*prefix, 0))


LEAN_PROFILE = """
extends = "cpu-fp32"
[check]
iterations = 10
repeats = 1
warmup_min_iters = 1
warmup_min_s = 0.0
op_profile = false
"""


@pytest.fixture(scope="module")
def lean_digits_build(tmp_path_factory) -> Path:
    """digits-cnn with the leanest check a build allows (one timed process, no warm-up floor, no op-profile pass):
    each mutated manifest that verifies is then checked in one short process, not two. What is fuzzed is what
    `check` reads and verifies before it measures anything."""
    profile = tmp_path_factory.mktemp("profiles") / "lean.toml"
    profile.write_text(LEAN_PROFILE)
    out = tmp_path_factory.mktemp("builds") / "digits-lean"
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", profile, "--out", out)
    assert result.code == 0, result.err + result.out
    return out


@pytest.fixture(scope="module")
def manifest_doc(lean_digits_build):
    return json.loads((lean_digits_build / "manifest.json").read_text())


def test_fuzzed_manifests_verify_or_say_one_line(lean_digits_build, tmp_path_factory, secret, manifest_doc):
    paths = sorted(set(_manifest_paths(manifest_doc)), key=str)
    tricky = st.sampled_from(
        [
            f"../../{secret.name}",
            str(secret),
            "../manifest.json",
            "artifact/../../x",
            "link",
            _sha(secret),
            {},
            [],
            {"model.onnx": _sha(secret)},
            {f"../{secret.parent.name}/{secret.name}": _sha(secret)},
            "onnxruntime",
            "qnn",
        ]
    )
    work = tmp_path_factory.mktemp("fuzz-manifest") / "b"
    checked = []

    @fuzz(60)
    @given(edits(paths, manifest_doc, extra=tricky))
    def run(changes):
        build = _fresh_copy(lean_digits_build, work)
        (build / "artifact" / "link").symlink_to(secret)
        (build / "manifest.json").write_text(json.dumps(mutated(manifest_doc, changes), default=str))
        result = run_main("check", build, "--iterations", "10", "--repeats", "1", "--json")
        assert_handled(result)
        checked.append(result.code)

    run()
    # not vacuous: many mutations are refused, and fields check never reads leave a build that still checks
    assert checked.count(2) >= len(checked) // 4 and 0 in checked


@pytest.mark.parametrize("part", ["report", "golden", "structure"])
def test_fuzzed_reports_and_golden_files_with_matching_hashes_are_one_line(
    lean_digits_build, tmp_path_factory, part, manifest_doc
):
    work = tmp_path_factory.mktemp(f"fuzz-{part}") / "b"
    marker = work.parent / "pwned"
    json_file = {"report": "report.json", "structure": "structure.json"}.get(part)
    report_doc = json.loads((lean_digits_build / (json_file or "report.json")).read_text())
    golden = dict(np.load(lean_digits_build / "golden.npz"))
    report_paths = sorted(set(_manifest_paths(report_doc)), key=str)
    golden_edit = st.sampled_from(
        ["drop-inputs", "drop-outputs", "zero-d", "strings", "counts", "empty", "pickle", "not-a-zip", "extra", "nan"]
    )

    def rewrite_golden(kind: str, path: Path) -> None:
        arrays = {k: v.copy() for k, v in golden.items()}
        first_in = next(k for k in arrays if k.startswith("input."))
        if kind == "drop-inputs":
            arrays = {k: v for k, v in arrays.items() if not k.startswith("input.")}
        elif kind == "drop-outputs":
            arrays = {k: v for k, v in arrays.items() if not k.startswith("output.")}
        elif kind == "zero-d":
            arrays[first_in] = np.array(1.0, dtype=np.float32)
        elif kind == "strings":
            arrays[first_in] = np.array(["a"] * len(arrays[first_in]))
        elif kind == "counts":
            arrays[first_in] = arrays[first_in][:1]
        elif kind == "empty":
            arrays = {k: v[:0] for k, v in arrays.items()}
        elif kind == "pickle":
            arrays[first_in] = np.array([_Payload(marker)], dtype=object)
        elif kind == "nan":
            arrays[first_in] = np.full_like(arrays[first_in], np.nan)
        elif kind == "extra":
            arrays["input.nobody"] = arrays[first_in]
        if kind == "not-a-zip":
            path.write_bytes(pickle.dumps(_Payload(marker)))
        else:
            np.savez(path, **arrays)

    @fuzz(25 if json_file else 20)
    @given(edits(report_paths, report_doc) if json_file else golden_edit)
    def run(change):
        build = _fresh_copy(lean_digits_build, work)
        target = build / (json_file or "golden.npz")
        if json_file:
            target.write_text(json.dumps(mutated(report_doc, change), default=str))
        else:
            rewrite_golden(change, target)
        doc = copy.deepcopy(manifest_doc)
        doc[part]["sha256"] = _sha(target)  # the hash matches: only the content can be wrong
        (build / "manifest.json").write_text(json.dumps(doc))
        assert_handled(run_main("check", build, "--iterations", "10", "--repeats", "1", "--json"))
        assert not marker.exists(), "a golden file was unpickled"

    run()


def test_fuzzed_workload_files_read_back_or_say_one_line(tmp_path):
    """workload.npz as a re-hashed build dir could hold it: arrays dropped, reshaped, retyped, out of the vocabulary
    or holding a pickle; the reader returns prompts that fit the workload or says one line, nothing else."""
    from tapeout.core.decoding import CacheLayout
    from tapeout.core.schemas import GenerateWorkload
    from tapeout.measurement import generation

    rng = np.random.default_rng(0)
    workload = GenerateWorkload(kind="generate", prompt_lengths=[8, 16], new_tokens=6, max_context=32)
    layout = CacheLayout(2, 2, 8, 100, 32)
    base = {
        "prompt.8": rng.integers(0, 100, (3, 8)),
        "prompt.16": rng.integers(0, 100, (3, 16)),
        "agreement.prompts": rng.integers(0, 100, (4, 8)),
        "agreement.reference": rng.integers(0, 100, (4, 6)),
    }
    path, marker = tmp_path / "workload.npz", tmp_path / "pwned"
    key = st.sampled_from(sorted(base))
    edit = st.one_of(
        st.tuples(st.just("drop"), key),
        st.tuples(st.just("shift"), key, st.integers(-200, 200)),
        st.tuples(st.just("cut"), key, st.integers(0, 20)),
        st.tuples(st.just("float"), key),
        st.tuples(st.just("flat"), key),
        st.tuples(st.just("rename"), key, st.sampled_from(["prompt.9", "prompt.x", "prompt.", "agreement"])),
        st.tuples(st.just("pickle"), key),
    )
    outcomes = []

    @fuzz(150)
    @given(st.lists(edit, min_size=1, max_size=3))
    def run(changes):
        arrays = {k: v.copy() for k, v in base.items()}
        for change in changes:
            kind, name = change[0], change[1]
            if name not in arrays or arrays[name].dtype == object or (kind == "cut" and arrays[name].ndim != 2):
                continue  # an edit of an edit the file already lost
            if kind == "drop":
                del arrays[name]
            elif kind == "shift":
                arrays[name] = arrays[name] + change[2]
            elif kind == "cut":
                arrays[name] = arrays[name][:, : change[2]]
            elif kind == "float":
                arrays[name] = arrays[name].astype(np.float32) + 0.5
            elif kind == "flat":
                arrays[name] = arrays[name].ravel()
            elif kind == "rename":
                arrays[change[2]] = arrays.pop(name)
            else:
                arrays[name] = np.array([_Payload(marker)], dtype=object)
        np.savez(path, **arrays)
        try:
            prompts, golden, reference = generation.load_workload_data(path, layout, workload)
        except BadInput as exc:
            assert "\n" not in str(exc)
            outcomes.append("refused")
            return
        outcomes.append("read")
        assert sorted(prompts) == [8, 16] and reference.shape == (len(golden), workload.compared_tokens)
        assert all(a.min() >= 0 and a.max() < layout.vocab for a in (*prompts.values(), golden, reference))

    run()
    assert not marker.exists() and outcomes.count("refused") > len(outcomes) // 2 and "read" in outcomes


# ---------------------------------------------------------------- ONNX models


def _onnx_project(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tapeout.toml").write_text(
        '[model]\nsource = "model.onnx"\n\n[[inputs]]\nname = "image"\nshape = [1, 1, 8, 8]\n'
    )
    return folder


def test_mutated_onnx_bytes_build_or_say_one_line(digits_build, tmp_path_factory, fast_profile):
    source = (digits_build / "export" / "model.onnx").read_bytes()
    project = _onnx_project(tmp_path_factory.mktemp("fuzz-onnx") / "p")
    out = project.parent / "b"

    @fuzz(40)
    @given(st.sampled_from(["truncate", "flip", "flips", "splice"]), st.randoms(use_true_random=False))
    def run(kind, rnd):
        data = bytearray(source)
        if kind == "truncate":
            data = data[: rnd.randrange(len(data))]
        elif kind == "splice":
            at = rnd.randrange(len(data))
            data[at:at] = rnd.randbytes(rnd.randrange(1, 64))
        else:
            for _ in range(1 if kind == "flip" else 32):
                data[rnd.randrange(len(data))] = rnd.randrange(256)
        (project / "model.onnx").write_bytes(bytes(data))
        result = run_main("build", project, "-p", fast_profile, "-o", out, "--json")
        assert_handled(result)
        assert result.code != 0 or (out / "manifest.json").is_file()

    run()


def _structural_mutations(secret: Path):
    from onnx import TensorProto, helper

    def external(model, folder, location, offset=None, length=None, body=None):
        if body is not None:
            (folder / "w.bin").write_bytes(body)
        tensor = model.graph.initializer[0]
        tensor.ClearField("raw_data")
        tensor.ClearField("float_data")
        tensor.data_location = TensorProto.EXTERNAL
        del tensor.external_data[:]
        tensor.external_data.add(key="location", value=location)
        for key, value in (("offset", offset), ("length", length)):
            if value is not None:
                tensor.external_data.add(key=key, value=str(value))

    def in_subgraph(model, folder):
        const = helper.make_tensor("c", TensorProto.FLOAT, [4], [0, 0, 0, 0])
        const.ClearField("float_data")
        const.data_location = TensorProto.EXTERNAL
        const.external_data.add(key="location", value=f"../{secret.parent.name}/{secret.name}")
        branch = helper.make_graph(
            [helper.make_node("Constant", [], ["y"], value=const)],
            "branch",
            [],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        )
        model.graph.node.append(helper.make_node("If", ["cond"], ["if_out"], then_branch=branch, else_branch=branch))
        model.graph.initializer.append(helper.make_tensor("cond", TensorProto.BOOL, [], [True]))
        model.graph.output.append(helper.make_tensor_value_info("if_out", TensorProto.FLOAT, [4]))

    def not_utf8(model, folder):  # a damaged byte in a node name: the parser keeps it as bytes
        data = bytearray(model.SerializeToString())
        data[data.find(model.graph.node[0].name.encode())] = 0x80
        model.ParseFromString(bytes(data))

    def link(model, folder):
        (folder / "link.bin").unlink(missing_ok=True)
        (folder / "link.bin").symlink_to(secret)
        external(model, folder, "link.bin")

    return {
        "initializer-string-type": lambda m, f: setattr(m.graph.initializer[0], "data_type", TensorProto.STRING),
        "initializer-unknown-type": lambda m, f: setattr(m.graph.initializer[0], "data_type", 99),
        "initializer-huge-dim": lambda m, f: m.graph.initializer[0].dims.__setitem__(0, 2**40),
        "initializer-negative-dim": lambda m, f: m.graph.initializer[0].dims.__setitem__(0, -3),
        "input-huge-dim": lambda m, f: setattr(m.graph.input[0].type.tensor_type.shape.dim[0], "dim_value", 2**40),
        "input-int64": lambda m, f: setattr(m.graph.input[0].type.tensor_type, "elem_type", TensorProto.INT64),
        "unknown-op": lambda m, f: setattr(m.graph.node[0], "op_type", "NoSuchOp"),
        "unknown-domain": lambda m, f: setattr(m.graph.node[0], "domain", "com.example.none"),
        "opset-9999": lambda m, f: setattr(m.opset_import[0], "version", 9999),
        "ir-99": lambda m, f: setattr(m, "ir_version", 99),
        "no-outputs": lambda m, f: m.graph.ClearField("output"),
        "cycle": lambda m, f: m.graph.node[0].input.__setitem__(0, m.graph.node[-1].output[0]),
        "name-not-utf8": not_utf8,
        "external-absolute": lambda m, f: external(m, f, str(secret)),
        "external-dotdot": lambda m, f: external(m, f, f"../{secret.parent.name}/{secret.name}"),
        "external-backslash": lambda m, f: external(m, f, "..\\secret.bin"),
        "external-empty": lambda m, f: external(m, f, ""),
        "external-missing": lambda m, f: external(m, f, "nothere.bin"),
        "external-symlink": link,
        "external-offset-past-end": lambda m, f: external(m, f, "w.bin", 10**9, 64, b"\0" * 64),
        "external-short": lambda m, f: external(m, f, "w.bin", body=b"\0" * 8),
        "external-negative-offset": lambda m, f: external(m, f, "w.bin", -5, 10, b"\0" * 8192),
        "external-offset-not-a-number": lambda m, f: external(m, f, "w.bin", "abc", None, b"\0" * 8192),
        "external-in-a-subgraph": in_subgraph,
    }


STRUCTURAL = list(_structural_mutations(Path("/x/secret.bin")))


@pytest.mark.parametrize("case", STRUCTURAL)
def test_structurally_broken_onnx_models_are_one_line_and_never_copy_outside_data(
    digits_build, tmp_path, fast_profile, secret, case
):
    import onnx

    project = _onnx_project(tmp_path / "p")
    model = onnx.load(str(digits_build / "export" / "model.onnx"))
    _structural_mutations(secret)[case](model, project)
    onnx.save(model, str(project / "model.onnx"))
    result = run_main("build", project, "-p", fast_profile, "-o", tmp_path / "b")
    assert result.code == 2, result.err[-2000:]
    one_line_error(result)
    copied = b"".join(
        p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink() and p.parent != project
    )
    assert secret.read_bytes()[:32] not in copied
    assert not (tmp_path / "b").exists()


# ---------------------------------------------------------------- pickles: a marker that must never appear


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))  # unpickling creates the marker file


@pytest.mark.parametrize(
    "where", ["calibration-npz", "onnx-file-that-is-a-pickle", "npz-that-is-a-pickle", "hf-bin-weights"]
)
def test_pickles_in_data_files_never_run(tmp_path, fast_profile, where):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Payload(marker))
    project = tmp_path / "p"
    shutil.copytree(DIGITS, project, ignore=shutil.ignore_patterns("build"))
    command = ["build", project, "-p", fast_profile, "-o", tmp_path / "b"]
    if where == "calibration-npz":
        np.savez(project / "data" / "calibration.npz", image=np.array([_Payload(marker)], dtype=object))
    elif where == "npz-that-is-a-pickle":
        (project / "data" / "calibration.npz").write_bytes(payload)
    elif where == "onnx-file-that-is-a-pickle":
        (project / "model.onnx").write_bytes(payload)
        _onnx_project(project)
    else:
        pytest.importorskip("transformers")
        hf = project / "hf"
        hf.mkdir()
        (hf / "config.json").write_text(
            json.dumps(
                {
                    "model_type": "bert",
                    "vocab_size": 10,
                    "hidden_size": 8,
                    "num_hidden_layers": 1,
                    "num_attention_heads": 2,
                    "intermediate_size": 8,
                }
            )
        )
        (hf / "pytorch_model.bin").write_bytes(payload)
        (project / "tapeout.toml").write_text(
            '[model]\nsource = "hf"\n\n[[inputs]]\nname = "input_ids"\n'
            'shape = [1, 4]\ndtype = "int64"\nrange = [0, 9]\n'
        )
    result = run_cli(*command)
    assert result.code == 2, result.err[-2000:]
    one_line_error(result)
    assert not marker.exists(), f"{where}: a pickle was run"
    assert not (tmp_path / "b").exists()
