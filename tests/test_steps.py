"""The build is one ordered list of steps over one typed state; a check is an opening and the tail of the same
list. Each step's needs are met by the steps before it (or, in a check, by the build dir it opened)."""

from __future__ import annotations

import gc
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


@pytest.mark.parametrize(("name", "kind"), [("BUILD", "build"), ("CHECK", "check"), ("EXPORT", "build"),
                                            ("LINT", "build")])
def test_every_step_needs_only_what_an_earlier_step_added(name, kind):
    steps = getattr(flows, name)
    assert _unmet(steps, kind) == []
    names = [s.name for s in steps]
    assert len(names) == len(set(names)), names


def test_check_runs_the_tail_of_the_builds_list():
    assert flows.CHECK[1:] == flows.BUILD[len(flows.BUILD) - len(flows.CHECK) + 1:]
    assert [s.name for s in flows.CHECK[:2]] == ["open", "engine"]


def test_the_check_catches_a_step_out_of_order():
    """The test above can fail: measurement before the artifact exists is named."""
    moved = (*flows.BUILD[:8], flows.BUILD[11], *flows.BUILD[8:11], *flows.BUILD[12:])
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


def test_the_heap_is_frozen_after_the_first_step_and_given_back_when_the_list_ends():
    """The runner takes what the first step left (torch, the model) out of the cyclic collector's full passes,
    and puts it back when the list ends, failed or not: a process that runs many builds keeps nothing."""
    seen: list[int] = []

    class Probe(Step):
        name = "probe"

        def run(self, state):
            seen.append(gc.get_freeze_count())

    class Fails(Step):
        name = "fails"

        def run(self, state):
            raise BadInput("the step failed", fix="none needed")

    def state() -> BuildState:
        return BuildState(None, "build", Path("."), ".", None)

    run((Probe(), Probe(), Probe()), state())
    assert seen[0] == 0 and seen[1] > 0 and seen[2] == seen[1] and gc.get_freeze_count() == 0
    with pytest.raises(BadInput):
        run((Probe(), Fails()), state())
    assert gc.get_freeze_count() == 0
