"""`[workload] kind = "transcribe"`: an encoder-decoder speech model (Whisper) as it is deployed: the encoder once over
a clip's features, its output projected into every decoder layer's cross-attention keys and values there, then the
decoder token by token over its own cache and that cross cache.

The build's main graph is the decoder step (exporters/encoder_decoder.py): quantized with the sensitivity loop's
machinery, timed per call at the last position, checked for parity on golden decode steps. The encoder is its
companion graph (core/workload.Companion): exported and verified with it (greedy decoding through both graphs against
torch, clip by clip), quantized by the first plan of its own architecture, compiled by the same target into the
artifact's `encoder/` folder. The loop, in fresh processes: the encoder, time to first token, time per token, each
clip length end to end with its real-time factor, cold start, the memory split with both caches, greedy agreement with
torch on the golden clips. A build records workload.npz (the clips and torch's tokens); a check replays it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tapeout.core.decoding import agreement
from tapeout.core.errors import BadInput
from tapeout.core.profile_schema import Profile
from tapeout.core.schemas import Project, TranscribeWorkload
from tapeout.core.speech import INPUT_FEATURES, SpeechLayout, pad_tokens
from tapeout.core.workload import WORKLOAD_FILE, Companion, SearchMetric, Workload
from tapeout.measurement import transcription, transcripts
from tapeout.measurement.measure import artifact_request, measure_loop
from tapeout.measurement.verdicts import judge_transcription, undecided
from tapeout.reports import transcription as report
from tapeout.targets.base import SpeechDecoder

if TYPE_CHECKING:  # annotations only: the steps hand the state in
    from tapeout.steps.state import BuildState

ENCODER = "encoder"
ENCODER_FILE = "encoder.onnx"  # beside the decoder step's model.onnx in the export folder
MAX_CLIPS = 10_000  # items read from a clips callable before it is taken to have no more
WEIGHT_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


def _layout(project: Project) -> SpeechLayout:
    """The layout the load step found in the model, kept with the graph project's settings."""
    layout = project.workload.layout
    if layout is None:
        raise RuntimeError("internal: the transcribe workload's layout is read before the load step found it")
    return layout


