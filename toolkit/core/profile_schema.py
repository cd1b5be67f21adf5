"""The schema of a build profile (`profiles/<name>.toml`): its target, precision, quantization and pruning
settings, budgets and check settings. The project file's schemas and device specs are `core.schemas`.

Imports nothing heavy (pydantic and the standard library only): the device-side `check` reads profiles too.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, PrivateAttr, create_model, field_validator, model_validator

from tapeout.core import workload
from tapeout.core.schemas import Budgets, _Strict, folder_safe
from tapeout.core.vocabulary import PRECISIONS, RUNGS

# A million timed runs is hours at millisecond latencies and 8 MB of samples: past it is a typo.
MAX_ITERATIONS = 1_000_000


MAX_REPEATS = 20


class ParitySettings(_Strict):
    atol: float = Field(1e-4, ge=0)
    rtol: float = Field(1e-3, ge=0)
    min_cosine: float = Field(0.9999, ge=-1, le=1)


class CheckSettings(_Strict):
    iterations: int = Field(300, ge=10, le=MAX_ITERATIONS, description="timed runs per repeat")
    repeats: int = Field(3, ge=1, le=MAX_REPEATS, description="fresh inference processes")
    warmup_min_iters: int = Field(10, ge=1, le=100_000)
    warmup_min_s: float = Field(0.5, ge=0, le=600)
    warmup_max_s: float = Field(10.0, gt=0, le=600)
    confidence: float = Field(0.95, gt=0.5, lt=1)
    guard_band: float = Field(0.05, ge=0, lt=1, description="a pass needs the upper bound this far under the limit")
    op_profile: bool = True
    op_profile_iterations: int = Field(20, ge=1, le=10_000)
    energy_window_s: float = Field(
        5.0,
        ge=0,
        le=600,
        description="where an energy counter is read, the timed runs "
        "are extended with more runs until the window spans this long (counters update "
        "every few ms to 100 ms)",
    )
    parity: ParitySettings = ParitySettings()


Precision = Literal[PRECISIONS]


class QuantizationSettings(_Strict):
    """How a non-FP32 precision is reached; the rule table fills in what is left at "auto"."""

    method: str = Field(
        "auto",
        min_length=1,
        description="auto (the rule's), or a quantization method that stands "
        "in for the rule's: dynamic, static, weight-only, or a plug-in's",
    )
    calibration_method: Literal["minmax", "percentile", "entropy"] = "minmax"
    calibration_samples: int = Field(64, ge=1, le=4096, description="bounds calibration memory and time")
    per_channel: bool | None = Field(None, description="None: the rule decides")
    keep_float: list[str] = Field(default_factory=list, description="fusion-group or node names kept in float")
    overrides: dict[str, str] = Field(
        default_factory=dict,
        description="fusion-group name, node name or role → the "
        'rung its groups start on instead of the rule\'s, e.g. lm_head = "int4" (a rung '
        "of the profile's precision ladder; the sensitivity loop may still move it up)",
    )
    block_size: int = Field(32, ge=16, le=256, description="INT4 weight-only block size (a power of two)")
    int4_algorithm: Literal["rtn", "gptq", "awq"] = "rtn"  # gptq: ORT only; awq: OpenVINO (NNCF) only
    sensitivity: bool = Field(True, description="run the sensitivity loop when the accuracy budget is missed")
    max_evaluations: int = Field(12, ge=1, le=200, description="full metric evaluations the loop may spend")
    rank_samples: int = Field(8, ge=1, le=256, description="calibration samples used to rank fusion groups")
    max_ranked_groups: int = Field(
        24,
        ge=1,
        le=1000,
        description="groups the loop ranks (each quantized alone); the rest, smallest by MACs, follow them unranked",
    )
    max_search_s: float = Field(
        900,
        gt=0,
        le=86_400,
        description="wall time for ranking and the loop together; what is left when it runs out is reported as skipped",
    )

    @field_validator("overrides")
    @classmethod
    def _rungs(cls, value: dict[str, str]) -> dict[str, str]:
        for name, rung in value.items():
            if rung not in RUNGS:
                raise ValueError(f'overrides: {name} = "{rung}" is not a precision rung (one of: {", ".join(RUNGS)})')
        return value

    @field_validator("block_size")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError(f"block_size {value} must be a power of two (16, 32, 64, 128, 256)")
        return value


class PruningSettings(_Strict):
    """Structured pruning on the torch side, before export (quantize/prune.py); then the precision step."""

    what: list[Literal["channels", "heads", "mlp", "depth", "2:4"]] = Field(
        min_length=1,
        description="channels (conv/Linear widths of CNNs and MLPs), heads (attention heads), mlp "
        "(transformer FFN width), depth (whole blocks of the repeated block list), 2:4 (semi-structured weight "
        "sparsity)",
    )
    ratio: float = Field(
        gt=0,
        lt=1,
        description="share of each prunable width (channels, heads, FFN width) and of "
        'the blocks (depth) removed; with until = "latency", the most the search may remove',
    )
    until: Literal["ratio", "latency"] = Field(
        "ratio",
        description="ratio: prune by `ratio` once; latency: prune in steps of `step` up to `ratio`, measuring "
        "each step on the target, until the latency_p50_ms budget holds or the accuracy budget breaks",
    )
    step: float = Field(0.1, gt=0, lt=1, description="the latency search's increment of the ratio")
    importance: Literal["activation", "magnitude", "taylor"] = Field(
        "activation",
        description="activation (‖W[:, j]‖·‖x_j‖ on the calibration data, Wanda's score), magnitude "
        "(L2 of the coupled group) or taylor (|w·∂L/∂w| on the calibration data)",
    )
    protect: list[str] = Field(
        default_factory=list,
        description="module names kept whole, besides the family's own (first conv, classifier, embeddings, LM head)",
    )
    round_to: int | None = Field(
        None,
        ge=1,
        le=256,
        description="channel counts kept a multiple of this (default: from the target and precision)",
    )
    recover: str | None = Field(
        None,
        description="`file.py:callable` called with (pruned, teacher, recovery "
        "inputs) to recover accuracy; default: the built-in distillation",
    )
    data: str | None = Field(
        None,
        description="recovery inputs: an .npz in the project or `file.py:callable` yielding "
        "feeds, like [calibration] data (unlabelled, so it can be far larger); default: the "
        "calibration data",
    )
    data_samples: int = Field(4096, ge=1, le=1_000_000, description="at most this many recovery inputs are read")
    distill_steps: int = Field(200, ge=0, le=100_000, description="built-in distillation: optimizer steps (0: none)")
    distill_batch: int = Field(
        16,
        ge=1,
        le=1024,
        description="built-in distillation: inputs per step (stacked on the "
        "batch axis where the model gives the same answers batched; 1 otherwise)",
    )
    distill_lr: float | None = Field(
        None,
        gt=0,
        le=1.0,
        description="default: 5e-5 for transformers (a pretrained "
        "encoder's fine-tuning rate; 1e-3 collapsed MiniLM), 1e-3 otherwise",
    )
    distill_max_s: float = Field(300, gt=0, le=86_400, description="built-in distillation: wall-time cap")


# `[budgets.<kind>]` in a profile: budgets judged only where the project's workload is of that kind
WORKLOAD_KINDS = tuple(workload.BUILT_IN)  # the kinds whose budgets [budgets] lists; a plug-in judges its own
ProfileBudgets = create_model(
    "ProfileBudgets",
    __base__=Budgets,
    __doc__="A profile's budgets: those every workload shares, and a table per workload kind judged only there.",
    **{kind: (Budgets | None, None) for kind in WORKLOAD_KINDS},
)


class Profile(_Strict):
    name: str = Field(description="names the default build dir, PROJECT/build/NAME")
    description: str = ""
    target: str
    device: str | None = Field(None, description="device spec name; none means the machine that runs check")
    precision: Precision = "fp32"
    quantization: QuantizationSettings = QuantizationSettings()
    pruning: PruningSettings | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    budgets: ProfileBudgets = ProfileBudgets()  # type: ignore[valid-type]
    check: CheckSettings = CheckSettings()
    # budgets a profile file of the user's own set (config.budgets_set_by_the_user): the project's give way to these
    _user_budgets: frozenset[str] = PrivateAttr(default_factory=frozenset)

    def for_workload(self, kind: str) -> Profile:
        """The budgets a build of this workload judges: [budgets] with [budgets.<kind>] over it, the workloads'
        tables dropped, so that what the build records is what it judged."""
        shared = self.budgets.model_dump(exclude_none=True, exclude=set(WORKLOAD_KINDS))
        scoped = getattr(self.budgets, kind, None)
        merged = {**shared, **(scoped.model_dump(exclude_none=True) if scoped else {})}
        profile = Profile.model_validate({**self.model_dump(), "budgets": merged})
        profile._user_budgets = self._user_budgets
        return profile

    @field_validator("name", "device")
    @classmethod
    def _plain_names(cls, value: str | None, info) -> str | None:
        return folder_safe(value, f"profile {info.field_name}")

    @model_validator(mode="after")
    def _enough_iterations(self) -> Profile:
        total = self.check.iterations * self.check.repeats
        quantiles = set(self.budgets.latency_quantiles())
        for kind in WORKLOAD_KINDS:
            if (scoped := getattr(self.budgets, kind)) is not None:
                quantiles |= set(scoped.latency_quantiles())
        for q in sorted(quantiles):
            need = min_samples_for_bound(q, self.check.confidence)
            if total < need:
                raise ValueError(
                    f"check.iterations × check.repeats = {total} cannot bound p{q * 100:g} at confidence "
                    f"{self.check.confidence}: needs at least {need} samples in all"
                )
        return self


def min_samples_for_bound(quantile: float, confidence: float) -> int:
    """Smallest n for which the largest of n samples is a one-sided upper bound on the quantile."""
    return math.ceil(math.log(1 - confidence) / math.log(quantile))
