"""Pass `localize-body-weights`: a weight that only a control-flow body reads (an If branch, a Loop or Scan body)
moves from the enclosing graph's initializers into that body's, so a quantizer working on the body finds it.

torch's exporter writes the weights of a torch.cond branch as initializers of the main graph, read from the
branch by outer-scope reference: a VAD whose conv front-end is chosen by an If on the sample rate exports so.
ONNX Runtime's dynamic quantizer reaches into bodies (EnableSubgraph) and finds outer-scope weights for most ops,
but its ConvInteger looks a Conv's weight up in the body's own initializers only ("Expected … to be an
initializer", onnxruntime 1.32), so every Conv with a bias inside a branch stayed float. Moving changes no
value and copies nothing: only a weight read by a planned node, and by nothing outside the one body that
reads it, moves (a weight two branches share stays where it is).
"""

from __future__ import annotations

from collections.abc import Iterator

from tapeout.quantize.passes.base import GraphPass

_BODIES = ("then_branch", "else_branch", "body")


def _bodies(graph) -> Iterator[tuple[object, object]]:
    """(node, body graph) for each control-flow body directly in `graph`."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.name in _BODIES and attr.HasField("g"):
                yield node, attr.g


def _reads(graph) -> set[str]:
    """Every name read by a node in `graph` or in any body nested in it."""
    names = {name for node in graph.node for name in node.input if name}
    for _, body in _bodies(graph):
        names |= _reads(body)
    return names


def _planned_reads(graph, nodes: set[str]) -> set[str]:
    """The names the planned nodes in `graph` and its nested bodies read."""
    names = {name for node in graph.node if node.name in nodes for name in node.input if name}
    for _, body in _bodies(graph):
        names |= _planned_reads(body, nodes)
    return names


class LocalizeBodyWeights(GraphPass):
    name = "localize-body-weights"
    stage = "method"
    works_on = "proto"
    nothing_matched = "no planned node in a control-flow body reads a weight of the graph around it"

    def __init__(self, nodes: set[str]):
        self.nodes = set(nodes)  # the planned nodes: only their weights move
        self.moved: dict[str, str] = {}  # weight -> the node whose body it moved into

    def match(self, model) -> list[tuple[object, object, str]]:
        return list(self._matches(model.graph))

    def _matches(self, graph) -> Iterator[tuple[object, object, str]]:
        """(enclosing graph, body, weight) for each weight of `graph` that one body alone reads, a planned node in it
        among the readers; then the same inside each body."""
        own = {init.name for init in graph.initializer}
        outside = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
        bodies = list(_bodies(graph))
        reads = [_reads(body) for _, body in bodies]
        for i, (_, body) in enumerate(bodies):
            others = set().union(*(r for j, r in enumerate(reads) if j != i))
            for name in sorted((_planned_reads(body, self.nodes) & own) - outside - others):
                yield graph, body, name
        for _, body in bodies:
            yield from self._matches(body)

    def rewrite(self, model, matches: list) -> int:
        moved = 0
        while matches:  # a weight read two bodies down moves one level at a time
            moved += self._move(model, matches)
            matches = self.match(model)
        return moved

    def _move(self, model, matches: list) -> int:
        bodies = {id(body): node.name for graph in self._graphs(model.graph) for node, body in _bodies(graph)}
        for graph, body, name in matches:
            index = next(i for i, init in enumerate(graph.initializer) if init.name == name)
            weight = graph.initializer.pop(index)
            body.initializer.append(weight)
            # an IR < 4 model also lists its initializers among the graph inputs
            kept = [v for v in graph.input if v.name != name]
            if len(kept) != len(graph.input):
                del graph.input[:]
                graph.input.extend(kept)
            self.moved[name] = bodies.get(id(body), "")
        return len(matches)

    def _graphs(self, graph) -> Iterator[object]:
        yield graph
        for _, body in _bodies(graph):
            yield from self._graphs(body)

    def postcondition(self, model) -> str | None:
        holders: dict[str, int] = {}
        for graph in self._graphs(model.graph):
            for init in graph.initializer:
                holders[init.name] = holders.get(init.name, 0) + 1
        twice = sorted(name for name in self.moved if holders.get(name) != 1)
        return f"weights held by more than one graph, or by none: {', '.join(twice)}" if twice else None
