"""The schemas of the files a user writes: the project file (tapeout.toml) and device specs; build profiles are
`core.profile_schema`.

Imports nothing heavy (pydantic and the standard library only): every other module, the
device-side `check` included, depends on this one.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_validator,
)

from tapeout.core.vocabulary import PEAK_FORMATS

DType = Literal["float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool"]


Direction = Literal["higher", "lower"]


# The values an input `range` may take per dtype. Float64's are capped at float32's (a wider range
# overflows uniform sampling); int64's at 2**53, where a range (read as floats) stops being exact.
DTYPE_LIMITS: dict[str, tuple[float, float]] = {
    "float16": (-65504.0, 65504.0),
    "float32": (-3.0e38, 3.0e38),
    "float64": (-3.0e38, 3.0e38),
    "int64": (-(2**53), 2**53),
    "int32": (-(2**31), 2**31 - 1),
    "int8": (-128, 127),
    "uint8": (0, 255),
}


def folder_safe(value: str | None, what: str) -> str | None:
    """A name that becomes a file or folder name (a build dir, a device spec file): never a path."""
    if value is None:
        return value
    if not value or len(value) > 100 or value.startswith(".") or any(c in value for c in "/\\\0"):
        raise ValueError(
            f"{what} {value!r} must be a plain name (no '/', '\\', leading '.', at most 100 "
            "characters): it names a file or folder"
        )
    return value


class _Strict(BaseModel):
    # Unknown fields are errors: a typo in a budget name must not silently drop the budget.
    # NaN and infinity are never a budget, a tolerance, a range or a time: TOML's `inf`/`nan` are refused.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class InputSpec(_Strict):
    """One model input: symbolic dims (strings) become dynamic axes, ints are pinned."""

    name: str = Field(min_length=1)
    shape: list[int | str]
    dtype: DType = "float32"
    range: tuple[float, float] | None = None

    @field_validator("shape")
    @classmethod
    def _dims_valid(cls, shape: list[int | str]) -> list[int | str]:
        for dim in shape:
            if isinstance(dim, int) and dim <= 0:
                raise ValueError(f"dimension {dim} must be a positive integer or a symbolic name")
            if isinstance(dim, str) and not dim.isidentifier():
                raise ValueError(f"symbolic dimension {dim!r} must be an identifier such as 'batch'")
        return shape

    @field_validator("range")
    @classmethod
    def _range_ordered(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not value[0] <= value[1]:
            raise ValueError(
                f"range [{value[0]}, {value[1]}] must be [low, high] with low <= high (inclusive for integers)"
            )
        return value

    @model_validator(mode="after")
    def _range_fits_dtype(self) -> InputSpec:
        # random inputs are drawn in this range and cast to the dtype: both ends must be values of it
        if self.range is None or self.dtype == "bool":
            return self
        low, high = DTYPE_LIMITS[self.dtype]
        too_wide = self.dtype.startswith("float") and self.range[1] - self.range[0] > high
        if not (low <= self.range[0] and self.range[1] <= high) or too_wide:
            raise ValueError(
                f"range [{self.range[0]:g}, {self.range[1]:g}] does not fit {self.dtype} "
                f"(values from {low:g} to {high:g}" + (f", a width of at most {high:g})" if too_wide else ")")
            )
        return self

    def concrete_shape(self, dims: dict[str, int]) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else dims[d] for d in self.shape)


class ModelSection(_Strict):
    source: str = Field(min_length=1, description="path.py:callable, module:callable, HF dir, .pt2 or .onnx")
    name: str | None = Field(None, description="names the model's build dirs in a farm: a plain name")
    outputs: list[str] | None = Field(None, min_length=1, description="names for the model's outputs, in order")

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str | None) -> str | None:
        return folder_safe(value, "[model] name")


class ExportSection(_Strict):
    opset: int | None = Field(None, ge=13, description="default: the newest the installed runtime accepts")
    dynamic: bool = True
    atol: float = Field(1e-4, ge=0)
    rtol: float = Field(1e-3, ge=0)
    samples: int = Field(3, ge=1, le=64, description="random inputs the export is verified on")


class DataSection(_Strict):
    data: str = Field(min_length=1, description=".npz file or module:callable yielding feed dicts")


class EvaluationSection(_Strict):
    metric: str = Field(min_length=1, description="module:callable or path.py:callable taking predict")
    direction: Direction
    name: str = "metric"


class WorkloadSettings(_Strict):
    """`[workload]`: its kind names the workload (core/workload.py), whose own schema extends this one."""

    kind: str


class ForwardWorkload(WorkloadSettings):
    """One call on the declared inputs."""

    kind: Literal["forward"] = "forward"


MAX_CONTEXT = 1_048_576  # tokens: past any deployed context; a larger number is a typo


class GenerateWorkload(WorkloadSettings):
    """Prefill a prompt, then decode token by token over the KV cache (exporters/generation.py)."""

    kind: Literal["generate"]
    prompt_lengths: list[int] = Field(min_length=1, max_length=16, description="prompt lengths to measure, in tokens")
    new_tokens: int = Field(
        32, ge=2, le=65_536, description="tokens generated after each prompt: the first, then at least one decode step"
    )
    max_context: int = Field(
        ge=2,
        le=MAX_CONTEXT,
        description="the most tokens (prompt + generated) the deployment "
        "must hold: the KV cache is sized and its memory judged at this length",
    )
    batch: int = Field(1, ge=1, le=1024, description="sequences decoded together (one prompt length per batch)")
    prompts: str | None = Field(
        None,
        min_length=1,
        description="file.py:callable returning token-id sequences "
        "(1-D integer arrays): the golden prompts greedy agreement is judged on; default: "
        "seeded random tokens",
    )
    agreement_prompts: int = Field(8, ge=1, le=256, description="prompts the greedy tokens are compared on")
    agreement_tokens: int | None = Field(
        None, ge=1, le=65_536, description="greedy tokens compared per prompt (default: new_tokens)"
    )
    trials: int = Field(5, ge=1, le=1000, description="generations per prompt length in each measuring process")
    max_prompt: int | None = Field(
        None,
        ge=1,
        le=MAX_CONTEXT,
        description="the longest prompt the deployment accepts, "
        "for a runtime compiled to static shapes (OpenVINO's NPU pipeline pads every "
        "prompt to it); default: the longest of prompt_lengths",
    )

    @field_validator("prompt_lengths")
    @classmethod
    def _lengths(cls, value: list[int]) -> list[int]:
        if any(n < 1 for n in value):
            raise ValueError(f"prompt_lengths {value}: a prompt is at least 1 token")
        if len(set(value)) != len(value):
            raise ValueError(f"prompt_lengths {value} repeats a length")
        return sorted(value)

    @model_validator(mode="after")
    def _fits_context(self) -> GenerateWorkload:
        longest = max(self.prompt_lengths) + max(self.new_tokens, self.agreement_tokens or 0)
        if longest > self.max_context:
            raise ValueError(
                f"prompt of {max(self.prompt_lengths)} tokens + {max(self.new_tokens, self.agreement_tokens or 0)} "
                f"new tokens = {longest} is longer than max_context = {self.max_context}: shorten the "
                "prompt or new_tokens, or raise max_context"
            )
        if self.max_prompt is not None and not max(self.prompt_lengths) <= self.max_prompt < self.max_context:
            raise ValueError(
                f"max_prompt = {self.max_prompt} must hold the longest prompt measured "
                f"({max(self.prompt_lengths)}) and leave room for a token within max_context = "
                f"{self.max_context}"
            )
        return self

    @property
    def longest_prompt(self) -> int:
        return self.max_prompt or max(self.prompt_lengths)

    @property
    def compared_tokens(self) -> int:
        return self.agreement_tokens or self.new_tokens


class StreamWorkload(WorkloadSettings):
    """Chunk after chunk with state carried: each chunk's state outputs are the next chunk's state inputs
    (measurement/streaming.py). The chunk is the streamed input's declared shape."""

    kind: Literal["stream"]
    state: dict[str, str] = Field(
        min_length=1, description='state input → the output that feeds it on the next chunk, e.g. {h = "h_out"}'
    )
    chunk_input: str | None = Field(
        None,
        min_length=1,
        description="the input the stream arrives on (default: the "
        "first [[inputs]] entry that is neither state nor constant)",
    )
    constant: list[str] = Field(
        default_factory=list,
        description="inputs fed the same value on every chunk (e.g. a sample rate): the first golden sample's value",
    )
    chunks: int = Field(100, ge=2, le=100_000, description="chunks in one stream")
    deadline_ms: float = Field(
        gt=0,
        le=3_600_000,
        description="real time one chunk stands for (e.g. 32 ms of audio): "
        "a chunk slower than this is a deadline miss, and the real-time factor is time over it",
    )
    stream: str | None = Field(
        None,
        min_length=1,
        description="file.py:callable returning the golden stream: an array "
        "[chunks or more, *chunk shape] (or a dict of them per streamed input); default: "
        "seeded random chunks in the input's range",
    )
    initial_state: Literal["zeros"] = Field("zeros", description="the state the first chunk sees")
    trials: int = Field(5, ge=1, le=1000, description="timed streams in each measuring process")

    @field_validator("state")
    @classmethod
    def _one_to_one(cls, value: dict[str, str]) -> dict[str, str]:
        outputs = list(value.values())
        if len(set(outputs)) != len(outputs):
            raise ValueError(f"state {value} feeds two state inputs from one output: each state input needs its own")
        return value


