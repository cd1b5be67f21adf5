"""A quantization method: how a precision plan becomes a model. The rule tables name a method per (family ×
target × precision); the method finishes the rule's first plan with what its tool needs (number formats,
float nodes, notes), applies the plan, and checks afterwards that the model follows it — every tool leaves
what it cannot handle in float without saying so.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from tapeout.core.profile_schema import QuantizationSettings
    from tapeout.graph.analysis import Analysis
    from tapeout.quantize.carried import CarriedState
    from tapeout.quantize.plan import Plan
    from tapeout.quantize.rule_tables import Rule
    from tapeout.quantize.rules import InstructionSet


class Method(ABC):
    name: ClassVar[str]
    tool: ClassVar[str] = "onnxruntime"  # who quantizes: error lines name it
    model_suffix: ClassVar[str] = ".onnx"  # the file it writes (OpenVINO IR: ".xml", weights in a .bin)
    precisions: ClassVar[frozenset[str]] = frozenset({"int8"})  # the profile precisions it makes
    algorithms: ClassVar[tuple[str, ...]] = ()  # the int4_algorithm values it takes (int4 methods only)
    reaches_bodies: ClassVar[bool] = False  # quantizes nodes inside If/Loop/Scan bodies
    # the quantized rungs it writes, where a target offers more than it (ORT CPU's int8 offers int4 under its ladder,
    # which the dynamic method writes and static QDQ does not); None: every rung the target offers
    rungs: ClassVar[frozenset[str] | None] = None
    honours_float_nodes: ClassVar[bool] = False  # keeps the plan's ungrouped float nodes out of the quantizer
    # the rule methods a profile may replace with this one ([quantization] method = "<name>")
    stands_in_for: ClassVar[frozenset[str]] = frozenset()
    fixed_why: ClassVar[str] = ""  # why no other method may replace this one, where none does

    def plan(
        self, draft: Plan, rule: Rule, analysis: Analysis, settings: QuantizationSettings, isa: InstructionSet
    ) -> Plan:
        """The rule's first plan (`draft`: its groups, ladder and defaults), finished for this method."""
        return draft

    def carry(self, plan: Plan, state: CarriedState) -> Plan:
        """`plan` with the tensors a call hands the next kept at the precision a recurrent state gets from this
        method (quantize/carried.py); unchanged where the method leaves a state no narrower than its other
        activations."""
        return plan

    def needs_calibration(self, plan: Plan) -> bool:
        """Whether `plan` cannot be applied without the project's [calibration] data (asked before any work)."""
        return False

    @abstractmethod
    def apply(self, plan: Plan, model_in: Path, model_out: Path, calibration: list[dict] | None) -> dict:
        """Write the model for `plan` at `model_out`; what was done, for the report."""

    def postcondition(self, plan: Plan, model_in: Path, model_out: Path) -> None:
        """Raise BadInput where the model at `model_out` (made from `model_in`) does not follow `plan`."""
        return None

    def reconcile(self, plan: Plan, model_out: Path) -> Plan:
        """The plan as the written model has it, where the tool may leave planned groups in another precision."""
        return plan
