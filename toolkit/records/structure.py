"""structure.json: the model's kernel structure, the estimator's cost units at FP32 (each kernel's class, FLOPs,
bytes, nodes, launches), computed once at build from the analysis and hashed by the manifest; check, estimate
and calibrate price it at the build's precision plan instead of analysing the model again."""

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


class StructureRecord(Record):
    schema_id: Literal["tapeout.structure/1"] = Field(SCHEMA, alias="schema")
    kernels: list[CostUnitRecord]