class TranscribeWorkload(WorkloadSettings):
    """An encoder-decoder speech model (Whisper): the encoder once over a clip's features, then the decoder token by
    token over its own cache and the cross-attention cache the encoder's graph computed (exporters/encoder_decoder.py).
    """

    kind: Literal["transcribe"]
    audio_s: list[float] = Field(
        default_factory=lambda: [10.0, 30.0],
        min_length=1,
        max_length=8,
        description="clip lengths timed, in seconds of audio: each is transcribed end to end and its real-time "
        "factor judged; none longer than the encoder's input (Whisper: 30 s)",
    )
    tokens_per_s: float = Field(
        3.0,
        gt=0,
        le=50,
        description="tokens the timed loop decodes per second of audio (speech is about 2 to 4 Whisper tokens a "
        "second): a 10 s clip decodes 30",
    )
    frame_ms: float = Field(10.0, gt=0, le=1000, description="audio per feature frame (Whisper's hop: 10 ms)")
    clips: str | None = Field(
        None,
        min_length=1,
        description="file.py:callable returning the golden clips' features, float32 [mel_bins, frames] each (no "
        "more frames than the encoder takes; fewer are padded as Whisper's feature extractor pads: its floor, the "
        "clip's peak less 2); default: "
        "seeded random features",
    )
    transcripts: str | None = Field(
        None,
        min_length=1,
        description="file.py:callable returning what is said in each golden clip, one string a clip in the order of "
        "`clips`: the word error rate (budget max_wer) of the artifact's greedy transcripts, decoded by the model "
        "directory's tokenizer; needs `clips` and a Hugging Face directory",
    )
    agreement_clips: int = Field(4, ge=1, le=256, description="golden clips greedy agreement is judged on")
    agreement_tokens: int = Field(32, ge=1, le=65_536, description="greedy tokens compared per golden clip at most")
    trials: int = Field(5, ge=1, le=1000, description="timed transcriptions per clip length in each measuring process")
    # the model's two graphs' interface, found at load (core/speech.SpeechLayout); never read from the project file
    _layout: Any = PrivateAttr(default=None)
    # read at load where the project gives transcripts: the texts, and the directory whose tokenizer decodes tokens
    _said: list[str] | None = PrivateAttr(default=None)
    _tokenizer: Any = PrivateAttr(default=None)
    _clips: Any = PrivateAttr(default=None)  # the golden clips as load read them: (features, where from)

    @property
    def layout(self) -> Any:
        return self._layout

    @property
    def said(self) -> list[str] | None:
        return self._said

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def read_clips(self) -> Any:
        return self._clips

    @field_validator("audio_s")
    @classmethod
    def _lengths(cls, value: list[float]) -> list[float]:
        if any(not 0 < s <= 3600 for s in value):
            raise ValueError(f"audio_s {value}: a clip is longer than 0 s and at most an hour")
        if len(set(value)) != len(value):
            raise ValueError(f"audio_s {value} repeats a length")
        return sorted(value)

    def frames(self, seconds: float) -> int:
        """Feature frames of a clip `seconds` long."""
        return round(seconds * 1000 / self.frame_ms)

    def tokens(self, seconds: float) -> int:
        """Tokens the timed loop decodes for a clip `seconds` long: at least the first."""
        return max(1, round(seconds * self.tokens_per_s))


