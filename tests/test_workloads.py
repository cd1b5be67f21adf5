"""The workload contract (core/workload.py): every kind is one module behind one interface, found by name. No module
outside the workloads' own tests the kind; a workload from another package (tests/plugins/tapeout_toys/toy_workload.py,
one module and one entry point) builds, is judged and is checked with nothing of tapeout edited; a kind nothing
provides, or a misspelt one, is one line."""

from __future__ import annotations

import ast
import json
import os

import pytest

from conftest import REPO, run_cli

ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests" / "plugins"), os.environ.get("PYTHONPATH")]))}
FAST = "[check]\niterations = 30\nrepeats = 1\nwarmup_min_s = 0.05\nop_profile_iterations = 5\n"

PACKAGE = ("toolkit", "exporters", "quantize", "targets")
# the workloads' own modules: the registry that names the built-in ones, and each workload's module
OWN = (REPO / "toolkit" / "core" / "workload.py", REPO / "toolkit" / "workloads")


def _kinds() -> set[str]:
    from tapeout.core import workload

    return set(workload.BUILT_IN)


def _tests_of_the_kind(tree: ast.AST, kinds: set[str]) -> list[int]:
    """Lines comparing anything with a kind's name (`x.kind == "generate"`, `kind in ("generate", "stream")`)."""

    def names_a_kind(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in kinds
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(names_a_kind(e) for e in node.elts)
        return False

    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare) and any(names_a_kind(side) for side in (node.left, *node.comparators))
    ]


def test_no_module_outside_the_workloads_tests_the_kind():
    kinds = _kinds()
    found = []
    for folder in PACKAGE:
        for path in sorted((REPO / folder).rglob("*.py")):
            if path == OWN[0] or OWN[1] in path.parents:
                continue
            lines = _tests_of_the_kind(ast.parse(path.read_text(), str(path)), kinds)
            found += [f"{path.relative_to(REPO)}:{line}" for line in lines]
    assert not found, f"the workload kind tested outside its module (ask the workload instead): {found}"


def test_the_check_finds_a_test_of_the_kind():
    """The scan above is not vacuous: it finds each form a test of the kind takes."""
    code = (
        'a = w.kind == "generate"\nb = kind not in ("forward", "stream")\nc = w.get("kind") != "stream"\nd = x == "y"'
    )
    assert _tests_of_the_kind(ast.parse(code), _kinds()) == [1, 2, 3]


def _project(tmp_path, workload: str):
    project = tmp_path / "mlp"
    project.mkdir(exist_ok=True)
    (project / "model.py").write_text(
        "import torch\n\n\ndef build():\n    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()\n"
    )
    (project / "tapeout.toml").write_text(
        f'[model]\nsource = "model.py:build"\n[[inputs]]\nname = "x"\nshape = [1, 16]\n[workload]\n{workload}\n'
    )
    (tmp_path / "fast.toml").write_text(f'extends = "cpu-fp32"\n{FAST}')
    return project


def test_a_workload_from_another_package_builds_is_judged_and_checks(tmp_path):
    project = _project(tmp_path, 'kind = "sweep"\ncalls = 4\ntrials = 3\nmax_sequence_ms = 10000')
    built = run_cli("build", project, "-p", tmp_path / "fast.toml", "-o", tmp_path / "b", "--json", env=ENV)
    assert built.code == 0, built.err + built.out
    report = built.json()
    w = report["workload"]
    assert w["kind"] == "sweep" and w["calls"] == 4 and w["sequences"] == 3  # trials × check.repeats (1)
    assert 0 < w["sequence_ms"]["min"] <= w["sequence_ms"]["median"] <= w["sequence_ms"]["max"]
    judged = {b["budget"]: b for b in report["budgets"]}
    assert judged["max_sequence_ms"]["verdict"] == "pass"
    assert judged["max_sequence_ms"]["measured"] == w["sequence_ms"]["max"]
    assert "## Sweep (the golden input, call after call" in (tmp_path / "b" / "report.md").read_text()
    assert "loop" in [s["name"] for s in report["run"]["steps"]]
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["workload"]["settings"]["kind"] == "sweep"

    checked = run_cli("check", tmp_path / "b", "--json", env=ENV)
    assert checked.code == 0, checked.err
    assert checked.json()["workload"]["kind"] == "sweep"
    without = run_cli("check", tmp_path / "b")  # where the plug-in is not installed: one line, what to do
    assert without.code == 2 and "workload.settings.kind is 'sweep', not a workload kind here" in without.err


def test_a_plug_in_workloads_budget_fails_the_build(tmp_path):
    project = _project(tmp_path, 'kind = "sweep"\ncalls = 4\ntrials = 2\nmax_sequence_ms = 1e-6')
    built = run_cli("build", project, "-p", tmp_path / "fast.toml", "-o", tmp_path / "b", "--json", env=ENV)
    assert built.code == 1, built.err
    assert {b["budget"]: b["verdict"] for b in built.json()["budgets"]}["max_sequence_ms"] == "fail"


@pytest.mark.parametrize(
    "workload, says",
    [
        ('kind = "sweep"', "unknown workload kind 'sweep': the kinds are forward, generate, stream"),
        ('kind = "generat"', "unknown workload kind 'generat': did you mean 'generate'?"),
        ('kind = "stream"\nchunks = 100\ndeadline_ms = 10\nstate = {}', "field 'workload.state'"),
        ('kind = "generate"\nprompt_lengths = [4]\nmax_context = 64\ntrails = 2', "unknown field 'workload.trails'"),
    ],
)
def test_a_workload_nothing_provides_or_misspelt_is_one_line_and_no_build_dir(tmp_path, workload, says):
    project = _project(tmp_path, workload)
    result = run_cli("build", project, "-p", tmp_path / "fast.toml", "-o", tmp_path / "b")
    assert result.code == 2 and says in result.err, result.err
    assert "Traceback" not in result.err and not (tmp_path / "b").exists()


def test_the_built_in_kinds_are_listed_first_and_each_names_its_own_schema():
    from tapeout.core import workload

    assert workload.kinds()[:3] == ["forward", "generate", "stream"]
    for kind in workload.BUILT_IN:
        found = workload.get(kind)
        assert found.kind == kind and found.settings.model_fields["kind"].annotation.__args__ == (kind,)
    assert workload.get("forward").loop_name is None and workload.get("generate").carries
