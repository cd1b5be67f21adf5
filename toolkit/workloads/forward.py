"""`[workload] kind = "forward"`: one call on the declared inputs, what the measure step times. The contract's
defaults are this workload's: it records nothing, runs no loop and judges no budget of its own."""

from __future__ import annotations

from tapeout.core.schemas import ForwardWorkload
from tapeout.core.workload import Workload


class Forward(Workload):
    kind = "forward"
    settings = ForwardWorkload


WORKLOAD = Forward()
