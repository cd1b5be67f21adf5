"""The kernel interface: a Triton kernel with its PyTorch reference, the cases it is verified and timed on, the
bytes and FLOPs that place it against the device's roof, and the chain of ATen ops it replaces in a torch.export
program.

A kernel writes into outputs it is given (the harness pre-fills them with NaN to see what it never wrote) and is
launched through `run`, which takes the config to launch with. Triton compiles the kernel's source at first use,
not at import: whether it runs on a GPU or in Triton's interpreter (`TRITON_INTERPRET=1`, CPU tensors) is read
then, so the harness can choose after looking for a GPU.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar

# per dtype: (absolute, relative) tolerance against the float32 reference; a kernel may widen its own
TOLERANCE = {"float32": (1e-4, 1e-4), "float16": (2e-2, 1e-2), "bfloat16": (8e-2, 3e-2)}


@dataclass(frozen=True)
class Case:
    """One shape a kernel runs on: `dims` are its named sizes (rows, width, heads …), `label` says where it comes
    from (a model's own shape, or an edge case)."""

    dims: tuple[tuple[str, int], ...]
    label: str = ""

    @classmethod
    def of(cls, label: str = "", **dims: int) -> Case:
        return cls(tuple(dims.items()), label)

    def __getitem__(self, name: str) -> int:
        return dict(self.dims)[name]

    @property
    def key(self) -> str:
        """A stable name of the shape: "rows=128,width=384"."""
        return ",".join(f"{k}={v}" for k, v in self.dims)


@dataclass(frozen=True)
class Config:
    """One point of a kernel's tuning space: its compile-time constants and launch settings."""

    constants: tuple[tuple[str, int], ...] = ()
    num_warps: int = 4
    num_stages: int = 2

    @classmethod
    def of(cls, num_warps: int = 4, num_stages: int = 2, **constants: int) -> Config:
        return cls(tuple(constants.items()), num_warps, num_stages)

    def __getitem__(self, name: str) -> int:
        return dict(self.constants)[name]

    @property
    def key(self) -> str:
        return ",".join(
            [*(f"{k}={v}" for k, v in self.constants), f"warps={self.num_warps}", f"stages={self.num_stages}"]
        )

    def launch(self) -> dict[str, int]:
        """The keyword arguments a Triton launch takes for this config."""
        return {**dict(self.constants), "num_warps": self.num_warps, "num_stages": self.num_stages}


@dataclass
class Match:
    """Where a kernel would replace a chain of ops in a program: the nodes it takes the place of (the last one's
    result is the kernel's output), the arguments it would be called with, and the case and dtype it runs at."""

    kernel: str
    nodes: list  # torch.fx nodes, in graph order
    args: tuple
    case: Case
    dtype: str

    @property
    def where(self) -> str:
        return " → ".join(n.name for n in self.nodes)


class Kernel(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]
    replaces: ClassVar[str]  # the chain of ops, in words, for the report
    dtypes: ClassVar[tuple[str, ...]] = ("float32", "float16", "bfloat16")
    op_schema: ClassVar[str]  # the torch.library op it is registered as ("tapeout::name")
    op_signature: ClassVar[str] = ""  # its schema, "(Tensor x, …) -> Tensor"; empty: not substituted
    source: ClassVar[Callable]  # the undecorated Triton kernel function
    shrinkable: ClassVar[tuple[str, ...]] = ()  # dims the interpreter may cut to keep a case quick
    interpreter_limits: ClassVar[dict[str, str]] = {}  # dtype -> why Triton's interpreter cannot verify it

    @functools.cached_property
    def compiled(self):
        """The Triton kernel, jitted now (on a GPU or in the interpreter, by TRITON_INTERPRET at this moment)."""
        import triton

        return triton.jit(type(self).source)

    def launcher(self, tensor):
        """What `run` launches through: the jitted kernel itself on real tensors, or torch.library's `wrap_triton`
        of it while torch.export or Inductor traces (fake or functional tensors, a dispatch mode, or compiling),
        which records the launch in the graph. Eagerly, `wrap_triton` costs ~150 µs of host time a launch (seen on
        an H100 host with torch 2.11, against 19 µs for the direct launch)."""
        import torch
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if type(tensor) is torch.Tensor and _get_current_dispatch_mode() is None and not torch.compiler.is_compiling():
            return self.compiled
        from torch.library import wrap_triton

        return wrap_triton(self.compiled)

    @abstractmethod
    def cases(self) -> list[Case]:
        """The shapes it is verified on: the sample models' own and edge cases (sizes not multiples of a block)."""

    def bench_cases(self) -> list[Case]:
        """The shapes it is timed on: the sample models' own (those cases labelled with a model)."""
        return [c for c in self.cases() if not c.label.startswith("edge")]

    @abstractmethod
    def configs(self, case: Case) -> list[Config]:
        """The tuning space for `case`; the first is the default (the interpreter verifies them all)."""

    @abstractmethod
    def inputs(self, case: Case, dtype: str, generator, device: str) -> dict[str, Any]:
        """Fresh inputs for one call (tensors drawn from `generator`, plus any scalars)."""

    @abstractmethod
    def outputs(self, case: Case, dtype: str, inputs: dict[str, Any], device: str) -> dict[str, Any]:
        """Empty output tensors of the right shapes (the harness fills them with NaN)."""

    @abstractmethod
    def eager(self, **inputs) -> dict[str, Any]:
        """The chain the kernel replaces, in PyTorch ops at the inputs' dtype: what Inductor compiles, and timed
        beside the kernel."""

    def reference(self, **inputs) -> dict[str, Any]:
        """What the outputs must hold: the eager chain on the same inputs cast to float32."""
        import torch

        wide = {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}
        return {k: v.float() for k, v in self.eager(**wide).items()}

    @abstractmethod
    def run(self, inputs: dict[str, Any], outputs: dict[str, Any], config: Config) -> None:
        """Launch the kernel with `config`, writing `outputs`."""

    @abstractmethod
    def traffic(self, case: Case, dtype: str) -> tuple[float, float]:
        """(bytes moved to and from memory at least once, floating-point operations) for one call."""

    def work(self, case: Case) -> int:
        """How big `case` is, for cutting it to a size the interpreter runs quickly: the product of its dims."""
        import math

        return math.prod(v for _, v in case.dims)

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return TOLERANCE[dtype]

    def match(self, node) -> Match | None:
        """The chain ending at `node` (an FX node of a torch.export program) this kernel replaces, or None."""
        return None

    def call(self, *args):
        """The kernel as a function of the matched arguments and, last, the key of the config to launch with (the one
        `tapeout kernels bench` tuned for this shape on this GPU; "" for the default): what the registered op runs,
        outputs allocated here."""
        raise NotImplementedError(f"{self.name} is not a substitution kernel")

    def config_named(self, key: str, case: Case | None) -> Config:
        """The config of `case`'s tuning space named `key` ("" → the default)."""
        configs = self.configs(case)
        if not key:
            return configs[0]
        for config in configs:
            if config.key == key:
                return config
        raise ValueError(f"kernel {self.name} has no config {key!r}" + (f" for {case.key}" if case else ""))

    def rewrite(self, graph, match: Match, op) -> list[tuple]:
        """Put a call of `op` in the program's graph where `match` was; the (old node, new node) pairs whose uses
        moved (the chain's other nodes are left for dead-code elimination)."""
        last = match.nodes[-1]
        with graph.inserting_before(last):
            new = graph.call_function(op, match.args)
        new.meta.update({k: v for k, v in last.meta.items() if k in ("val", "tensor_meta", "stack_trace")})
        last.replace_all_uses_with(new)
        return [(last, new)]


# symbol -> size: what a dynamic program's symbolic dims stand for while a pass prices its matches (the project's dims)
SIZES: ContextVar[dict | None] = ContextVar("SIZES", default=None)


def concrete(size) -> int:
    """A size from a program's shapes as a number: a symbolic one at the sizes `SIZES` gives its symbols, else at
    the example the program was traced with. Never `int()` on a symbolic size: that specializes it in the program's
    shape environment, a change to the program a matcher must not make."""
    node = getattr(size, "node", None)
    if node is None:
        return int(size)
    if SIZES.get():
        resolved = node.expr.xreplace(SIZES.get())
        if resolved.is_number:
            return int(resolved)
    return int(node.hint)


def same_shape(*shapes) -> bool:
    """Whether the shapes are provably equal (symbolic sizes by their expressions), without guarding on them."""
    first = [getattr(getattr(s, "node", None), "expr", s) for s in shapes[0]]
    return all(
        len(s) == len(first) and [getattr(getattr(d, "node", None), "expr", d) for d in s] == first for s in shapes[1:]
    )


def itemsize(dtype: str) -> int:
    return {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]


def torch_dtype(dtype: str):
    import torch

    return getattr(torch, dtype)