class WorkloadSettingsError(ValueError):
    """A `[workload]` table its kind's schema refused: the refusal is described field by field (core/config)."""

    def __init__(self, error: ValidationError, schema: type[BaseModel]) -> None:
        super().__init__(str(error))
        self.error, self.schema = error, schema


MAX_INPUT_ELEMENTS = 2**31  # one input's elements: 8 GiB of float32, far past any model this runs


class Project(_Strict):
    model: ModelSection
    inputs: list[InputSpec] = Field(min_length=1)
    dims: dict[str, int] = Field(default_factory=dict)
    calibration: DataSection | None = None
    evaluation: EvaluationSection | None = None
    export: ExportSection = ExportSection()
    workload: SerializeAsAny[WorkloadSettings] = Field(default_factory=ForwardWorkload)
    # the model's own budgets, whatever it is built for: a profile that sets the same budget wins
    budgets: Budgets = Field(default_factory=lambda: Budgets())
    golden_samples: int = Field(4, ge=1, le=256)
    seed: int = Field(0, ge=0, lt=2**32, description="numpy's generators take 0 to 2**32 - 1")

    _root: Path = PrivateAttr(default=Path("."))
    _file: Path = PrivateAttr(default=Path("tapeout.toml"))

    @field_validator("workload", mode="before")
    @classmethod
    def _workload_of_its_kind(cls, value: object) -> object:
        """`[workload]` validated by the schema of the workload its kind names."""
        from tapeout.core import workload
        from tapeout.core.errors import BadInput

        if not isinstance(value, dict):
            return value  # a settings object already validated, or what the base schema refuses
        kind = value.get("kind", workload.DEFAULT)
        if not isinstance(kind, str):
            raise ValueError(f"kind {kind!r} is not a workload kind: the kinds are {', '.join(workload.kinds())}")
        try:
            schema = workload.get(kind).settings
        except BadInput as exc:
            raise ValueError(str(exc)) from None
        try:
            return schema.model_validate({"kind": kind, **value})
        except ValidationError as exc:
            raise WorkloadSettingsError(exc, schema) from None

    @model_validator(mode="after")
    def _dims_resolve(self) -> Project:
        names = [spec.name for spec in self.inputs]
        if len(set(names)) != len(names):
            raise ValueError(f"input names must be unique, got {names}")
        for spec in self.inputs:
            for dim in spec.shape:
                if isinstance(dim, str) and dim not in self.dims:
                    raise ValueError(
                        f"input {spec.name!r} uses symbolic dim {dim!r}: give its build value in [dims], e.g. {dim} = 1"
                    )
        for name, value in self.dims.items():
            if value < 1:  # a batch of 0 would build, measure and pass on empty inputs
                raise ValueError(f"[dims] {name} = {value}: a dimension is at least 1")
        from tapeout.core import workload

        workload.of(self).check_project(self)
        for spec in self.inputs:
            elements = math.prod(spec.concrete_shape(self.dims))
            if elements > MAX_INPUT_ELEMENTS:
                raise ValueError(
                    f"input {spec.name!r} has {elements:,} elements at shape "
                    f"{list(spec.concrete_shape(self.dims))}: over {MAX_INPUT_ELEMENTS:,} (8 GiB of float32); "
                    "check [dims] and the shape for a typo"
                )
        return self

    @property
    def root(self) -> Path:
        return self._root

    @property
    def file(self) -> Path:
        return self._file

    @property
    def display_name(self) -> str:
        return self.model.name or self._root.resolve().name


