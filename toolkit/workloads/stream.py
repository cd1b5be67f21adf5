"""`[workload] kind = "stream"`: chunk after chunk with state carried, each chunk's state outputs the next chunk's
state inputs. Measured on the target in fresh processes: per-chunk latency, real-time factor, deadline misses, cold
start, memory, and the streamed outputs against the FP32 reference over the golden stream (drift). A build records
workload.npz (the golden stream, the initial state and the reference's outputs, `make_stream_data`); a check replays
it, verified against the manifest."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tapeout.core.errors import BadInput
from tapeout.core.feeds import random_feeds
from tapeout.core.profile_schema import min_samples_for_bound
from tapeout.core.schemas import Project, StreamWorkload
from tapeout.core.user_code import resolve_callable, user_code
from tapeout.core.workload import WORKLOAD_FILE, Workload
from tapeout.measurement import streaming
from tapeout.measurement.measure import artifact_request, measure_loop
from tapeout.measurement.verdicts import judge_stream, undecided
from tapeout.reports import streaming as report
from tapeout.targets.base import StateCarrier

if TYPE_CHECKING:  # annotations only: the steps hand the state in
    from tapeout.measurement.streaming import StreamMeasurement
    from tapeout.steps.state import BuildState


def streamed_input(project: Project) -> str:
    """The stream's chunk input (validated to exist)."""
    workload: StreamWorkload = project.workload
    if workload.chunk_input is not None:
        return workload.chunk_input
    return next(s.name for s in project.inputs if s.name not in workload.state and s.name not in workload.constant)


def golden_stream(project: Project) -> tuple[dict[str, np.ndarray], str]:
    """The streamed input's chunks [chunks, *shape]: from [workload] stream (chunked here if it is a flat signal),
    else seeded random chunks in the input's range."""
    workload: StreamWorkload = project.workload
    name = streamed_input(project)
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
    path = state.out / WORKLOAD_FILE
    data.save(path)
    state.ui.note(
        f"stream: {workload.chunks} chunks of {workload.deadline_ms:g} ms from {source}, state "
        f"{', '.join(f'{o} → {i}' for i, o in workload.state.items())}"
    )
    return path