class Transcribe(Workload):
    kind = "transcribe"
    settings = TranscribeWorkload
    carries = "the decoder's self-attention cache grows every token"
    loop_name = "transcription"
    heading = "Transcription"
    call_scope = ": one decoder step at max_target"
    example_budgets = (
        "# encoder_ms = 200              # the encoder over one clip, p90",
        "# ttft_ms = 250                 # features to the first token, p90",
        "# tpot_p90_ms = 10              # each later token, p90",
        "# real_time_factor = 0.1        # a clip's transcription over its length, p90 at the worst length",
        "# greedy_min_agreement = 0.95   # share of torch's greedy tokens reproduced",
    )

    example_data = (
        "# Optional: the golden clips greedy agreement is judged on (default: seeded random features).",
        '# clips = "audio.py:clips"      # in [workload]: log-mel features [mel_bins, frames], one array a clip',
    )

    def check_project(self, project: Project) -> None:
        """The encoder is fed one clip's log-mel features: one float32 input [1, mel_bins, frames]."""
        spec = project.inputs[0]
        if len(project.inputs) != 1 or spec.dtype != "float32" or len(spec.shape) != 3:
            got = ", ".join(f"{s.name} {s.dtype} {list(s.shape)}" for s in project.inputs)
            raise ValueError(
                '[workload] kind = "transcribe" takes one [[inputs]] entry, the encoder\'s features (float32, shape '
                f"[1, mel_bins, frames]); got {got}. tapeout adds the decoder's inputs itself"
            )
        if project.workload.transcripts is not None and project.workload.clips is None:
            raise ValueError(
                "[workload] transcripts are what is said in the golden clips, and the project gives no clips: set "
                'clips = "file.py:callable" (the clips\' log-mel features) beside them'
            )
        if project.evaluation is not None:
            raise ValueError(
                "[evaluation] is not run on a transcribe workload: its accuracy is greedy agreement with the torch "
                "model over the golden clips (budget greedy_min_agreement)"
            )

    def user_callables(self, project: Project) -> dict[str, str]:
        named = {"clips": project.workload.clips, "transcripts": project.workload.transcripts}
        return {name: ref for name, ref in named.items() if ref}

    def calibration_feeds_inputs(self, project: Project) -> bool:
        return False  # nothing calibrates the decoder step's activations (check_quantization refuses those methods)

    def check_profile(self, project: Project, profile: Profile, target: Any) -> None:
        """Enough samples to bound each budget's percentile: the encoder and TTFT have one per timed clip, the time
        per token one per decode step."""
        super().check_profile(project, profile, target)
        if target.static_decode():
            raise BadInput(
                f"target '{profile.target}' (profile {profile.name}) decodes through graphs of static shapes, and no "
                "static-cache decoder over a cross cache is built for a transcribe workload: its self cache grows "
                "every token",
                fix='build it for a device that runs dynamic shapes (OpenVINO: [options] device = "CPU" or '
                '"GPU"; ONNX Runtime CPU or CUDA)',
            )
        workload, budgets, check = project.workload, profile.budgets, profile.check
        if budgets.max_wer is not None and workload.transcripts is None:
            raise BadInput(
                f"budget max_wer = {budgets.max_wer:g} needs what is said in the golden clips, and "
                f"{project.file.name} has no [workload] transcripts",
                fix='add transcripts = "file.py:callable" (one string a clip, in the order of clips), or drop max_wer',
            )
        clips = workload.trials * len(workload.audio_s) * check.repeats
        steps = check.repeats * workload.trials * sum(workload.tokens(s) - 1 for s in workload.audio_s)
        self.check_samples(
            project,
            profile,
            (
                ("encoder_ms", 0.9, clips, "[workload] trials × clip lengths × check.repeats"),
                ("ttft_ms", 0.9, clips, "[workload] trials × clip lengths × check.repeats"),
                ("real_time_factor", 0.9, workload.trials * check.repeats, "[workload] trials × check.repeats"),
                ("tpot_p90_ms", 0.9, steps, "the timed decode steps"),
                ("tpot_p99_ms", 0.99, steps, "the timed decode steps"),
            ),
        )

    def load(self, state: BuildState, loaded: Any) -> Any:
        """The model as its two graphs' modules, checked against the project before anything is built: the declared
        features match the encoder's, every clip length fits it, the caches fit the device. From here on the project
        is the decoder step's."""
        from tapeout.exporters import encoder_decoder

        project = state.setup.project
        if loaded.kind != "torch":
            raise BadInput(
                f'[workload] kind = "transcribe" exports the encoder and the decoder step from the torch model, and '
                f'[model] source = "{project.model.source}" is ONNX',
                fix="point [model] source at a Hugging Face Whisper directory or a file.py:callable with the "
                "encoder-decoder signature",
            )
        if state.setup.profile.pruning is not None:
            raise BadInput(
                "[pruning] does not run on a transcribe workload (it prunes one forward call)",
                fix="remove [pruning] from the profile",
            )
        parts = encoder_decoder.parts_of(loaded.module, project.model.source)
        layout = SpeechLayout.from_module(parts)
        _check_against(project, layout)
        _fits(state, parts, layout)
        settings = project.workload.model_copy()
        settings._layout = layout
        # read and checked before the export; the export, golden and record steps take theirs from here
        settings._clips = golden_clips(project, layout, max(settings.agreement_clips, project.golden_samples))
        if settings.transcripts is not None:  # read and checked before anything is built
            settings._said = transcripts.read(project, settings.agreement_clips)
            settings._tokenizer = transcripts.tokenizer_directory(loaded.module, settings.transcripts)
        graph = project.model_copy(
            update={
                "inputs": layout.decoder_inputs(layout.source),
                "dims": {"batch": 1, "seq": 1, "past_len": layout.max_target - 1},
                "calibration": None,
                "workload": settings,
            }
        )
        state.setup = dataclasses.replace(state.setup, project=graph)
        state.ui.note(
            f"transcribe: encoder over {layout.mel_bins} × {layout.frames} features, {layout.layers} decoder layers "
            f"× {layout.heads} heads × {layout.head_dim}, vocabulary {layout.vocab}; caches "
            f"{layout.self_cache_bytes() / 2**20:.1f} MB (self, at max_target {layout.max_target}) + "
            f"{layout.cross_cache_bytes(layout.source) / 2**20:.1f} MB (cross, {layout.source} positions)"
        )
        return dataclasses.replace(
            loaded, module=encoder_decoder.decoder_step(parts, layout), output_names=["logits", *layout.present()]
        )

    def export_dims(self, project: Project) -> dict[str, int]:
        """Small shapes to trace at, none equal to another (a start of several tokens and a cache of a few): the
        verification by decoding covers real lengths."""
        return {"batch": 1, "seq": 2, "past_len": 3}

    def verify_export(self, project: Project, module: Any, path: Path, options: Any, ui: Any) -> tuple[Any, Any]:
        """The encoder exported beside the decoder step, then greedy decoding of the golden clips through both graphs
        checked against torch step by step; torch's tokens on those clips are the record step's reference."""
        from tapeout.exporters import encoder_decoder, torch_onnx
        from tapeout.exporters.sources import LoadedModel

        layout, workload = module.layout, project.workload
        encoder = LoadedModel("torch", "encoder", module=module.parts.encoder, output_names=layout.cross())
        with ui.step(f"export the encoder ({layout.mel_bins} × {layout.frames} features)"):
            torch_onnx.export(
                encoder,
                layout.encoder_inputs(),
                {"batch": 1},
                path.parent / ENCODER_FILE,
                _encoder_tolerance(encoder, layout, options),
                log=ui.note,
                stage=ui.detail,
            )
        clips, _ = golden_clips(project, layout, workload.agreement_clips)
        with ui.step(
            f"verify both graphs: {len(clips)} clips × up to {workload.agreement_tokens} greedy tokens against torch"
        ):
            verified = encoder_decoder.verify(
                module.parts,
                path.parent / ENCODER_FILE,
                path,
                layout,
                clips,
                workload.agreement_tokens,
                (options.atol, options.rtol),
                progress=lambda done, total: ui.progress(done, total, "clips"),
            )
        return verified, verified.reference_tokens

    def companions(self, state: BuildState) -> list[Companion]:
        layout = _layout(state.setup.project)
        return [Companion(ENCODER, state.out / "export" / ENCODER_FILE, layout.encoder_inputs(1))]

    def golden_inputs(self, state: BuildState) -> tuple[list, str]:
        """One decoder step each at the last position: the cross cache from a golden clip, the self cache full."""
        from tapeout.exporters import encoder_decoder

        project = state.setup.project
        layout = _layout(project)
        clips, source = golden_clips(project, layout, project.golden_samples)
        feeds = encoder_decoder.golden_feeds(state.loaded.module.parts, layout, clips, project.seed)
        return feeds, f"one decoder step at position {layout.max_target - 1} over the cross cache of {source}"

    def record(self, state: BuildState) -> Path:
        """workload.npz: each clip length's timed features, the golden clips and torch's greedy tokens on them (the
        export's verification made them; made again where the export came from the cache without them)."""
        from tapeout.exporters import encoder_decoder

        project = state.setup.project
        layout, workload = _layout(project), project.workload
        golden, _ = golden_clips(project, layout, workload.agreement_clips)
        made = state.exported.greedy_tokens
        if made is not None and made.shape == (len(golden), workload.agreement_tokens):
            reference = made
        else:
            with state.ui.step(f"reference greedy tokens: {len(golden)} clips (torch)"):
                reference = encoder_decoder.reference_tokens(
                    state.loaded.module.parts, layout, golden, workload.agreement_tokens
                )
        timing = np.stack([_cut(golden[i % len(golden)], workload.frames(s)) for i, s in enumerate(workload.audio_s)])
        path = state.out / WORKLOAD_FILE
        transcription.save_workload_data(path, timing, np.stack(golden), reference)
        return path

    def search_metric(self, state: BuildState, call_of) -> SearchMetric | None:
        """Greedy agreement with torch over the golden clips, where the profile budgets it: each candidate decoder
        step decodes every clip over the cross caches of the build's own encoder (already at its precision), so the
        loop judges what the artifact will decode."""
        budgets = state.setup.profile.budgets
        if budgets.greedy_min_agreement is None and budgets.max_wer is None:
            return None
        project = state.setup.project
        layout, workload = _layout(project), project.workload
        _, golden, reference = transcription.load_workload_data(state.out / WORKLOAD_FILE, layout, workload)
        encoder = transcription.encoder_call(call_of(state.companions[ENCODER]), layout)
        crosses: list[list[np.ndarray]] = []

        def decode(predict) -> np.ndarray:
            if not crosses:  # once: every candidate shares the encoder
                crosses.extend(encoder(clip) for clip in golden)
            return np.asarray(
                [
                    pad_tokens(
                        transcription.transcribe(
                            lambda _, c=cross: c, SpeechDecoder(predict, layout), clip, workload.agreement_tokens, True
                        ),
                        workload.agreement_tokens,
                        layout.eos,
                    )
                    for clip, cross in zip(golden, crosses, strict=True)
                ]
            )

        if budgets.max_wer is not None:  # what users judge a transcript by, where the project says what is said
            limit, texts = budgets.max_wer, transcripts.Texts(workload.tokenizer)
            return SearchMetric(
                "word error rate",
                lambda predict: transcription.wer(workload.said, texts(decode(predict), layout.eos)),
                lambda wer: (wer, wer <= limit),
                f" (against [workload] transcripts on {len(golden)} golden clips, budget ≤ {limit:g})",
            )
        limit = budgets.greedy_min_agreement
        return SearchMetric(
            "greedy agreement",
            lambda predict: agreement(reference, decode(predict))[0],
            lambda share: (1.0 - share, share >= limit),
            f" (torch's greedy tokens on {len(golden)} golden clips, budget ≥ {limit:g})",
        )

    def check_quantization(self, method: str, needs_calibration: bool) -> None:
        if needs_calibration:
            raise BadInput(
                f"{method} quantization calibrates activations, and a transcribe workload's decoder step has no "
                "calibration samples",
                fix="use a weight-only precision (int4: cpu-int4, openvino-cpu-int4) or ONNX Runtime's dynamic INT8 "
                '(cpu-int8), which need none, or precision = "fp32"',
            )

    def measure(self, state: BuildState) -> transcription.TranscriptionMeasurement:
        from tapeout.core.paths import confined

        setup = state.setup
        workload, layout, data = self.loop_data(state)
        layout = layout or _layout(setup.project)
        _, _, reference = transcription.load_workload_data(data, layout, workload)  # one line, not a child's traceback
        encoder = confined(state.artifact.directory, str(state.artifact.meta.get(f"{ENCODER}_file", "")), "encoder")
        settings = state.settings
        budgets, size = setup.profile.budgets, state.artifact_info.bytes
        # at build, where the project gives transcripts; a check (no project) carries the build's WER verdict
        built = setup.project.workload if setup.project is not None else None
        said = built.said if built is not None else None
        texts = transcripts.Texts(built.tokenizer) if said is not None else None

        def summarize(results) -> transcription.TranscriptionMeasurement:
            m = transcription.summarize(results, workload, layout, reference, size, settings.confidence)
            if texts is not None and m.tokens is not None:
                m.wer = transcription.word_errors(said, texts(reference, layout.eos), texts(m.tokens, layout.eos))
            return m

        return measure_loop(
            {
                **artifact_request(setup.target, state.artifact),
                **transcription.request_fields(workload, layout, data, encoder),
            },
            settings.repeats,
            "want_tokens",
            summarize,
            lambda result: undecided(self.judge(budgets, result, settings, None)),
            state.ui,
            f"transcribe: {len(workload.audio_s)} clip lengths × {workload.trials} trials, in fresh processes",
            setup.emulated,
        )

    def manifest_record(self, state: BuildState) -> dict:
        return {**super().manifest_record(state), "layout": _layout(state.setup.project).to_json()}

    def replay(self, settings: TranscribeWorkload, record: Any, where: Path) -> SpeechLayout:
        try:
            return SpeechLayout.from_json(record.layout)
        except (KeyError, TypeError) as exc:
            raise BadInput(
                f"{where}: workload.layout is malformed ({exc})", fix="restore the build dir as built, or rebuild"
            ) from None

    def child(self, request: dict) -> dict:
        """Both graphs opened (the cold start's first half), the first clip's first token, then the timed loop."""
        from tapeout import targets
        from tapeout.core.artifact import Artifact
        from tapeout.measurement.runner import workload_frame

        layout = SpeechLayout.from_json(request["layout"])
        workload = TranscribeWorkload.model_validate(request["workload"])
        timing, golden, _ = transcription.load_workload_data(Path(request["workload_data"]), layout, workload)
        encoder_file = Path(request["encoder_file"])

        def make(decoder_session):
            encoder = targets.create(request["target"], request["options"]).session(
                Artifact(request["target"], encoder_file.parent, encoder_file.name)
            )
            return (transcription.encoder_call(encoder._run, layout), decoder_session.speech_decoder(layout))

        return workload_frame(
            request,
            make,
            lambda made: transcription.first_clip(*made, timing),
            lambda made: {
                "transcribe": transcription.loop(*made, workload, timing, golden, request.get("want_tokens", False))
            },
        )

    def judge(self, budgets, result, settings, emulated):
        return judge_transcription(budgets, result, settings, emulated)

    def markdown(self, section: dict, emulated: str | None) -> list[str]:
        return report.section(section, emulated)

    def one_line(self, section: dict, estimate: dict | None) -> str:
        return report.one_line(section)

    def diff_figures(self, section: dict, timed: bool) -> dict[str, tuple]:
        return report.diff_figures(section, timed)

    def headline(self, section: dict, emulated: str | None) -> dict | None:
        return report.headline(section, emulated)

    def headline_cell(self, headline: dict) -> str:
        return report.headline_cell(headline)

    def rank(self, headline: dict) -> tuple[float, str]:
        return headline["rtf_p50"], "real-time factor p50"


