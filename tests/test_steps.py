"""The build is one ordered list of steps over one typed state; a check is an opening and the tail of the same
list. Each step's needs are met by the steps before it (or, in a check, by the build dir it opened)."""

from __future__ import annotations

import gc
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from tapeout.core.errors import BadInput
from tapeout.steps import flows
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step, run


def _unmet(steps: tuple[Step, ...], kind: str) -> list[str]:
    added: set[str] = set()
    unmet = []
    for step in steps:
        needs = (*step.needs, *(step.needs_at_build if kind == "build" else ()))
        unmet += [f"{step.name} needs {n}" for n in needs if n not in added]
        added |= set(step.adds)
    return unmet


@pytest.mark.parametrize(
    ("name", "kind"), [("BUILD", "build"), ("CHECK", "check"), ("EXPORT", "build"), ("LINT", "build")]
)
def test_every_step_needs_only_what_an_earlier_step_added(name, kind):
    steps = getattr(flows, name)
    assert _unmet(steps, kind) == []
    names = [s.name for s in steps]
    assert len(names) == len(set(names)), names


def test_check_reads_the_golden_file_back_then_runs_the_tail_of_the_builds_list():
    assert flows.CHECK[2:] == flows.BUILD[len(flows.BUILD) - len(flows.CHECK) + 2 :]
    assert [s.name for s in flows.CHECK[:3]] == ["open", "golden", "engine"]
    assert type(flows.CHECK[1]) in {type(s) for s in flows.BUILD}


def test_no_step_after_release_runs_the_torch_module():
    """What needs the loaded model comes before the release step; its own check refuses a list that breaks that."""
    at = next(i for i, step in enumerate(flows.BUILD) if step.name == "release")
    assert [s.name for s in flows.BUILD[at + 1 :] if "loaded" in (*s.needs, *s.needs_at_build)] == []
    assert {"export", "reference", "golden", "record"} <= {s.name for s in flows.BUILD[:at]}


def test_the_check_catches_a_step_out_of_order():
    """The test above can fail: measurement before the artifact exists is named."""
    at = next(i for i, step in enumerate(flows.BUILD) if step.name == "measure")
    moved = (*flows.BUILD[:8], flows.BUILD[at], *flows.BUILD[8:at], *flows.BUILD[at + 1 :])
    assert "measure needs artifact" in _unmet(moved, "build")


def test_needs_and_adds_name_state_fields():
    state_fields = {f.name for f in fields(BuildState)}
    for step in flows.BUILD + flows.CHECK:
        assert set(step.needs) | set(step.needs_at_build) | set(step.adds) <= state_fields, step.name
    with pytest.raises(TypeError, match="not BuildState fields"):

        class Misnamed(Step):
            name = "misnamed"
            needs = ("artefact",)

            def run(self, state):
                return None


def test_the_heap_is_frozen_after_each_step_its_garbage_collected_first_and_given_back_when_the_list_ends():
    """The runner takes what each step left (torch, the exporter, the model, the step's results) out of the cyclic
    collector's full passes, after collecting what the step let go, and puts it back when the list ends, failed or
    not: a process that runs many builds keeps nothing."""
    import weakref

    seen: list[int] = []
    kept: list[list] = []
    dropped: list[weakref.ref] = []

    class Cycle:
        def __init__(self):
            self.me = self

    class Probe(Step):
        name = "probe"

        def run(self, state):
            seen.append(gc.get_freeze_count())
            kept.append([[] for _ in range(10_000)])  # each freeze after this step takes these 10,000 too
            dropped.append(weakref.ref(Cycle()))  # garbage in a cycle, let go within the step

    class Fails(Step):
        name = "fails"

        def run(self, state):
            raise BadInput("the step failed", fix="none needed")

    def state() -> BuildState:
        return BuildState(None, "build", Path("."), ".", None)

    run((Probe(), Probe(), Probe()), state())
    # frozen again after the second step, with the 10,000 it made (a frozen object a finalizer lets go of leaves the
    # count, so it may fall by a few); the cycles the steps dropped were collected before any freeze took them
    assert seen[0] == 0 and seen[1] > 10_000 and seen[2] >= seen[1] + 9_000 and gc.get_freeze_count() == 0
    assert all(ref() is None for ref in dropped)
    with pytest.raises(BadInput):
        run((Probe(), Fails()), state())
    assert gc.get_freeze_count() == 0