class Stream(Workload):
    kind = "stream"
    settings = StreamWorkload
    carries = "each chunk feeds its state back"
    loop_name = "stream"
    heading = "Stream"
    call_scope = ": one chunk, on the golden inputs' state (the stream above carries it)"
    example_budgets = (
        "# chunk_p99_ms = 8",
        "# real_time_factor = 0.25",
        "# stream_max_rel_error = 0.01   # drift from torch over the golden stream, share of each output's scale",
    )

    def check_project(self, project: Project) -> None:
        """Every input is the streamed chunk, a state fed back from a named output, or a constant; anything else
        (a state input with no output mapped to it) would be fed random values once and never carried."""
        workload = project.workload
        names = [s.name for s in project.inputs]
        outputs = project.model.outputs
        for state_input, output in workload.state.items():
            if state_input not in names:
                raise ValueError(f"[workload] state names input {state_input!r}, which is not among [[inputs]] {names}")
            if outputs is None:
                raise ValueError(
                    '[workload] kind = "stream" maps state outputs by name: name the model\'s outputs in '
                    f'[model] outputs (in order), e.g. outputs = ["probability", "{output}"]'
                )
            if output not in outputs:
                raise ValueError(
                    f'[workload] state {{{state_input} = "{output}"}}: {output!r} is not among [model] '
                    f"outputs {outputs}"
                )
        for name in workload.constant:
            if name not in names:
                raise ValueError(f"[workload] constant names input {name!r}, which is not among [[inputs]] {names}")
            if name in workload.state:
                raise ValueError(f"[workload] input {name!r} is both state and constant")
        rest = [n for n in names if n not in workload.state and n not in workload.constant]
        chunk = workload.chunk_input or (rest[0] if rest else None)
        if workload.chunk_input is not None:
            if workload.chunk_input not in rest:
                why = "is state or constant" if workload.chunk_input in names else f"is not among [[inputs]] {names}"
                raise ValueError(f"[workload] chunk_input {workload.chunk_input!r} {why}")
            rest.remove(workload.chunk_input)
        elif rest:
            rest = rest[1:]  # the first input that is neither state nor constant is the chunk
        else:
            raise ValueError(
                '[workload] kind = "stream" needs an input the chunks arrive on, and every input is state or constant'
            )
        if rest:
            example = f'state = {{{rest[0]} = "{rest[0]}_out"}}'
            raise ValueError(
                f"[workload] input(s) {rest} are neither the streamed chunk ({chunk!r}), state nor constant: "
                f"map the output that carries each ({example}), list it in constant, or name another chunk "
                "input in chunk_input"
            )
        for spec in project.inputs:
            if spec.name in workload.state and not spec.dtype.startswith("float"):
                raise ValueError(f"[workload] state input {spec.name!r} is {spec.dtype}: state is a float tensor")

    def user_callables(self, project: Project) -> dict[str, str]:
        return {"stream": project.workload.stream} if project.workload.stream else {}

    def check_profile(self, project: Project, profile, target) -> None:
        """chunk_p99_ms needs enough timed chunks to bound the p99: one per chunk per timed stream per process."""
        super().check_profile(project, profile, target)
        workload, check = project.workload, profile.check
        if profile.budgets.chunk_p99_ms is None:
            return
        count, need = workload.chunks * workload.trials * check.repeats, min_samples_for_bound(0.99, check.confidence)
        if count < need:
            raise BadInput(
                f"[workload] chunks × trials × check.repeats = {count} cannot bound the p99 that chunk_p99_ms is "
                f"judged on at confidence {check.confidence}: it needs at least {need} timed chunks",
                fix=f"raise [workload] chunks or trials in {project.file.name} (or check.repeats in the profile)",
            )

    def carried_outputs(self, project: Project) -> tuple[str, ...]:
        return tuple(project.workload.state.values())

    def carried_inputs(self, project: Project) -> tuple[str, ...]:
        return tuple(project.workload.state)

    def load(self, state: BuildState, loaded: Any) -> Any:
        """A stream's state outputs have their state inputs' shapes, checked on one call of a torch model before
        anything is built (an ONNX source is checked on the reference's first chunk)."""
        if loaded.kind != "torch":
            return loaded
        from tapeout.exporters.torch_onnx import torch_outputs

        project = state.setup.project
        feeds = random_feeds(project.inputs, project.dims, np.random.default_rng(project.seed))
        streaming.check_state_shapes(
            project, torch_outputs(loaded.module, feeds, [s.name for s in project.inputs], loaded.output_names)
        )
        return loaded

    def record(self, state: BuildState) -> Path:
        return make_stream_data(state)

    def measure(self, state: BuildState) -> StreamMeasurement:
        setup = state.setup
        workload, _, path = self.loop_data(state)
        data = streaming.StreamData.load(path)
        data.check_fits(workload, path)
        settings, budgets, size = state.settings, setup.profile.budgets, state.artifact_info.bytes
        request = {**artifact_request(setup.target, state.artifact), **streaming.request_fields(workload, path)}
        # Through an emulator the timings are never judged: one process and one timed stream; the golden stream's
        # outputs (what drift is judged on) are the same either way.
        repeats, trials = (1, 1) if setup.emulated else (settings.repeats, workload.trials)
        request["workload"] = {**request["workload"], "trials": trials}
        return measure_loop(
            request,
            repeats,
            "want_outputs",
            lambda results: streaming.summarize(
                results, results[0]["outputs"][0], data, workload, size, settings.confidence
            ),
            lambda result: undecided(self.judge(budgets, result, settings, None)),
            state.ui,
            f"stream: {trials} streams × {workload.chunks} chunks, state carried, in fresh processes"
            + (" (emulated: outputs only)" if setup.emulated else ""),
            setup.emulated,
        )

    def child(self, request: dict) -> dict:
        """The measuring process: cold start (the runtime opened + the first chunk), the golden stream once with its outputs
        written to `outputs_path` where asked, then the timed streams (measurement/streaming.py)."""
        from tapeout.measurement.runner import workload_frame

        data = streaming.StreamData.load(Path(request["workload_data"]))

        def streams(carrier) -> dict:
            timings, outputs = streaming.loop(carrier, request["workload"], data)
            if request.get("outputs_path"):
                np.savez(request["outputs_path"], **{f"0.{k}": v for k, v in outputs.items()})  # run_child's layout
            return {"stream": {**timings, "carrier": carrier.description}}

        return workload_frame(
            request,
            lambda session: session.carrier(request["workload"]["state"]),
            lambda carrier: streaming.first_chunk(carrier, data),
            streams,
        )

    def judge(self, budgets, result, settings, emulated):
        return judge_stream(budgets, result, settings, emulated)

    def markdown(self, section: dict, emulated: str | None) -> list[str]:
        return report.section(section, emulated)

    def one_line(self, section: dict, estimate: dict | None) -> str:
        return report.one_line(section)

    def html_figure(self, section: dict) -> str:
        from tapeout.reports.html_page import stream_figure

        return stream_figure(section)

    def diff_figures(self, section: dict, timed: bool) -> dict[str, tuple]:
        return report.diff_figures(section, timed)

    def headline(self, section: dict, emulated: str | None) -> dict:
        return report.headline(section, emulated)

    def headline_cell(self, headline: dict) -> str:
        return report.headline_cell(headline)

    def rank(self, headline: dict) -> tuple[float, str] | None:
        return (headline["chunk_p99_ms"], "chunk p99") if headline.get("chunk_p99_ms") else None


WORKLOAD = Stream()