def _encoder_tolerance(encoder, layout: SpeechLayout, options):
    """The export's options for the encoder's own check on random features: its keys and values within 0.1 % of their
    largest magnitude where that is above the project's atol. An attention over 1500 positions sums in another order
    in each runtime; what counts is the logits through both graphs, which the greedy decoding after it checks at the
    project's tolerance."""
    import dataclasses

    from tapeout.core.feeds import random_feeds
    from tapeout.exporters import torch_onnx

    feeds = random_feeds(layout.encoder_inputs(1), {}, np.random.default_rng(options.seed))
    outputs = torch_onnx.torch_outputs(encoder.module, feeds, [INPUT_FEATURES], layout.cross())
    scale = max(float(np.abs(v).max()) for v in outputs.values())
    return dataclasses.replace(options, atol=max(options.atol, 1e-3 * scale))


def _check_against(project: Project, layout: SpeechLayout) -> None:
    """The declared features are the encoder's, and every clip length and its tokens fit the model."""
    workload: TranscribeWorkload = project.workload
    spec = project.inputs[0]
    declared = [project.dims.get(d, d) if isinstance(d, str) else d for d in spec.shape]
    if declared[1:] != [layout.mel_bins, layout.frames] or declared[0] != 1:
        raise BadInput(
            f"[[inputs]] {spec.name} is {declared}, and the model's encoder takes [1, {layout.mel_bins}, "
            f"{layout.frames}] (mel bins × frames)",
            fix=f'declare shape = [1, {layout.mel_bins}, {layout.frames}] for "{spec.name}"',
        )
    longest = layout.frames * workload.frame_ms / 1000
    too_long = [s for s in workload.audio_s if workload.frames(s) > layout.frames]
    if too_long:
        raise BadInput(
            f"[workload] audio_s {too_long} is longer than the encoder takes: {layout.frames} frames × "
            f"{workload.frame_ms:g} ms = {longest:g} s",
            fix=f"time clips of at most {longest:g} s, or export the encoder for longer audio",
        )
    room = layout.max_target - len(layout.start_ids)
    if workload.agreement_tokens > room:
        raise BadInput(
            f"[workload] agreement_tokens = {workload.agreement_tokens} is more than the decoder holds after its "
            f"{len(layout.start_ids)} start tokens (max_target {layout.max_target})",
            fix=f"set agreement_tokens to at most {room}",
        )
    many = [s for s in workload.audio_s if workload.tokens(s) > room]
    if many:
        raise BadInput(
            f"[workload] audio_s {many} at tokens_per_s = {workload.tokens_per_s:g} decodes more tokens than the "
            f"decoder holds ({room} after the start tokens)",
            fix="lower tokens_per_s or the clip lengths",
        )


