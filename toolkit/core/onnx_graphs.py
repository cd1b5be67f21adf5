"""The control-flow bodies of an ONNX graph: the graphs an If, Loop or Scan node holds as attributes.

Every walk that must see the whole model (analysis, the Gemm rewrite, postconditions, constant
folding, external-data discovery) goes through these two functions, nested bodies included.
"""

from __future__ import annotations


def bodies(node) -> list[tuple[str, object]]:
    """(attribute name, graph) for each body `node` holds: an If's two branches, a Loop's or Scan's body."""
    return [(attr.name, graph) for attr in node.attribute
            for graph in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)]


def graphs_in(graph):
    """`graph`, then every body in it, nested ones included, outermost first."""
    yield graph
    for node in graph.node:
        for _, body in bodies(node):
            yield from graphs_in(body)
