"""Step `stream`: a stream workload's loop measured on the target in fresh processes, each chunk fed the state the
previous chunk's outputs carry: per-chunk latency, real-time factor, deadline misses, cold start, memory, and the
streamed outputs against the FP32 reference over the golden stream (drift). A build's record step makes workload.npz
(the golden stream, the initial state and the reference's outputs, `make_stream_data`); a check replays it, verified
against the manifest. Nothing to do for another workload."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tapeout.core.errors import BadInput
from tapeout.core.feeds import random_feeds
from tapeout.core.schemas import Project, StreamWorkload
from tapeout.core.user_code import resolve_callable, user_code
from tapeout.measurement import streaming
from tapeout.measurement.measure import run_child
from tapeout.measurement.verdicts import judge_stream, undecided
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step
from tapeout.targets.base import StateCarrier


def golden_stream(project: Project) -> tuple[dict[str, np.ndarray], str]:
    """The streamed input's chunks [chunks, *shape]: from [workload] stream (chunked here if it is a flat signal),
    else seeded random chunks in the input's range."""
    workload: StreamWorkload = project.workload
    name = project.streamed_input
    spec = next(s for s in project.inputs if s.name == name)
    shape = spec.concrete_shape(project.dims)
    if workload.stream is None:
        rng = np.random.default_rng(project.seed + 7)
        chunks = [random_feeds([spec], project.dims, rng)[name] for _ in range(workload.chunks)]
        return {name: np.stack(chunks)}, "random chunks (seeded)"
    source = resolve_callable(workload.stream, project.root, "[workload] stream")
    with user_code(f"[workload] stream {workload.stream}", project.root):
        produced = source()
    if isinstance(produced, dict) and name not in produced:
        raise BadInput(
            f"[workload] stream {workload.stream} returned a dict without the streamed input {name!r} "
            f"(it has {', '.join(map(str, produced)) or 'nothing'})",
            fix=f"return {{{name!r}: array}} or the array itself",
        )
    array = np.asarray(produced[name] if isinstance(produced, dict) else produced)
    size = int(np.prod(shape))
    fix = (
        f"return an array [chunks, {', '.join(map(str, shape))}] of at least {workload.chunks} chunks, or a flat "
        f"signal of at least {workload.chunks * size} values"
    )
    if array.ndim == len(shape) + 1 and tuple(array.shape[1:]) == tuple(shape):
        chunks = array
    elif array.ndim == 1:
        chunks = array[: array.size // size * size].reshape(-1, *shape)
    else:
        raise BadInput(
            f"[workload] stream {workload.stream} returned shape {list(array.shape)} for input {name!r} "
            f"of chunk shape {list(shape)}",
            fix=fix,
        )
    if len(chunks) < workload.chunks:
        raise BadInput(
            f"[workload] stream {workload.stream} gave {len(chunks)} chunks; chunks = {workload.chunks}",
            fix=fix + ", or lower [workload] chunks",
        )
    if not np.issubdtype(array.dtype, np.number):
        raise BadInput(f"[workload] stream {workload.stream} returned {array.dtype} values", fix=fix)
    chunks = chunks[: workload.chunks]
    bad = np.flatnonzero(~np.isfinite(chunks.reshape(len(chunks), -1)).all(axis=1))
    if bad.size:  # NaN would be fed to both models and written into the report as the drift
        raise BadInput(
            f"[workload] stream {workload.stream}: chunk {int(bad[0])} holds NaN or infinity ({bad.size} chunks do)",
            fix="return finite samples",
        )
    return {name: chunks.astype(spec.dtype)}, f"[workload] stream {workload.stream}"


def make_stream_data(state: BuildState) -> Path:
    """workload.npz: the golden stream with the constants, the zero initial state, and the FP32 reference carried
    over it."""
    project = state.setup.project
    workload: StreamWorkload = project.workload
    specs = {s.name: s for s in project.inputs}
    chunks, source = golden_stream(project)
    constants = {name: state.golden.inputs[0][name] for name in workload.constant}
    initial = {
        name: np.zeros(specs[name].concrete_shape(project.dims), dtype=specs[name].dtype) for name in workload.state
    }
    data = streaming.StreamData(chunks, constants, initial, {})
    checked = False

    def reference(feeds):
        nonlocal checked
        out = state.exported.reference(feeds)
        if not checked:
            streaming.check_state_shapes(project, out)
            checked = True
        return out

    with state.ui.step(
        f"reference over the golden stream: {workload.chunks} chunks, state carried ({state.golden.reference})"
    ):
        data.reference = streaming.stacked(list(streaming.carry(StateCarrier(reference, workload.state), data)))
    path = state.out / streaming.WORKLOAD_FILE
    data.save(path)
    state.ui.note(
        f"stream: {workload.chunks} chunks of {workload.deadline_ms:g} ms from {source}, state "
        f"{', '.join(f'{o} → {i}' for i, o in workload.state.items())}"
    )
    return path


class Stream(Step):
    name = "stream"
    needs = ("artifact", "artifact_info", "golden", "engine")
    needs_at_build = ("workload_file",)
    adds = ("stream",)

    def run(self, state: BuildState) -> str | None:
        setup = state.setup
        if state.opened is not None:
            opened = state.opened.workload()
            if opened is None or opened[0].kind != "stream":
                state.stream = None
                return f"the build's workload is {'forward' if opened is None else opened[0].kind}"
            workload, _, path = opened
        else:
            workload = setup.project.workload
            if workload.kind != "stream":
                state.stream = None
                return f"the project's workload is {workload.kind}"
            path = state.workload_file  # the record step wrote it while the reference was loaded
        data = streaming.StreamData.load(path)
        data.check_fits(workload, path)
        settings, artifact = state.settings, state.artifact
        base = {
            "target": artifact.target,
            "artifact_dir": str(artifact.directory),
            "main_file": artifact.main_file,
            "options": setup.target.options.model_dump(mode="json"),
            **streaming.request_fields(workload, path),
        }
        # Through an emulator the timings are never judged: one process and one timed stream; the golden stream's
        # outputs (what drift is judged on) are the same either way.
        repeats, trials = (1, 1) if setup.emulated else (settings.repeats, workload.trials)
        base["workload"] = {**base["workload"], "trials": trials}
        results = []
        with state.ui.step(
            f"stream: {trials} streams × {workload.chunks} chunks, state carried, in fresh processes"
            + (" (emulated: outputs only)" if setup.emulated else "")
        ):
            for r in range(repeats):
                state.ui.detail(f"stream: process {r + 1}/{repeats}")
                results.append(run_child({**base, "want_outputs": r == 0}, timeout_s=1800))
        state.stream = streaming.summarize(
            results, results[0]["outputs"][0], data, workload, state.artifact_info.bytes, settings.confidence
        )
        if not setup.emulated and undecided(judge_stream(setup.profile.budgets, state.stream, settings, None)):
            with state.ui.step(f"stream: a timing budget is inconclusive, {repeats} processes more"):
                for r in range(repeats):
                    state.ui.detail(f"stream: process {repeats + r + 1}/{2 * repeats}")
                    results.append(run_child({**base, "want_outputs": False}, timeout_s=1800))
            state.stream = streaming.summarize(
                results, results[0]["outputs"][0], data, workload, state.artifact_info.bytes, settings.confidence
            )
            state.stream.notes.append("a timing budget was inconclusive; sampling was doubled once")
        if setup.emulated:
            state.stream.notes.append(f"emulated: {setup.emulated}; timings not judged")
        return None

    def report(self, state: BuildState) -> dict[str, object]:
        return {"workload": state.stream.to_json()} if state.stream is not None else {}
