"""structure.json: the model's kernel structure, the estimator's cost units at FP32 (each kernel's class, FLOPs,
bytes, nodes, launches), computed once at build from the analysis and hashed by the manifest; check, estimate
and calibrate price it at the build's precision plan instead of analysing the model again. A generate workload's
build also keeps the structure of each phase of its loop at that phase's shapes (prefill per prompt length, decode
steps): `kernels` is the decode step at max_context, the call every per-call figure describes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tapeout.records.record import Record

SCHEMA = "tapeout.structure/1"


class CostUnitRecord(Record):
    """One kernel's cost; every figure a count or an amount, so a negative or non-finite one (a file re-hashed by
    another tool) is refused by the reader, never priced into a negative lower bound."""

    name: str
    cls: str = Field(alias="class")
    precision: str
    flops: int = Field(ge=0)
    bytes: float = Field(ge=0, allow_inf_nan=False)
    nodes: int = Field(ge=0)
    launches: int = Field(1, ge=0)
    lead: str = ""
    quantized_input: int = Field(0, ge=0)
    reread: float = Field(0.0, ge=0, allow_inf_nan=False)
    weights: float = Field(0.0, ge=0, allow_inf_nan=False)  # of `bytes`, those of constant inputs (absent from
    # earlier records: priced as their own)
    shape: dict[str, int] = Field(default_factory=dict)  # earlier versions' predictor features: read and ignored


class PhaseRecord(Record):
    """A generate workload's call at its own shapes (estimation/generation.py): a prompt's prefill, a decode step."""

    kind: Literal["prefill", "decode"]
    seq: int = Field(ge=1)
    past: int = Field(ge=0)
    kernels: list[CostUnitRecord]


class StructureRecord(Record):
    schema_id: Literal["tapeout.structure/1"] = Field(SCHEMA, alias="schema")
    kernels: list[CostUnitRecord]
    phases: list[PhaseRecord] = Field(default_factory=list, description="generate workloads only")
    shapes: int = Field(0, ge=0)  # earlier versions' predictor feature version: read and ignored
