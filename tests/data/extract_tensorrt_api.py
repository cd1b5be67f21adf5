"""Regenerate tensorrt-api-10.13.json: the TensorRT Python API surface the stand-in (tests/trt_standin.py)
allows, from the type stubs NVIDIA's bindings are described by.

    pip download --no-deps tensorrt-stubs==10.13.0.35.1 && unzip tensorrt_stubs-*.whl -d stubs
    python tests/data/extract_tensorrt_api.py stubs/tensorrt_bindings/tensorrt.pyi tests/data/tensorrt-api-10.13.json

(`pip install tensorrt-stubs` pulls the TensorRT libs, which this CI cannot download: hence the wheel.)
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path


def parse(source: str) -> ast.Module:
    """The stubs hold signatures Python rejects (a keyword as a parameter name, a non-default parameter after
    defaults): patch each offending line until the file parses; no other name changes."""
    lines = source.split("\n")
    for _ in range(500):
        try:
            return ast.parse("\n".join(lines))
        except SyntaxError as exc:
            i = (exc.lineno or 1) - 1
            line = re.sub(
                r"\b(in|from|lambda|is|and|or|not|class|def|return|pass|import|global)(\s*:)", r"\1_\2", lines[i]
            )
            if line == lines[i]:
                line = re.sub(r"(\w+: [\w\.\[\], ]+)\)", r"\1 = ...)", line)
            if line == lines[i]:
                raise
            lines[i] = line
    raise SyntaxError("the stubs did not parse after 500 patched lines")


def signature(fn: ast.FunctionDef) -> dict:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args]
    if names and names[0] in ("self", "this"):
        names = names[1:]
    return {
        "params": names,
        "defaults": len(a.defaults),
        "kwonly": [x.arg for x in a.kwonlyargs],
        "varargs": bool(a.vararg or a.kwarg),
    }


def members_of(node: ast.ClassDef) -> dict:
    members: dict[str, dict] = {}
    for b in node.body:
        if isinstance(b, ast.FunctionDef):
            if b.name.startswith("__") and b.name != "__init__":
                continue
            if any(
                (isinstance(d, ast.Name) and d.id == "property")
                or (isinstance(d, ast.Attribute) and d.attr == "setter")
                for d in b.decorator_list
            ):
                members[b.name] = {"kind": "property"}
            elif members.get(b.name, {}).get("kind") == "method":
                members[b.name]["overloads"].append(signature(b))  # overloads: every arity is allowed
            else:
                members[b.name] = {"kind": "method", "overloads": [signature(b)]}
        elif isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name):
            kind = "enum" if ast.unparse(b.annotation).startswith("typing.ClassVar") else "attribute"
            members[b.target.id] = {"kind": kind}
    return members


def main(stub: Path, out: Path) -> None:
    tree = parse(stub.read_text())
    api: dict[str, dict] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            api[node.name] = {"bases": [ast.unparse(x) for x in node.bases], "members": members_of(node)}
        elif isinstance(node, ast.FunctionDef):
            module = api.setdefault("<module>", {"bases": [], "members": {}})
            module["members"][node.name] = {"kind": "function", "overloads": [signature(node)]}
    data = {
        "about": "The TensorRT Python API surface (classes; methods with their parameter names; properties; enum "
        "members) extracted with Python's ast from tensorrt_bindings/tensorrt.pyi in the tensorrt-stubs "
        "10.13.0.35.1 wheel (PyPI), for the stand-in module in tests/trt_standin.py. The TensorRT 11 "
        "removals are applied there, from shared/research/nvidia.md 1.4.",
        "version": "10.13.0.35",
        "api": api,
    }
    out.write_text(json.dumps(data, separators=(",", ":"), sort_keys=True))
    print(f"{len(api)} classes written to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
