"""`[workload] kind = "generate"`: prefill a prompt, then decode token by token over the KV cache. The decoder is
wrapped as its cache graph at load (exporters/generation.py), verified by greedy decoding at export, and measured on
the target in fresh processes: time to first token per prompt length, time per output token, tokens per second,
cold start, the memory split with the KV cache at max_context, and greedy agreement with the torch reference on the
golden prompts. A build records workload.npz (the prompts and the reference's greedy tokens, `make_workload_data`);
a check replays it, verified against the manifest."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tapeout.core.decoding import CacheLayout, graph_layout
from tapeout.core.errors import BadInput
from tapeout.core.profile_schema import Profile
from tapeout.core.schemas import GenerateWorkload, Project
from tapeout.core.workload import WORKLOAD_FILE, Workload
from tapeout.measurement import generation
from tapeout.measurement.measure import artifact_request, measure_loop
from tapeout.measurement.verdicts import judge_generation, undecided
from tapeout.reports import generation as report

if TYPE_CHECKING:  # annotations only: the steps hand the state in
    from tapeout.measurement.generation import GenerationMeasurement
    from tapeout.steps.state import BuildState


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
    path = state.out / WORKLOAD_FILE
    generation.save_workload_data(path, prompts, np.stack(golden), reference)
    return path


class Generate(Workload):
    kind = "generate"
    settings = GenerateWorkload
    carries = "the KV cache grows every token"
    loop_name = "generation"
    heading = "Generation"
    call_scope = ": one decode step at the maximum context"
    example_budgets = (
        "# ttft_ms = 200                 # first token at the longest prompt, p90",
        "# tpot_p90_ms = 20              # each later token, p90",
        "# kv_cache_mb = 64",
        "# greedy_min_agreement = 0.5    # share of torch's greedy tokens reproduced",
    )

    def check_project(self, project: Project) -> None:
        """A decoder is fed token ids: one integer input [batch, sequence]; tapeout adds the KV cache around it."""
        if (
            len(project.inputs) != 1
            or project.inputs[0].dtype not in ("int64", "int32")
            or len(project.inputs[0].shape) != 2
        ):
            got = ", ".join(f"{s.name} {s.dtype} {list(s.shape)}" for s in project.inputs)
            raise ValueError(
                f'[workload] kind = "generate" takes one [[inputs]] entry, the token ids (int64, shape '
                f"[batch, sequence]); got {got}. tapeout adds the KV-cache inputs itself"
            )

    def user_callables(self, project: Project) -> dict[str, str]:
        return {"prompts": project.workload.prompts} if project.workload.prompts else {}

    def calibration_feeds_inputs(self, project: Project) -> bool:
        return False  # [calibration] holds prompts; the decoder's inputs become the cache graph's at load

    def check_profile(self, project: Project, profile: Profile, target: Any) -> None:
        """A generate workload's budgets need enough samples to bound their percentile, as the latency budgets do: TTFT
        has one sample per timed generation per process, the time per token one per decode step."""
        super().check_profile(project, profile, target)
        workload, check = project.workload, profile.check
        generations = workload.trials * check.repeats
        steps = generations * (workload.new_tokens - 1) * len(workload.prompt_lengths)
        each = "trials × (new_tokens - 1) × prompt lengths × check.repeats"
        self.check_samples(
            project,
            profile,
            (
                ("ttft_ms", 0.9, generations, "[workload] trials × check.repeats"),
                ("tpot_p90_ms", 0.9, steps, each),
                ("tpot_p99_ms", 0.99, steps, each),
            ),
        )

    def load(self, state: BuildState, loaded: Any) -> Any:
        """A generate workload: the decoder wrapped as the KV-cache graph, checked to fit the device at the declared
        context before anything is built, and the project from here on described as that graph's inputs."""
        from tapeout.exporters import generation as export_generation

        project = state.setup.project
        if loaded.kind != "torch":
            raise BadInput(
                f'[workload] kind = "generate" exports the decoder with its KV cache, and [model] source = '
                f'"{project.model.source}" is ONNX',
                fix="point [model] source at the torch decoder "
                '(file.py:callable or a Hugging Face causal-LM directory), or use kind = "forward"',
            )
        if state.setup.profile.pruning is not None:
            raise BadInput(
                "[pruning] does not run on a generate workload yet (it prunes one forward call)",
                fix='remove [pruning] from the profile, or use [workload] kind = "forward"',
            )
        target = state.setup.target
        masked = target.static_decode()
        if masked and project.workload.batch != 1:
            raise BadInput(
                f"profile '{state.setup.profile.name}' decodes through graphs of static shapes, built for one "
                f"sequence at a time, and [workload] batch = {project.workload.batch}",
                fix="set [workload] batch = 1",
            )
        decoder = export_generation.decoder_of(loaded.module, project.model.source, masked, target.name)
        layout = export_generation.layout_of(decoder, project.workload, project.model.source, masked)
        _fits(state, decoder, layout)
        loaded = dataclasses.replace(
            loaded, module=export_generation.cache_graph(decoder, masked), output_names=layout.outputs()
        )
        state.setup = dataclasses.replace(state.setup, project=export_generation.graph_project(project, layout))
        state.ui.note(
            f"generate: {layout.layers} layers, {layout.kv_heads} KV heads × {layout.head_dim}, vocabulary "
            f"{layout.vocab}; KV cache {layout.kv_bytes(layout.max_context, project.workload.batch) / 2**20:.1f} MB "
            f"at max_context {layout.max_context}"
        )
        return loaded

    def export_dims(self, project: Project) -> dict[str, int]:
        from tapeout.exporters import generation as export_generation

        return export_generation.export_dims(project)

    def verify_export(self, project: Project, module: Any, path: Path, options: Any, ui: Any) -> tuple[Any, Any]:
        """Greedy decoding through the exported graph checked against the decoder's plain forward on the workload's
        golden prompts (the agreement prompts, at the shortest measured length) for the tokens agreement compares:
        the cache, the positions and the mask checked over real lengths, and the torch model's greedy tokens on those
        prompts made on the way (the record step's reference)."""
        from tapeout.exporters import generation as export_generation

        workload = project.workload
        layout = graph_layout(project.inputs, workload)
        prompts, _ = export_generation.prompt_tokens(
            project, layout, workload.agreement_prompts, min(workload.prompt_lengths)
        )
        with ui.step(
            f"verify the KV-cache graph: {workload.agreement_prompts} prompts × "
            f"{workload.compared_tokens} greedy tokens against torch"
        ):
            return export_generation.verify(
                module.inner,
                path,
                layout,
                prompts,
                workload.compared_tokens,
                options.atol,
                options.rtol,
                progress=lambda done, total: ui.progress(done, total, "prompts"),
            )

    def phases(self, state: BuildState) -> list:
        from tapeout.estimation import generation as priced

        project = state.setup.project
        with state.ui.step(
            "kernel structure of each phase of the generation loop (prefill per prompt length, decode steps)"
        ):
            return priced.structures(
                state.fp32_model, project.inputs, project.dims, project.workload, state.kernels, state.ui
            )

    def reference_metric(self, state: BuildState) -> float | None:
        """The torch decoder's plain forward over whole sequences (exporters/generation.plain_forward), the model as
        trained; an artifact's metric still goes through its cache. Load has made every generate source the torch
        cache graph (an ONNX source and [pruning] are refused there); a teacher, were pruning ever allowed here,
        would stay the reference."""
        if state.teacher is not None:
            return None
        from tapeout.core.metric import evaluate
        from tapeout.exporters import generation as export_generation

        return evaluate(state.setup.project, export_generation.plain_forward(state.loaded.module), through_cache=False)

    def reference_how(self, state: BuildState) -> str:
        return " (torch, each sequence in one call)" if state.teacher is None else ""

    def metric_predict(self, project: Project, predict: Any) -> Any:
        """The metric sees full-sequence logits, computed through the cache."""
        from tapeout.core.decoding import teacher_forced

        return teacher_forced(predict, graph_layout(project.inputs, project.workload))

    def golden_inputs(self, state: BuildState) -> tuple[list, str]:
        """A generate workload's golden inputs: one decode step each at the maximum context, its cache filled by the
        torch decoder from a prompt (the project's prompts where they are long enough, else seeded random tokens)."""
        from tapeout.core.decoding import graph_layout
        from tapeout.core.errors import BadInput
        from tapeout.exporters import generation as export_generation

        project = state.setup.project
        layout = graph_layout(project.inputs, project.workload)
        try:
            sequences, source = export_generation.prompt_tokens(
                project, layout, project.golden_samples, layout.max_context
            )
        except BadInput:
            if project.workload.prompts is None:
                raise
            state.ui.note(
                f"[workload] prompts has fewer than {project.golden_samples} sequences of max_context "
                f"({layout.max_context}) tokens: the golden decode steps start from random tokens"
            )
            project = project.model_copy(update={"workload": project.workload.model_copy(update={"prompts": None})})
            sequences, source = export_generation.prompt_tokens(
                project, layout, project.golden_samples, layout.max_context
            )
        feeds = export_generation.decode_feeds(
            export_generation.torch_step(state.loaded.module, layout), layout, sequences, project.workload.batch
        )
        return feeds, f"one decode step at position {layout.max_context - 1} after {source}"

    def record(self, state: BuildState) -> Path:
        return make_workload_data(state, graph_layout(state.setup.project.inputs, state.setup.project.workload))

    def scorer(self, target: Any) -> Any:
        return target.scorer()

    def scored_by_own_loop(self, target: Any) -> bool:
        return target.static_decode()

    def check_quantization(self, method: str, needs_calibration: bool) -> None:
        if needs_calibration:
            # [calibration] holds prompts; the graph quantized is one cache step, whose activations nothing samples
            raise BadInput(
                f"{method} quantization calibrates activations, and a generate workload's cache graph has "
                "no calibration samples yet",
                fix="use a weight-only precision (int4: cpu-int4, "
                "openvino-cpu-int4), ONNX Runtime's dynamic INT8 (cpu-int8), which need none, or on the HTP "
                'precision = "fp32" (it runs FP16 there)',
            )

    def measure(self, state: BuildState) -> GenerationMeasurement:
        setup = state.setup
        workload, layout, data = self.loop_data(state)
        layout = layout or graph_layout(setup.project.inputs, workload)  # a build's: its project is the cache graph
        # read and checked before any process is started: a bad file is one line, not a child's traceback
        _, _, reference = generation.load_workload_data(data, layout, workload)
        settings = state.settings
        budgets, size = setup.profile.budgets, state.artifact_info.bytes
        return measure_loop(
            {**artifact_request(setup.target, state.artifact), **generation.request_fields(workload, layout, data)},
            settings.repeats,
            "want_tokens",
            lambda results: generation.summarize(results, workload, layout, reference, size, settings.confidence),
            lambda result: undecided(self.judge(budgets, result, settings, None)),
            state.ui,
            f"generate: {len(workload.prompt_lengths)} prompt lengths × {workload.trials} trials × "
            f"{workload.new_tokens} tokens, in fresh processes",
            setup.emulated,
        )

    def manifest_record(self, state: BuildState) -> dict:
        return {**super().manifest_record(state), "layout": state.loop.layout.to_json() if state.loop else None}

    def replay(self, settings: GenerateWorkload, record: Any, where: Path) -> CacheLayout:
        try:
            return CacheLayout.from_json(record.layout)
        except (KeyError, TypeError) as exc:
            raise BadInput(
                f"{where}: workload.layout is malformed ({exc})", fix="restore the build dir as built, or rebuild"
            ) from None

    def child(self, request: dict) -> dict:
        """A generate workload: cold start (the runtime opened + the first token), the timed generation loop, the golden prompts'
        greedy tokens, and the memory with the cache filled to max_context (measurement/generation.py)."""
        from tapeout.measurement.runner import workload_frame

        layout = CacheLayout.from_json(request["layout"])
        workload = GenerateWorkload.model_validate(
            {k: v for k, v in request["workload"].items() if k != "compared_tokens"}
        )
        prompts, agreement_prompts, _ = generation.load_workload_data(Path(request["workload_data"]), layout, workload)
        return workload_frame(
            request,
            lambda session: session.decoder(layout),
            lambda decoder: generation.first_token(decoder, prompts),
            lambda decoder: {
                "generate": generation.loop(
                    decoder, layout, request["workload"], prompts, agreement_prompts, request.get("want_tokens", False)
                )
            },
        )

    def judge(self, budgets, result, settings, emulated):
        return judge_generation(budgets, result, settings, emulated)

    def markdown(self, section: dict, emulated: str | None) -> list[str]:
        return report.section(section, emulated)

    def one_line(self, section: dict, estimate: dict | None) -> str:
        return report.one_line(section, (estimate or {}).get("generation"))

    def html_figure(self, section: dict) -> str:
        from tapeout.reports.html_page import generation_figure

        return generation_figure(section)

    def diff_figures(self, section: dict, timed: bool) -> dict[str, tuple]:
        return report.diff_figures(section, timed)

    def headline(self, section: dict, emulated: str | None) -> dict | None:
        return report.headline(section, emulated)

    def headline_cell(self, headline: dict) -> str:
        return report.headline_cell(headline)

    def rank(self, headline: dict) -> tuple[float, str]:
        return headline["tpot_p50_ms"], "time per token p50"


