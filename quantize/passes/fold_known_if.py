"""Pass `fold-known-if`: an `If` whose condition the project fixes, replaced by the branch it takes.

Published models often wrap their whole network in an `If` on an input the deployment never varies (a voice-activity
model's sample rate: one network for 16 kHz, another for 8 kHz). Quantizers and the graph analysis do not reach into
a branch, so such a model had nothing to quantize. Where every input the condition depends on is pinned by the
project (`[[inputs]] range = [v, v]`) and the rest of its inputs are constants, the condition is evaluated (ONNX's
reference evaluator, on the condition's own nodes alone) and the `If` is replaced by the taken branch's nodes, its
outputs passed on under the `If`'s output names; names the branch defines that the graph already uses are renamed,
in nested bodies too. Branches that expose further foldable `If`s are folded in turn. The model stays the same
function at the pinned values: the export step checks the folded model against the source on sample inputs.
"""

from __future__ import annotations

import numpy as np

from tapeout.core.onnx_graphs import drop_unused, graphs_in
from tapeout.quantize.passes.base import GraphPass

_MAX_ROUNDS = 16  # nested Ifs exposed by a fold, folded in turn


class FoldKnownIf(GraphPass):
    name = "fold-known-if"
    stage = "source"
    works_on = "proto"
    nothing_matched = "no If whose condition depends only on constants and pinned inputs"

    def __init__(self, inputs: list, dims: dict[str, int]):
        self.pinned = {s.name: s for s in inputs if s.range is not None and s.range[0] == s.range[1]}
        self.dims = dims
        self.folded: list[str] = []  # "If 'name': then" per fold, for the record

    def precondition(self, model) -> str | None:
        if not self.pinned:
            return "no input is pinned to one value ([[inputs]] range = [v, v])"
        return None

    def match(self, model) -> list:
        graph = model.graph
        producers = {out: node for node in graph.node for out in node.output}
        constants = {i.name for i in graph.initializer}
        found = []
        for node in graph.node:
            if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
                continue
            needed = _ancestors(node.input[0], producers)
            if needed is None:
                continue
            leaves = {t for n in needed for t in n.input if t and t not in producers}
            if node.input[0] not in producers:
                leaves.add(node.input[0])
            if all(t in constants or t in self.pinned for t in leaves):
                found.append((node, needed, leaves))
        return found

    def rewrite(self, model, matches: list) -> int:
        total = 0
        for _ in range(_MAX_ROUNDS):
            if not matches:
                break
            for node, needed, leaves in matches:
                branch = "then_branch" if self._condition(model, node, needed, leaves) else "else_branch"
                body = next(a.g for a in node.attribute if a.name == branch)
                _inline(model.graph, node, body)
                self.folded.append(f"If '{node.name or node.output[0]}': {branch.split('_')[0]}")
                total += 1
            drop_unused(model.graph)
            matches = self.match(model)
        return total

    def summary(self) -> str:
        shown = ", ".join(f"{name} = {spec.range[0]:g}" for name, spec in self.pinned.items())
        return f"at {shown}: {'; '.join(self.folded)} branch kept"

    def postcondition(self, model) -> str | None:
        import onnx

        try:
            onnx.checker.check_model(model)
        except onnx.checker.ValidationError as exc:
            return f"the folded graph fails ONNX's checker: {str(exc).splitlines()[0]}"
        return None

    def _condition(self, model, node, needed: list, leaves: set[str]) -> bool:
        """The condition's value at the pinned inputs, from its own nodes alone."""
        from onnx import helper
        from onnx.reference import ReferenceEvaluator

        graph = model.graph
        inits = [i for i in graph.initializer if i.name in leaves]
        feeds = {name: self._pinned_value(model, name) for name in leaves if name in self.pinned}
        inputs = [i for i in graph.input if i.name in feeds]
        sub = helper.make_graph(
            list(needed), "condition", inputs, [helper.make_tensor_value_info(node.input[0], 9, None)], inits
        )
        small = helper.make_model(sub, opset_imports=list(model.opset_import))
        small.ir_version = model.ir_version
        (value,) = ReferenceEvaluator(small).run(None, feeds)
        return bool(np.asarray(value).reshape(-1)[0])

    def _pinned_value(self, model, name: str) -> np.ndarray:
        from onnx import helper

        spec = self.pinned[name]
        shape = [self.dims.get(d, 1) if isinstance(d, str) else d for d in spec.shape]
        value = next(i for i in model.graph.input if i.name == name)
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        return np.full(shape, spec.range[0], dtype=dtype)


def _ancestors(name: str, producers: dict) -> list | None:
    """The nodes `name` is computed from, in graph order, up to graph inputs and initializers; None where one of them
    holds a body (its value is not a plain function of its inputs here)."""
    seen, stack, order = set(), [name], []
    while stack:
        current = stack.pop()
        node = producers.get(current)
        if node is None or id(node) in seen:
            continue
        if any(a.type == a.GRAPH or a.graphs for a in node.attribute):
            return None
        seen.add(id(node))
        order.append(node)
        stack.extend(t for t in node.input if t)
    rank = {id(n): i for i, n in enumerate(producers.values())}
    return sorted(order, key=lambda n: rank.get(id(n), 0))


def _inline(graph, node, body) -> None:
    """Replace `node` (an If) by `body`'s nodes and initializers; each body output passed to the If's output by an
    Identity. Names the body defines that the graph already uses get a prefix, wherever the body reads them; so do
    its nodes' names where missing or taken."""
    from onnx import helper

    at = list(graph.node).index(node)
    graph.node.remove(node)  # first: the names its own branches define are not the graph's
    taken = {t for g in graphs_in(graph) for n in g.node for t in [*n.input, *n.output]}
    taken |= {i.name for i in graph.initializer} | {i.name for i in graph.input} | set(node.output)
    defined = {t for n in body.node for t in n.output if t} | {i.name for i in body.initializer}
    prefix = f"{node.name or node.output[0]}/"
    rename = {name: prefix + name for name in defined if name in taken}
    for inner in graphs_in(body):
        for n in inner.node:
            n.input[:] = [rename.get(t, t) for t in n.input]
            if inner is body:
                n.output[:] = [rename.get(t, t) for t in n.output]
    for init in body.initializer:
        init.name = rename.get(init.name, init.name)
    for value in body.value_info:
        value.name = rename.get(value.name, value.name)
    names = {n.name for g in graphs_in(graph) for n in g.node if n.name}
    for index, inner in enumerate(body.node):  # quantizers address nodes by name: a branch's may have none
        if not inner.name or inner.name in names:
            inner.name = f"{prefix}{inner.name or inner.op_type}_{index}"
    made = list(body.node) + [
        helper.make_node("Identity", [rename.get(o.name, o.name)], [out], name=f"{prefix}output_{i}")
        for i, (o, out) in enumerate(zip(body.output, node.output, strict=True))
        if out
    ]
    for offset, inner in enumerate(made):
        graph.node.insert(at + offset, inner)
    graph.initializer.extend(body.initializer)
    graph.value_info.extend(body.value_info)
