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
    name: str
    cls: str = Field(alias="class")
    precision: str
    flops: int
    bytes: float
    nodes: int
    launches: int = 1
    lead: str = ""
    quantized_input: int = 0
    reread: float = 0.0
    shape: dict[str, int] = Field(default_factory=dict)   # a conv's shape beyond FLOPs and bytes (cost_units)


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
    # which kernel shapes the record keeps (estimation/kernel_shape.py VERSION): 0, absent, a record from before the
    # predictors read a MatMul's m, k, n, a kernel's function, a cell's sizes, a conv's width, a movement kernel's run
    shapes: int = Field(0, ge=0)
