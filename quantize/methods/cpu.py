"""What the CPU methods (dynamic, static, weight-only) share when they finish a plan: the rule's per-channel
choice unless the profile says otherwise, and a refusal where the rule found nothing to quantize."""

from __future__ import annotations

from dataclasses import replace

from tapeout.core.errors import BadInput
from tapeout.quantize.plan import FLOAT


def cpu_plan(plan, rule, analysis, settings):
    if not any(g.precision != FLOAT for g in plan.groups):
        raise BadInput(
            f"the {plan.family} rule found nothing to quantize in this model (roles: "
            f"{', '.join(sorted({g.role for g in analysis.groups})) or 'none'})",
            fix='use precision = "fp32", or check `tapeout analyze` for the roles found',
        )
    return replace(
        plan,
        per_channel=rule.per_channel if settings.per_channel is None else settings.per_channel,
        weight_type="int8",
        calibration_method=settings.calibration_method,
        block_size=settings.block_size,
        int4_algorithm=settings.int4_algorithm,
    )
