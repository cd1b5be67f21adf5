"""How a sweep point's roofline time (`roof_s`, a predictor's feature) is priced, and pricing a sweep file again
when an earlier tapeout priced it otherwise: an estimate prices a build's kernels by this code, so the feature the
predictor learned must be priced the same way."""

from __future__ import annotations

import math

from tapeout.estimation.sweep import Config, SweepFile, features_of, model

# 1, the first; 2, a cache probe's working set twice its array (`Roof.bandwidth_at`: a recurrent cell's re-read
# weights). A file priced otherwise is priced again from its configurations before it is resumed or trained
PRICING = 2


def repriced(sweep: SweepFile, roof) -> tuple[SweepFile, int]:
    """The sweep with each point's roof_s priced by this code at `roof` (its one-kernel model built again from its
    configuration; ~10 ms a point), at this PRICING, and how many points' roof_s moved."""
    moved, points = 0, []
    for p in sweep.points:
        try:
            proto, inputs = model(Config(p.cls, p.op, tuple(p.config.items())))
        except (KeyError, ValueError, TypeError):  # a configuration no longer drawn: its own pricing kept
            points.append(p)
            continue
        feats = features_of(proto, inputs, roof, p.precision)
        roof_s = feats["roof_s"] if feats is not None else p.roof_s
        moved += not math.isclose(roof_s, p.roof_s, rel_tol=1e-9)
        points.append(p.model_copy(update={"roof_s": roof_s}))
    return sweep.model_copy(update={"pricing": PRICING, "points": points}), moved