def _fits(state: BuildState, parts, layout: SpeechLayout) -> None:
    """Before building: both graphs' weights at the profile's precision plus both caches against the device's memory
    (the device spec's, else the building machine's)."""
    import psutil

    setup = state.setup
    params = sum(p.numel() for p in parts.parameters()) if hasattr(parts, "parameters") else 0
    weights = params * WEIGHT_BYTES.get(setup.profile.precision, 4.0)
    caches = layout.self_cache_bytes() + layout.cross_cache_bytes(layout.source)
    if setup.device is not None:
        memory, where = (
            setup.device.memory_gb.value * 1e9,
            f"device {setup.device.name}'s {setup.device.memory_gb.value:g} GB",
        )
    else:
        total = psutil.virtual_memory().total
        memory, where = float(total), f"the building machine's {total / 1e9:.1f} GB"
    if weights + caches > memory:
        raise BadInput(
            f"the model and its caches cannot fit: {params / 1e6:.1f} M parameters at {setup.profile.precision} "
            f"({weights / 1e9:.2f} GB) + self and cross caches ({caches / 1e9:.2f} GB) = "
            f"{(weights + caches) / 1e9:.2f} GB > {where}",
            fix="pick a lower precision, a smaller model or a larger device",
        )


def golden_clips(project: Project, layout: SpeechLayout, count: int) -> tuple[list[np.ndarray], str]:
    """`count` clips' features [mel_bins, frames]: from [workload] clips (each padded to the encoder's frames with the
    silence Whisper's feature extractor pads with), else seeded random features."""
    workload: TranscribeWorkload = project.workload
    if workload.read_clips is not None and len(workload.read_clips[0]) >= count:
        clips, source = workload.read_clips
        return clips[:count], source
    shape = (layout.mel_bins, layout.frames)
    if workload.clips is None:
        rng = np.random.default_rng(project.seed)
        return [rng.standard_normal(shape).astype(np.float32) * 0.5 for _ in range(count)], "random features (seeded)"
    from tapeout.core.user_code import resolve_callable, user_code

    source = resolve_callable(workload.clips, project.root, "[workload] clips")
    items = []
    with user_code(f"[workload] clips {workload.clips}", project.root):
        for item in source():
            items.append(np.asarray(item))
            if len(items) >= min(count, MAX_CLIPS):
                break
    clips = []
    for i, array in enumerate(items):
        if array.ndim != 2 or array.shape[0] != layout.mel_bins or not np.issubdtype(array.dtype, np.floating):
            raise BadInput(
                f"[workload] clips {workload.clips}: item {i} is {array.dtype} {list(array.shape)}, not float "
                f"features [{layout.mel_bins}, frames]",
                fix=f"return log-mel features of {layout.mel_bins} bins, one 2-D array a clip",
            )
        if array.shape[1] > layout.frames:
            raise BadInput(
                f"[workload] clips {workload.clips}: item {i} has {array.shape[1]} frames, more than the encoder "
                f"takes ({layout.frames} = {layout.frames * workload.frame_ms / 1000:g} s of audio)",
                fix=f"cut the audio to {layout.frames * workload.frame_ms / 1000:g} s (Whisper transcribes longer "
                "audio window by window)",
            )
        if not np.isfinite(array).all():
            raise BadInput(
                f"[workload] clips {workload.clips}: item {i} holds NaN or infinity", fix="check the features"
            )
        clips.append(_cut(array.astype(np.float32), array.shape[1], layout.frames))
    if len(clips) < count:
        raise BadInput(
            f"[workload] clips {workload.clips} gave {len(clips)} clips; {count} are needed",
            fix=f"return at least {count} clips, or lower agreement_clips (and the project's golden_samples)",
        )
    return clips, f"[workload] clips {workload.clips}"


# Whisper's log-mel features are log10 power clipped 8 below the clip's peak, then scaled by 1/4: the silence its
# feature extractor pads a clip with to 30 s is the clip's peak less 2
WHISPER_FLOOR_BELOW_PEAK = 2.0


def _cut(features: np.ndarray, frames: int, total: int | None = None) -> np.ndarray:
    """The first `frames` frames of `features`, the rest up to `total` (default: its own length) the silence Whisper's
    feature extractor pads with (the floor below those frames' peak)."""
    total = total or features.shape[1]
    kept = features[:, :frames]
    out = np.full((features.shape[0], total), kept.max() - WHISPER_FLOOR_BELOW_PEAK, np.float32)
    out[:, : min(frames, features.shape[1])] = features[:, :frames]
    return out


WORKLOAD = Transcribe()