class Budgets(_Strict):
    """Every budget is optional; one left out is simply not judged."""

    latency_p50_ms: float | None = Field(None, gt=0)
    latency_p90_ms: float | None = Field(None, gt=0)
    latency_p99_ms: float | None = Field(None, gt=0)
    cold_start_ms: float | None = Field(None, gt=0)
    peak_memory_mb: float | None = Field(None, gt=0, description="peak RSS of the inference process")
    gpu_memory_mb: float | None = Field(None, gt=0, description="peak GPU memory of the inference process")
    artifact_mb: float | None = Field(None, gt=0)
    power_avg_w: float | None = Field(None, gt=0)
    energy_mj: float | None = Field(None, gt=0)
    accuracy_max_drop: float | None = Field(None, ge=0, description="in the project's metric units")
    accuracy_max_rel_drop: float | None = Field(None, ge=0, lt=1, description="as a share of the reference metric")
    placement_max_off_share: float | None = Field(
        None, ge=0, le=1, description="share of nodes off the intended accelerator"
    )
    # [workload] kind = "generate"
    ttft_ms: float | None = Field(
        None,
        gt=0,
        description="time to first token, judged on its p90: at the longest prompt (generate), from the features "
        "through the encoder to the first token (transcribe)",
    )
    tpot_p90_ms: float | None = Field(None, gt=0, description="time per output token (decode step), p90")
    tpot_p99_ms: float | None = Field(None, gt=0, description="time per output token (decode step), p99")
    decode_tokens_per_s: float | None = Field(
        None, gt=0, description="the least decode throughput, judged on the bound of the median time per token"
    )
    kv_cache_mb: float | None = Field(None, gt=0, description="the KV cache at the workload's max_context")
    greedy_min_agreement: float | None = Field(
        None,
        ge=0,
        le=1,
        description="share of the reference's greedy tokens "
        "reproduced before the first divergence, over the golden prompts (or clips)",
    )
    # [workload] kind = "transcribe" (and ttft_ms, tpot_p90_ms, tpot_p99_ms, greedy_min_agreement, real_time_factor)
    encoder_ms: float | None = Field(None, gt=0, description="the encoder over one clip's features, p90")
    max_wer: float | None = Field(
        None,
        ge=0,
        description="word error rate of the artifact's greedy transcripts of the golden clips against [workload] "
        "transcripts, at most (judged at build: the transcripts and the tokenizer stay on the host)",
    )

    # [workload] kind = "stream"
    chunk_p99_ms: float | None = Field(None, gt=0, description="one chunk's time with the state carried, p99")
    real_time_factor: float | None = Field(
        None,
        gt=0,
        description="compute time over the audio's real time: a stream's chunks × deadline_ms, judged on the "
        "slowest timed stream; a transcription's clip length, judged on the p90 of the clip length worst off",
    )
    deadline_max_miss_share: float | None = Field(
        None, ge=0, le=1, description="share of chunks slower than [workload] deadline_ms"
    )
    stream_max_abs_error: float | None = Field(
        None,
        ge=0,
        description="largest difference of any output from the "
        "torch model over the golden stream, state carried on both sides",
    )
    stream_max_rel_error: float | None = Field(
        None,
        ge=0,
        description="stream_max_abs_error as a share of that output's largest magnitude over the golden stream: "
        "a drift budget without units",
    )

    def stream_budgets(self) -> dict[str, float]:
        names = (
            "chunk_p99_ms",
            "real_time_factor",
            "deadline_max_miss_share",
            "stream_max_abs_error",
            "stream_max_rel_error",
        )
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def transcription_budgets(self) -> dict[str, float]:
        names = ("encoder_ms", "ttft_ms", "tpot_p90_ms", "tpot_p99_ms", "real_time_factor")
        names += ("greedy_min_agreement", "max_wer")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def generation_budgets(self) -> dict[str, float]:
        names = ("ttft_ms", "tpot_p90_ms", "tpot_p99_ms", "decode_tokens_per_s", "kv_cache_mb", "greedy_min_agreement")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def latency_quantiles(self) -> dict[float, float]:
        pairs = {0.5: self.latency_p50_ms, 0.9: self.latency_p90_ms, 0.99: self.latency_p99_ms}
        return {q: limit for q, limit in pairs.items() if limit is not None}