def test_the_loops_evaluation_stands_for_the_artifact_only_where_it_ran_the_artifacts_own_bytes(tmp_path):
    """The accuracy step skips re-evaluating the artifact only where the sensitivity loop scored exactly those files
    (an IR the compile step copied) or compiled the very artifact (a torch.export target's kept candidate)."""
    from types import SimpleNamespace

    from tapeout.core.artifact import Artifact
    from tapeout.steps.accuracy import _scored_by_the_loop

    quantized, artifact = tmp_path / "quantized", tmp_path / "artifact"
    for folder in (quantized, artifact):
        folder.mkdir()
        (folder / "model.xml").write_text("<net/>")
        (folder / "model.bin").write_bytes(b"\x01\x02")

    def state(metric=0.97, compiled=None):
        search = {"metric": metric} if metric is not None else {}
        return SimpleNamespace(
            quantization={"search": search},
            model=quantized / "model.xml",
            compiled=compiled,
            artifact=Artifact("openvino", artifact, "model.xml"),
        )

    assert _scored_by_the_loop(state()) == 0.97
    assert _scored_by_the_loop(state(metric=None)) is None  # no loop ran: nothing to stand for it
    (artifact / "model.bin").write_bytes(b"\x01\x03")  # one byte of the weights differs
    assert _scored_by_the_loop(state()) is None
    (artifact / "model.bin").write_bytes(b"\x01\x02")
    (artifact / "cache.blob").write_bytes(b"")  # a file the loop's session never read
    assert _scored_by_the_loop(state()) is None
    assert _scored_by_the_loop(state(compiled=Artifact("aoti", artifact, "model.pt2"))) == 0.97


def test_the_reference_metric_is_remembered_for_the_same_export_and_project_files_only(tmp_path):
    """Within one process the FP32 reference metric is computed once per export and project state: a project file
    edited, or another export, computes it again; the project's build outputs do not count."""
    import os
    import shutil
    from types import SimpleNamespace

    from conftest import SAMPLES
    from tapeout.core.config import load_project
    from tapeout.steps.reference import _inputs_key

    project_dir = tmp_path / "digits"
    shutil.copytree(SAMPLES / "digits-cnn", project_dir, ignore=shutil.ignore_patterns("build"))
    export = tmp_path / "export" / "model.onnx"
    export.parent.mkdir()
    export.write_bytes(b"onnx")
    out = project_dir / "build" / "cpu-fp32"
    out.mkdir(parents=True)

    def key():
        setup = SimpleNamespace(project=load_project(project_dir))
        return _inputs_key(SimpleNamespace(setup=setup, exported=SimpleNamespace(path=export), out=out))

    first = key()
    (out / "report.json").write_text("{}")  # a build's own output
    (project_dir / "build" / "other").mkdir()
    assert key() == first
    metric = project_dir / "metric.py"
    metric.write_text(metric.read_text() + "\n")  # the metric's code edited
    assert key() != first
    edited = key()
    os.utime(project_dir / "weights.npz", ns=(1, 1))  # data touched
    assert key() != edited
    touched = key()
    export.write_bytes(b"onnx, another export")
    assert key() != touched


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc_trim")
def test_memory_a_step_freed_goes_back_to_the_system_before_the_next_step():
    """glibc keeps freed heap pages for the process: a step that made and dropped many small buffers would leave
    them resident under the next step's peak. The runner hands them back after each step."""
    from tapeout.steps import step as runner

    def resident_mb() -> float:
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS")) / 1024

    made = [bytes(1024) for _ in range(200_000)]  # 200 MB in pieces under the mmap threshold: heap, not mmap
    kept = made[::64]  # what the step keeps, spread over the heap: glibc cannot shrink it from the top
    del made
    before = resident_mb()
    runner.return_freed_memory()
    assert before - resident_mb() > 100 and len(kept) == 3125


@pytest.mark.slow  # two in-process builds of small samples (about 40 s)
@pytest.mark.parametrize("sample", ["tiny-lm", "speech-vad"])
def test_the_torch_module_is_freed_by_the_release_step_and_the_loop_still_has_its_reference(
    sample, tmp_path, fast_profile, monkeypatch
):
    """The module and its weights are gone (collected, not just unnamed) once `release` has run, before the precision
    step, after a fresh export (the exporter's rewrite rules would keep the exported graph, whose initializers wrap the
    parameters): a generate and a stream build still measure their loop against the reference the record step
    wrote, and exit clean."""
    import shutil
    import weakref

    from conftest import SAMPLES
    from tapeout.core.console import UI

    held: list[weakref.ref] = []
    after: list[object] = []

    class Hold(Step):
        name = "hold"

        def run(self, state):
            module = state.loaded.module
            held.extend([weakref.ref(module), weakref.ref(max(module.parameters(), key=lambda t: t.numel()))])

    class Look(Step):
        name = "look"

        def run(self, state):
            after.extend(ref() for ref in held)

    monkeypatch.setenv("TAPEOUT_EXPORT_CACHE", "off")
    at = next(i for i, step in enumerate(flows.BUILD) if step.name == "release")
    monkeypatch.setattr(flows, "BUILD", (*flows.BUILD[:at], Hold(), flows.BUILD[at], Look(), *flows.BUILD[at + 1 :]))
    project = tmp_path / sample
    shutil.copytree(SAMPLES / sample, project, ignore=shutil.ignore_patterns("build", "__pycache__"))
    try:
        report = flows.build(project, str(fast_profile), tmp_path / "out", UI())
    finally:  # the sample's own modules (its model.py as `model`) would shadow another sample's in this worker
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(str(project)):
                del sys.modules[name]
    assert len(held) == 2 and after == [None, None]
    assert {"record", "release"} <= {r.name for r in report.run.steps}  # a step that skipped is left out
    assert report.exit_code == 0 and (tmp_path / "out" / "workload.npz").is_file()
    assert report.workload["kind"] == ("generate" if sample == "tiny-lm" else "stream")
