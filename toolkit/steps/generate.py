"""Step `generate`: a generate workload's loop measured on the target in fresh processes: time to first token per
prompt length, time per output token, tokens per second, cold start, the memory split with the KV cache at
max_context, and greedy agreement with the torch reference on the golden prompts. A build's record step makes
workload.npz (the prompts and the reference's greedy tokens, `make_workload_data`); a check replays it, verified
against the manifest. Nothing to do for a forward workload."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tapeout.core.decoding import CacheLayout, graph_layout
from tapeout.core.schemas import GenerateWorkload
from tapeout.measurement import generation
from tapeout.measurement.measure import run_child
from tapeout.measurement.verdicts import judge_generation, undecided
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


def make_workload_data(state: BuildState, layout: CacheLayout) -> Path:
    """The prompts each length is timed on (batch rows), the golden prompts and the torch model's greedy tokens."""
    from tapeout.exporters import generation as export_generation

    project = state.setup.project
    workload: GenerateWorkload = project.workload
    prompts = {}
    for i, length in enumerate(workload.prompt_lengths):
        rows, _ = export_generation.prompt_tokens(project, layout, workload.batch, length, seed_offset=i + 1)
        prompts[length] = np.stack(rows)
    golden, _ = export_generation.prompt_tokens(
        project, layout, workload.agreement_prompts, min(workload.prompt_lengths)
    )
    made = state.exported.greedy_tokens if state.exported is not None else None
    if made is not None and made.shape == (len(golden), workload.compared_tokens):
        reference = made  # the export's verification made them: torch's greedy tokens on these very prompts
    else:
        with state.ui.step(
            f"reference greedy tokens: {len(golden)} prompts × {workload.compared_tokens} tokens (torch)"
        ):
            reference = export_generation.reference_greedy(
                export_generation.torch_step(state.loaded.module, layout), layout, golden, workload.compared_tokens
            )
    path = state.out / generation.WORKLOAD_FILE
    generation.save_workload_data(path, prompts, np.stack(golden), reference)
    return path


class Generate(Step):
    name = "generate"
    needs = ("artifact", "artifact_info", "golden", "engine")
    needs_at_build = ("workload_file",)
    adds = ("generation",)

    def run(self, state: BuildState) -> str | None:
        setup = state.setup
        if state.opened is not None:
            opened = state.opened.workload()
            if opened is None or opened[0].kind != "generate":
                state.generation = None
                return f"the build's workload is {'forward' if opened is None else opened[0].kind}"
            workload, layout, data = opened
        else:
            workload = setup.project.workload
            if workload.kind != "generate":
                state.generation = None
                return f"the project's workload is {workload.kind}"
            layout = graph_layout(setup.project.inputs, workload)
            data = state.workload_file  # the record step wrote it while the torch model was loaded
        # read and checked before any process is started: a bad file is one line, not a child's traceback
        _, _, reference = generation.load_workload_data(data, layout, workload)
        settings = state.settings
        artifact = state.artifact
        base = {
            "target": artifact.target,
            "artifact_dir": str(artifact.directory),
            "main_file": artifact.main_file,
            "options": setup.target.options.model_dump(mode="json"),
            **generation.request_fields(workload, layout, data),
        }
        results = []
        with state.ui.step(
            f"generate: {len(workload.prompt_lengths)} prompt lengths × {workload.trials} trials × "
            f"{workload.new_tokens} tokens, in fresh processes"
        ):
            for r in range(settings.repeats):
                state.ui.detail(f"generation: process {r + 1}/{settings.repeats}")
                results.append(run_child({**base, "want_tokens": r == 0}, timeout_s=1800))
        state.generation = generation.summarize(
            results, workload, layout, reference, state.artifact_info.bytes, settings.confidence
        )
        if not setup.emulated and undecided(judge_generation(setup.profile.budgets, state.generation, settings, None)):
            with state.ui.step(f"generate: a timing budget is inconclusive, {settings.repeats} processes more"):
                for r in range(settings.repeats):
                    state.ui.detail(f"generation: process {settings.repeats + r + 1}/{2 * settings.repeats}")
                    results.append(run_child({**base, "want_tokens": False}, timeout_s=1800))
            state.generation = generation.summarize(
                results, workload, layout, reference, state.artifact_info.bytes, settings.confidence
            )
            state.generation.notes.append("a timing budget was inconclusive; sampling was doubled once")
        if setup.emulated:
            state.generation.notes.append(f"emulated: {setup.emulated}; timings not judged")
        return None

    def report(self, state: BuildState) -> dict[str, object]:
        return {"workload": state.generation.to_json()} if state.generation is not None else {}
