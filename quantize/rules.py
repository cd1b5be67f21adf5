"""The first plan: the rule for (family × rule set × precision) from `quantize.rule_tables`, the CPU's instruction
set where the rule depends on it, the project's overrides, keep_float and the method. The rule set and the precision
ladder come from the target's capabilities, never its name. Documented in docs/quantization-rules.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tapeout.core.capabilities import Capabilities
from tapeout.core.errors import BadInput
from tapeout.core.profile_schema import QuantizationSettings
from tapeout.graph.analysis import Analysis
from tapeout.quantize.plan import FLOAT, GroupPlan, Plan
from tapeout.quantize.rule_tables import RULE_SETS, Rule


@dataclass(frozen=True)
class InstructionSet:
    """The CPU the INT8 model will run on, as far as the rules care: its architecture and extensions,
    and where that came from (the profile's device spec, or the build host)."""

    arch: str
    flags: frozenset[str]
    origin: str

    @property
    def vnni(self) -> bool:
        return bool(self.flags & {"avx512_vnni", "avx_vnni", "amx_int8"})


def host_isa(why: str = "the profile names no device") -> InstructionSet:
    import platform

    from tapeout.core.host import cpu_info

    machine = platform.machine().lower()
    arch = "arm64" if machine in ("arm64", "aarch64") else "x86_64" if machine in ("x86_64", "amd64") else machine
    return InstructionSet(arch, cpu_info()[1], f"the build host's ({why})")


def isa_for(device) -> InstructionSet:
    """The device spec's CPU instruction set when the profile names a device that lists one, else the host's."""
    if device is None:
        return host_isa()
    if device.cpu_isa is None:
        return host_isa(f"device spec {device.name} lists no CPU instruction set")
    return InstructionSet(device.cpu_isa.arch, frozenset(device.cpu_isa.flags), f"device spec {device.name}")


def static_formats(isa: InstructionSet) -> tuple[str, bool, str]:
    """(activation type, reduce_range, why) of ORT static QDQ INT8 on this instruction set.

    x86's INT8 dot products multiply unsigned by signed bytes (vpmaddubsw on AVX2, vpdpbusd on VNNI), so
    U8S8 is native. Without VNNI the u8×s8 pair sums saturate int16 unless weights use 7 bits. With
    VNNI, S8S8 QDQ MatMuls ran 4× slower than U8S8 (MiniLM on an AMD EPYC with AVX512-VNNI: 0.49× vs
    1.79× FP32) and convs alike (2.16× vs 2.11×), so U8S8 with full 8-bit weights. arm64's sdot/smmla
    multiply signed by signed: S8S8, ORT's default (not measured here: no arm64 machine)."""
    if isa.arch == "arm64":
        return "int8", False, "arm64: S8S8 (signed dot products; ORT's default)"
    if isa.vnni:
        return "uint8", False, "x86 with VNNI: U8S8, 8-bit weights (S8S8 QDQ MatMuls measured 4× slower)"
    return "uint8", True, "x86 without VNNI: U8S8 with 7-bit weights (reduce_range), so u8×s8 pair sums cannot saturate"


def weight_only_compute(isa: InstructionSet) -> tuple[int | None, str]:
    """ONNX Runtime's MatMulNBits accuracy_level on this CPU, and why. Level 4 quantizes the activations to int8
    per block and runs integer dot products (MLAS has those kernels for x86-64 AVX2 and up and for arm64); without
    it the weights are unpacked to float on every call. On an Intel Xeon (AVX-512 VNNI + AMX, 2 threads),
    one 512 × 32 000 matmul: 4-bit 0.235 ms at level 4 vs 0.625 ms without,
    8-bit 0.385 ms vs 52 ms (FP32: 1.25 ms). Not measured on an AVX2-only or arm64 CPU."""
    if isa.arch == "arm64":
        return 4, "arm64: int8 compute (accuracy_level 4), MLAS's NEON kernels (not measured here)"
    if isa.arch == "x86_64" and "avx2" in isa.flags:
        return (
            4,
            "x86-64 with AVX2: int8 compute (accuracy_level 4): activations to int8 per block, integer dot products",
        )
    return None, (
        f"{isa.arch} without AVX2: float compute (MatMulNBits unpacks the weights each call; 8-bit weights "
        "then run far slower than FP32)"
    )


def rule_for(family: str, target: str, caps: Capabilities, precision: str) -> Rule:
    table = RULE_SETS.get(caps.rules or "")
    if table is None:
        raise BadInput(f"target '{target}' has no {precision} rules", fix='use precision = "fp32" with this target')
    rule = table.get((family, precision))
    if rule is None:
        known = sorted({f for f, p in table if p == precision})
        raise BadInput(
            f"no {precision} rule for a {family} model on {target}",
            fix=f"{precision} is defined there for: {', '.join(known) or 'no family'}; "
            f"use another precision ({', '.join(caps.precisions)})",
        )
    return rule


def choose_method(rule: Rule, target: str, precision: str, settings: QuantizationSettings):
    """The method that applies this rule: the rule's own, or the one [quantization] method names where it stands in
    for the rule's; its int4 algorithm checked."""
    from tapeout.quantize import methods

    own = methods.get(rule.method)
    asked = settings.method
    if asked in ("auto", rule.method):
        method = own
    elif own.fixed_why:
        raise BadInput(
            f"[quantization] method = \"{asked}\" is not available on target '{target}': "
            f"{own.fixed_why.format(precision=precision)}",
            fix='set method = "auto"',
        )
    elif precision == "int4":  # int4 is the rule's weight compression, whatever method the profile names
        method = own
    else:
        method = methods.get(asked)
        if precision not in method.precisions:  # a weight-only method asked for an int8 profile, say
            needed = " or ".join(f'"{p}"' for p in sorted(method.precisions))
            raise BadInput(
                f'[quantization] method = "{asked}" needs precision = {needed} (the profile says {precision})',
                fix=f'set precision = {needed.split(" or ")[0]}, or method = "auto"',
            )
        if rule.method not in method.stands_in_for:
            raise BadInput(
                f"[quantization] method = \"{asked}\" is not available on target '{target}': the rule's "
                f"method is {rule.method}, and {asked} does not stand in for it",
                fix='set method = "auto"',
            )
    if precision == "int4" and settings.int4_algorithm not in method.algorithms:
        # NNCF's GPTQ fails on transposed (torch Linear) weights ("Transpose is not supported", nncf 3.4);
        # ORT's MatMulNBits quantizer has no AWQ
        raise BadInput(
            f"int4_algorithm = \"{settings.int4_algorithm}\" is not available on target '{target}'",
            fix=f"use one of: {', '.join(method.algorithms)}",
        )
    return method


def _check_names(
    settings: QuantizationSettings,
    analysis: Analysis,
    rule: Rule,
    target: str,
    precision: str,
    ladder: tuple[str, ...],
    method,
) -> None:
    """`keep_float` and `overrides` checked against this model and ladder, so that a typo is one line, not a group
    left as the rule has it without a word: every name is a fusion group or node (or, for an override, a role) of the
    model, every override's rung is on the ladder, and a quantized rung goes only to a role the rule's method
    quantizes (an embedding's Gather, say, is no MatMul a weight-only quantizer rewrites)."""
    fix = "see the group and node names and the roles with `tapeout analyze --groups`"
    names = {g.name for g in analysis.groups} | {n for g in analysis.groups for n in g.nodes}
    unknown = sorted(set(settings.keep_float) - names)
    if unknown:
        raise BadInput(f"[quantization] keep_float: '{unknown[0]}' is no fusion group or node of this model", fix=fix)
    roles = {g.role for g in analysis.groups}
    for key, rung in settings.overrides.items():
        matched = [g for g in analysis.groups if key in (g.name, g.role) or key in g.nodes]
        if not matched:
            raise BadInput(
                f"[quantization] overrides: '{key}' is no fusion group, node or role of this model "
                f"(roles: {', '.join(sorted(roles))})",
                fix=fix,
            )
        if rung not in ladder:
            raise BadInput(
                f'[quantization] overrides: {key} = "{rung}" is not on {target}\'s {precision} ladder '
                f"({', '.join(ladder)})",
                fix=f"use one of: {', '.join(ladder)}",
            )
        if not _writes(method, rung):
            usable = [r for r in ladder if _writes(method, r)]
            raise BadInput(
                f'[quantization] overrides: {key} = "{rung}": the {method.name} method does not write {rung}',
                fix=f"use one of: {', '.join(usable)}",
            )
        refused = sorted({g.role for g in matched if g.role not in rule.quantize and g.role not in rule.start})
        if rung != FLOAT and refused:
            quantized = ", ".join(sorted(rule.quantize | set(rule.start)))
            raise BadInput(
                f'[quantization] overrides: {key} = "{rung}": the {analysis.family} rule at {precision} '
                f"on {target} does not quantize role '{refused[0]}' "
                f"({rule.keep.get(refused[0], 'no rule for it')})",
                fix=f"override only groups of the roles it quantizes ({quantized}), or keep it float",
            )


def _writes(method, rung: str) -> bool:
    """Whether `method` can put a group at `rung` (float always)."""
    return rung == FLOAT or method.rungs is None or rung in method.rungs


def _override_of(group, overrides: Mapping[str, str]) -> tuple[str, str] | None:
    """The override that applies to `group`, most specific key first: its name, one of its nodes, its role."""
    for key in (group.name, *group.nodes, group.role):
        if key in overrides:
            return key, overrides[key]
    return None


def first_plan(
    analysis: Analysis,
    target: str,
    caps: Capabilities,
    precision: str,
    settings: QuantizationSettings,
    isa: InstructionSet | None = None,
) -> Plan:
    """The rule table's plan for this model on this target, finished by the rule's quantization method; settings
    override what the user set. `isa`: the CPU the model runs on (CPU rules only); default: the build host's."""
    family = analysis.family
    rule = rule_for(family, target, caps, precision)
    method = choose_method(rule, target, precision, settings)
    # the rungs an override may name: the ladder, and those under it the target offers
    ladder = (*caps.below.get(precision, ()), *caps.precisions[precision])
    _check_names(settings, analysis, rule, target, precision, ladder, method)
    keep = set(settings.keep_float)
    groups = []
    for g in analysis.groups:
        chosen = _override_of(g, settings.overrides)
        if g.name in keep or keep & set(g.nodes):
            groups.append(GroupPlan(g.name, g.role, g.weighted, FLOAT, "kept float by [quantization] keep_float"))
        elif not method.reaches_bodies and any(analysis.body_of(n) for n in g.weighted):
            groups.append(
                GroupPlan(
                    g.name,
                    g.role,
                    g.weighted,
                    FLOAT,
                    f"inside the body of {analysis.body_of(g.weighted[0])}: the {method.name} quantizer "
                    "does not reach into If/Loop/Scan bodies (dynamic INT8 does)",
                )
            )
        elif rule.keep_ops_why and {analysis.op_type(n) for n in g.weighted} & rule.keep_ops:
            groups.append(GroupPlan(g.name, g.role, g.weighted, FLOAT, rule.keep_ops_why))
        elif chosen is not None:
            key, rung = chosen
            groups.append(GroupPlan(g.name, g.role, g.weighted, rung, f'[quantization] overrides: {key} = "{rung}"'))
        elif g.role in rule.start and rule.start[g.role][0] in ladder and _writes(method, rule.start[g.role][0]):
            rung, why = rule.start[g.role]
            groups.append(GroupPlan(g.name, g.role, g.weighted, rung, f"rule {family}/{target}/{precision}: {why}"))
        elif g.role in rule.quantize and g.role not in rule.keep:  # a rule's keep wins (FP16 recurrent cells)
            groups.append(
                GroupPlan(g.name, g.role, g.weighted, precision, f"rule {family}/{target}/{precision}: {rule.why}")
            )
        else:
            why = rule.keep.get(g.role, f"role '{g.role}' is not quantized by the {family} rule")
            groups.append(GroupPlan(g.name, g.role, g.weighted, FLOAT, why))
    # a rung under the precision stays on the plan's ladder only where a group is there: the ladder starts at the
    # precision itself otherwise (a method reads plan.ladder[0] as the precision it quantizes to)
    ladder = tuple(r for r in ladder if r in caps.precisions[precision] or any(g.precision == r for g in groups))
    draft = Plan(method=method.name, family=family, target=target, ladder=ladder, groups=tuple(groups))
    return method.plan(draft, rule, analysis, settings, isa or host_isa())
