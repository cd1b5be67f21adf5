"""The substitution pass: in a torch.export program, each chain a kernel replaces (a residual add + norm, an MLP
epilogue, rotary, attention) becomes a call of that kernel's `torch.library.triton_op` — only where
`tapeout kernels bench` measured the kernel faster than Inductor's own code for that shape, dtype and GPU. Every
match is listed with both timings and the decision, substituted or not and why. The substituted call launches with
the config bench tuned and timed for that shape (passed to the op by name). A `triton_op` is traced through by
torch.export and Inductor, so the kernel ends up inside the AOTInductor package.

Triton kernels run on CUDA GPUs (here, on the CPU, only in Triton's interpreter, which times nothing): a program
for the CPU keeps Inductor's code everywhere, and each match says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tapeout.targets.kernels import BUILT_IN, get, timings
from tapeout.targets.kernels.base import SIZES, Kernel, Match

_REGISTERED: dict[str, object] = {}


@dataclass
class Decision:
    kernel: str
    where: str  # the chain's nodes in the program
    case: str
    dtype: str
    substituted: bool
    kernel_ms: float | None
    inductor_ms: float | None
    reason: str
    config: str | None = None  # the config bench tuned and timed, which the substituted call launches with

    def row(self) -> dict:
        return asdict(self)


def op(kernel: Kernel):
    """The kernel registered as a torch.library triton_op (once per process): its OpOverload."""
    import torch
    from torch.library import triton_op

    if kernel.name not in _REGISTERED:
        triton_op(kernel.op_schema, _typed(kernel), mutates_args=())
        namespace, _, name = kernel.op_schema.partition("::")
        _REGISTERED[kernel.name] = getattr(getattr(torch.ops, namespace), name).default
    return _REGISTERED[kernel.name]


def _typed(kernel: Kernel):
    """`kernel.call` with the annotations torch.library reads its schema from, made from `op_signature`."""
    import inspect
    import re
    from typing import Optional

    import torch

    types = {"Tensor": torch.Tensor, "Tensor?": Optional[torch.Tensor], "float": float, "bool": bool, "str": str}  # noqa: UP045 - torch.library reads Optional
    head, _, result = kernel.op_signature.partition("->")
    params = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=types[kind])
        for kind, name in re.findall(r"([\w?]+) (\w+)", head)
    ]
    outputs = [types[t] for t in re.findall(r"[\w?]+", result)]
    returns = outputs[0] if result.strip() == "Tensor" else tuple[tuple(outputs)]

    def call(*args):
        return kernel.call(*args)

    call.__signature__ = inspect.Signature(params, return_annotation=returns)
    return call


def substitutable() -> list[Kernel]:
    """The kernels that replace a chain in a program (those with an op signature)."""
    return [k for k in (get(name) for name in BUILT_IN) if k.op_signature]


def find(program, kernels: list[Kernel] | None = None, inputs=None, dims: dict[str, int] | None = None) -> list[Match]:
    """Every chain in `program`'s graph a kernel replaces, in graph order; a node is claimed by one match at most.
    A dynamic program's shapes are priced at `dims` (the project's), its inputs' symbolic sizes named by `inputs`
    (InputSpecs in the program's input order); without them, at the example it was traced with."""
    claimed: set = set()
    found = []
    token = SIZES.set(_symbols(program, inputs, dims) if inputs and dims else {})
    try:
        for node in program.graph_module.graph.nodes:
            for kernel in kernels or substitutable():
                match = kernel.match(node)
                if match and not claimed.intersection(match.nodes):
                    claimed.update(match.nodes)
                    found.append(match)
                    break
    finally:
        SIZES.reset(token)
    return found


def _symbols(program, inputs, dims: dict[str, int]) -> dict:
    """symbol -> the project's size, read off the user inputs' symbolic shapes and the InputSpecs' dim names."""
    import sympy

    nodes = {n.name: n for n in program.graph_module.graph.nodes if n.op == "placeholder"}
    found = {}
    for spec, name in zip(inputs, program.graph_signature.user_inputs, strict=False):
        val = nodes[name].meta.get("val") if name in nodes else None
        for size, dim in zip(getattr(val, "shape", ()), spec.shape, strict=False):
            expr = getattr(getattr(size, "node", None), "expr", None)
            if isinstance(dim, str) and dim in dims and isinstance(expr, sympy.Symbol):
                found[expr] = sympy.Integer(dims[dim])
    return found


def decide(matches: list[Match], table: dict[str, timings.Timing], device: str | None) -> list[Decision]:
    """For each match, whether to substitute: only where the kernel's measured p90 on `device` is below Inductor's
    p50 (faster beyond its own spread). `device` None: the program is for the CPU."""
    decisions = []
    for m in matches:
        timing = table.get(timings.entry_key(m.kernel, m.case.key, m.dtype)) if device else None
        kernel_ms, inductor_ms = (timing.kernel_ms, timing.inductor_ms) if timing else (None, None)
        known = {c.key for c in get(m.kernel).configs(m.case)}
        if device is None:
            ok, why = (
                False,
                "Triton kernels run on CUDA GPUs; this program is compiled for the CPU: Inductor's code kept",
            )
        elif timing is None:
            ok, why = (
                False,
                (
                    f"not timed on {device} at {m.case.key} {m.dtype}: Inductor's code kept "
                    f"(`tapeout kernels bench {m.kernel}` on this GPU measures it)"
                ),
            )
        elif timing.config not in known:
            ok, why = (
                False,
                (
                    f"timed with config {timing.config!r}, which this version of the kernel does not have: "
                    f"Inductor's code kept (`tapeout kernels bench {m.kernel}` times it again)"
                ),
            )
        elif inductor_ms is None:
            ok, why = False, "Inductor's code for this chain was not timed (torch.compile failed there): kept as is"
        elif timing.kernel_p90_ms < inductor_ms:  # faster beyond the kernel's own spread, not by a lucky median
            ok, why = (
                True,
                (
                    f"{inductor_ms / kernel_ms:.2f}× faster than Inductor's code ({kernel_ms:.4f} vs "
                    f"{inductor_ms:.4f} ms; the kernel's p90 {timing.kernel_p90_ms:.4f} ms)"
                ),
            )
        elif kernel_ms < inductor_ms:
            ok, why = (
                False,
                (
                    f"faster than Inductor's code only within its own spread (p50 {kernel_ms:.4f}, p90 "
                    f"{timing.kernel_p90_ms:.4f} vs {inductor_ms:.4f} ms): Inductor's code kept"
                ),
            )
        else:
            ok, why = (
                False,
                (
                    f"slower than Inductor's code ({kernel_ms:.4f} vs {inductor_ms:.4f} ms, "
                    f"{kernel_ms / inductor_ms:.2f}×): Inductor's code kept"
                ),
            )
        decisions.append(
            Decision(
                m.kernel,
                m.where,
                m.case.key,
                m.dtype,
                ok,
                kernel_ms,
                inductor_ms,
                why,
                timing.config if timing else None,
            )
        )
    return decisions


def apply(program, matches: list[Match], decisions: list[Decision]) -> int:
    """Rewrite `program` in place where a decision says substitute; how many chains were replaced."""
    import torch.fx

    graph = program.graph_module.graph
    moved: dict = {}  # a node an earlier rewrite replaced -> what replaced it (a later match may name it)
    done = 0
    for match, decision in zip(matches, decisions, strict=True):
        if not decision.substituted:
            continue
        kernel = get(match.kernel)
        # the call launches with the config that was timed (the op's last argument, fixed when Inductor compiles it)
        match.args = (*(moved.get(a, a) if isinstance(a, torch.fx.Node) else a for a in match.args), decision.config)
        for old, new in kernel.rewrite(graph, match, op(kernel)):
            moved[old] = new
            program.graph_signature.replace_all_uses(old.name, new.name)
        for old in reversed(match.nodes):  # DCE keeps what it deems impure: SDPA, export's dtype assertions
            for check in [u for u in old.users if "_assert_tensor_metadata" in str(u.target)]:
                graph.erase_node(check)
            if not old.users:
                graph.erase_node(old)
        done += 1
    if done:
        graph.eliminate_dead_code()
        graph.lint()
        program.graph_module.recompile()
    return done


def substitute(
    program, table: dict[str, timings.Timing], device: str | None, inputs=None, dims: dict[str, int] | None = None
) -> tuple[int, list[Decision]]:
    """find → decide → apply on `program` (rewritten in place); the count replaced and every decision."""
    matches = find(program, inputs=inputs, dims=dims)
    decisions = decide(matches, table, device)
    return apply(program, matches, decisions), decisions
