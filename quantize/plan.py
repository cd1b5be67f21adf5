"""A precision plan: what each fusion group runs in, and how the quantized model is produced.

Plans are data. `rules.first_plan` writes the first one from the analysis; the sensitivity loop
moves groups up the target's precision ladder; `apply.apply` turns a plan into an ONNX model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Literal

FLOAT = "fp32"


@dataclass(frozen=True)
class GroupPlan:
    group: str
    role: str
    nodes: tuple[str, ...]  # the weighted nodes a quantizer touches
    precision: str  # a rung of the target's ladder: "int8", "int4", "fp32", ...
    reason: str  # the rule (or loop step) that put it there
    modules: tuple[str, ...] = ()  # the torch modules its nodes came from (PT2E methods quantize the program by module)


@dataclass(frozen=True)
class Plan:
    method: str  # a quantization method's name (quantize/methods/)
    family: str
    target: str
    ladder: tuple[str, ...]  # lowest precision first; the last rung is float
    groups: tuple[GroupPlan, ...]
    per_channel: bool = True
    reduce_range: bool = False
    activation_type: Literal["uint8", "int8", "uint16", "int16"] = "uint8"
    weight_type: Literal["uint8", "int8"] = "int8"
    activation_symmetric: bool = False
    calibration_method: str = "minmax"
    block_size: int = 32
    int4_algorithm: str = "rtn"  # rtn | gptq (ORT) | awq (NNCF)
    accuracy_level: int | None = None  # ORT MatMulNBits: 4 = activations to int8 per block, integer dot products
    notes: tuple[str, ...] = field(default_factory=tuple)
    float_nodes: tuple[str, ...] = ()  # ungrouped nodes a full-integer plan keeps float (e.g. attention masks)
    # activations carried between calls and those of the nodes writing them (quantize/carried.py): 16-bit in a plan
    # of 8-bit activations, as a recurrent state
    wide_tensors: tuple[str, ...] = ()
    float_ops: tuple[str, ...] = ()  # op types an FP16 plan keeps FP32 wherever they occur
    model_type: str | None = None  # NNCF: "transformer" (keeps norms, softmax, residuals float) or None
    preset: str | None = None  # NNCF: "performance" (symmetric) or "mixed" (asymmetric activations)
    high_precision: str = "fp16"  # ModelOpt: the type the unquantized remainder is cast to

    @property
    def model_suffix(self) -> str:
        """The file a quantized model of this plan is: its method's (OpenVINO IR, .xml + .bin, for NNCF; else ONNX)."""
        from tapeout.quantize import methods

        return methods.get(self.method).model_suffix

    def quantized(self) -> list[GroupPlan]:
        """Groups below the float rung (the ladder's last: FP32, or FP16 where the target's float is FP16)."""
        return [g for g in self.groups if g.precision not in (FLOAT, self.ladder[-1])]

    def nodes_at(self, precision: str) -> list[str]:
        return [n for g in self.groups if g.precision == precision for n in g.nodes]

    def with_group(self, name: str, precision: str, reason: str) -> Plan:
        return replace(
            self,
            groups=tuple(replace(g, precision=precision, reason=reason) if g.group == name else g for g in self.groups),
        )

    def only(self, name: str) -> Plan:
        """This plan with every other group in float: what isolates one group's error."""
        return replace(self, groups=tuple(g if g.group == name else replace(g, precision=FLOAT) for g in self.groups))

    def next_rung(self, name: str) -> str | None:
        current = next(g.precision for g in self.groups if g.group == name)
        i = self.ladder.index(current) if current in self.ladder else len(self.ladder) - 1
        return self.ladder[i + 1] if i + 1 < len(self.ladder) else None

    def to_json(self) -> dict:
        data = asdict(self)
        data["quantized_groups"] = len(self.quantized())
        data["float_groups"] = len(self.groups) - len(self.quantized())
        return data