WEIGHT_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


def _fits(state: BuildState, module, layout) -> None:
    """Before building: the weights at the profile's precision plus the KV cache at max_context against the
    device's memory (the device spec's, else the building machine's). One line naming the numbers when they cannot fit."""
    import psutil

    setup = state.setup
    workload = setup.project.workload
    params = sum(p.numel() for p in module.parameters())
    weights = params * WEIGHT_BYTES.get(setup.profile.precision, 4.0)
    kv = layout.kv_bytes(workload.max_context, workload.batch)
    if setup.device is not None:
        memory, where = (
            setup.device.memory_gb.value * 1e9,
            f"device {setup.device.name}'s {setup.device.memory_gb.value:g} GB",
        )
    else:
        memory, where = (
            float(psutil.virtual_memory().total),
            f"the building machine's {psutil.virtual_memory().total / 1e9:.1f} GB",
        )
    if weights + kv > memory:
        raise BadInput(
            f"the KV cache cannot fit: {params / 1e6:.1f} M parameters at {setup.profile.precision} "
            f"({weights / 1e9:.2f} GB) + KV cache at max_context {workload.max_context} × batch "
            f"{workload.batch} ({kv / 1e9:.2f} GB) = {(weights + kv) / 1e9:.2f} GB > {where}",
            fix="lower [workload] max_context or batch, or pick a lower precision or a larger device",
        )


WORKLOAD = Generate()