class _FromSource(_Strict):
    """Something taken from a page: `source` is that page's URL."""

    source: str
    note: str = ""

    @field_validator("source")
    @classmethod
    def _is_url(cls, value: str) -> str:
        if not value.startswith(("https://", "http://")):
            raise ValueError(f"source must be a URL, got {value!r}")
        return value


class Sourced(_FromSource):
    """A datasheet number with the page it came from."""

    value: float = Field(gt=0)


# CPU instruction-set extensions the INT8 rules key on (Linux /proc/cpuinfo spellings; arm64: Features)
CpuFlag = Literal[
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "asimddp",
    "i8mm",
    "sve",
    "sve2",
]


class CpuIsa(_FromSource):
    """The instruction set of a device's CPU cores, with the page it came from."""

    arch: Literal["x86_64", "arm64"]
    flags: list[CpuFlag]


class DeviceSpec(_Strict):
    name: str

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        return folder_safe(value, "device spec name")

    vendor: str
    kind: Literal["gpu", "soc", "cpu"]
    compute_units: list[Literal["cpu", "gpu", "npu", "dla"]] = Field(min_length=1)
    peak_dense_tops: dict[Literal[PEAK_FORMATS], Sourced] = Field(
        min_length=1, description="dense peak, TFLOP/s or TOP/s, per precision"
    )
    memory_gb: Sourced
    memory_bandwidth_gbs: Sourced
    power_max_w: Sourced | None = None
    power_modes_w: list[float] = Field(default_factory=list)
    cpu_isa: CpuIsa | None = Field(None, description="its CPU cores' instruction set: the CPU INT8 rules key on it")
    identifiers: list[str] = Field(
        default_factory=list,
        description="substrings of the name the device's driver "
        "reports (NVML, amdsmi, the Jetson device tree): `check` says when another device ran",
    )

    def matches(self, reported: str) -> bool:
        return any(i.lower() in reported.lower() for i in self.identifiers)
