"""The graph-pass interface: a pass matches what it would rewrite, rewrites it, and states its precondition
and postcondition; when it does not fire it says why. Passes work on the onnx-ir model (the representation
torch's exporter already uses); a pass that repairs a model onnx-ir refuses to load (the FP16 converter's
repeated Casts) works on the protobuf instead and says so (`works_on = "proto"`).

A pass runs at a stage: "export" (every FP32 model a torch export writes, before it is verified against
torch), "source" (an ONNX source's copy, before anything reads it, checked against the source on sample inputs;
made as `cls(project inputs, project dims)`), "method" (run by the quantization method that names it, on that method's input or output) or "target"
(run by the compile step, for the target whose capabilities name it, on the model the target then compiles: a
rewrite into that runtime's own fused ops; made as `cls(project inputs, project dims)`). `run`
applies passes in order and returns what each did, for the report's `passes` section.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, Literal

from tapeout.core.errors import BadInput

Stage = Literal["export", "source", "method", "target"]
NOT_A_CACHE_GRAPH = "not a KV-cache graph (no generate workload)"


def cache_graph(inputs: Sequence) -> bool:
    """Whether the project's inputs are a generate workload's cache graph (exporters/generation.py's signature:
    input_ids and a past per layer): what a target-stage pass for decoding decides from before it loads the model."""
    names = {spec.name for spec in inputs}
    return "input_ids" in names and "past_key_0" in names


class GraphPass(ABC):
    name: ClassVar[str]
    stage: ClassVar[Stage]
    works_on: ClassVar[Literal["onnx-ir", "proto"]] = "onnx-ir"
    nothing_matched: ClassVar[str] = "nothing in the model matched"

    def precondition(self, model) -> str | None:
        """Why this pass cannot run on `model`, or None."""
        return None

    @abstractmethod
    def match(self, model) -> list:
        """What the pass would rewrite (nodes, usually); empty when nothing matches."""

    @abstractmethod
    def rewrite(self, model, matches: list) -> int:
        """Rewrite the matches in place; how many places changed."""

    def postcondition(self, model) -> str | None:
        """What is wrong with `model` after the rewrite, or None."""
        return None

    def summary(self) -> str | None:
        """What the rewrite did, in words, where a count of places says too little; None: the count."""
        return None


def run(passes: Sequence[GraphPass], model) -> list[dict]:
    """Apply `passes` (all working on `model`'s representation) in order; for each, whether it fired and how many
    places it rewrote, or why not."""
    records = []
    for graph_pass in passes:
        why = graph_pass.precondition(model)
        if why:
            records.append(_record(graph_pass, "skipped", f"precondition not met: {why}"))
            continue
        matches = graph_pass.match(model)
        if not matches:
            records.append(_record(graph_pass, "skipped", graph_pass.nothing_matched))
            continue
        rewrites = graph_pass.rewrite(model, matches)
        if not rewrites:  # what matched could not be rewritten after all (a weight computed from an input)
            records.append(_record(graph_pass, "skipped", graph_pass.nothing_matched))
            continue
        broken = graph_pass.postcondition(model)
        if broken:  # the pass broke the model: never shown as a result
            raise BadInput(
                f"graph pass '{graph_pass.name}' left the model wrong: {broken}",
                fix="report it to the pass's author; uninstall a plug-in pass to build without it",
            )
        said = graph_pass.summary() or f"rewrote {rewrites} place(s)"
        records.append(_record(graph_pass, "applied", said, rewrites))
    return records


def run_on_proto(proto, passes: Sequence[GraphPass]) -> tuple[object, list[dict]]:
    """`passes` on an onnx ModelProto: the protobuf passes on it, then the onnx-ir passes on the model as onnx-ir
    sees it, serialized back only where one fired (a model of MiniLM's size is not copied for nothing)."""
    records = run([p for p in passes if p.works_on == "proto"], proto)
    on_ir = [p for p in passes if p.works_on == "onnx-ir"]
    if on_ir:
        import onnx_ir as ir

        model = ir.serde.deserialize_model(proto)
        found = run(on_ir, model)
        if any(r["outcome"] == "applied" for r in found):
            proto = ir.serde.serialize_model(model)
        records += found
    return proto, records


def not_run(graph_pass: GraphPass, why: str) -> dict:
    """The record of a pass whose precondition failed before the model was even loaded."""
    return _record(graph_pass, "skipped", f"precondition not met: {why}")


def _record(graph_pass: GraphPass, outcome: str, reason: str, rewrites: int = 0) -> dict:
    return {
        "name": graph_pass.name,
        "stage": graph_pass.stage,
        "outcome": outcome,
        "rewrites": rewrites,
        "reason": reason,
    }
