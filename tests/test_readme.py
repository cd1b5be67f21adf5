"""The README a newcomer reads: short, its links resolve, and its quickstart runs as written on a model of the
reader's own (one this test writes, not a shipped sample)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def block(marker: str) -> list[str]:
    """The command lines of the bash block after `<!-- marker -->`, comments cut."""
    text = README.read_text(encoding="utf-8")
    after = text.split(f"<!-- {marker} -->\n", 1)[1]
    body = after.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #")[0].strip() for line in body.splitlines() if line.strip()]


def test_the_readme_is_short_and_its_links_resolve():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    assert block("main-command") and block("test-command") and block("quickstart")
    links = re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)(#[\w-]+)?\)", text)
    assert links
    for path, anchor in links:
        page = ROOT / path
        assert page.is_file(), path
        if anchor:
            headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
            slugs = {re.sub(r"[^\w -]", "", h).strip().lower().replace(" ", "-") for h in headings}
            assert anchor[1:] in slugs, f"{path}{anchor}"


def test_docs_link_only_to_pages_that_exist():
    for page in (ROOT / "docs").glob("*.md"):
        for target in re.findall(r"\]\(([\w./-]+\.md)(?:#[\w-]+)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).is_file(), f"{page.name} → {target}"


def write_mlp(path: Path) -> None:
    """A two-layer MLP with a symbolic batch, as a user's own export would be."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(0, 0.2, shape).astype(np.float32), name)
        for name, shape in (("w1", (64, 128)), ("b1", (128,)), ("w2", (128, 10)), ("b2", (10,)))
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["o"]),
        helper.make_node("Add", ["o", "b2"], ["scores"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 10])],
        weights,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.slow
def test_the_quickstart_runs_as_written_on_a_model_the_test_writes(tmp_path):
    write_mlp(tmp_path / "model.onnx")
    for line in block("quickstart"):
        argv = line.split()
        assert argv[0] == "tapeout", line
        result = run_cli(*argv[1:], cwd=tmp_path)
        assert result.code == 0, f"{line}: {result.err[-2000:]}"
    project = (tmp_path / "tapeout.toml").read_text()
    assert 'source = "model.onnx"' in project and "batch = 1" in project and "# latency_p50_ms" in project
    assert (tmp_path / "build" / "cpu-int8" / "check.json").is_file()
    assert "cpu-fp32" in result.out and "cpu-int8" in result.out  # compare's table names both builds

    # a budget uncommented in the project file is judged, and the report says where it came from
    (tmp_path / "tapeout.toml").write_text(project.replace("# latency_p50_ms = 10", "latency_p50_ms = 1000"))
    built = run_cli("build", ".", "-p", "cpu-fp32", "--out", "with-budget", cwd=tmp_path)
    assert built.code == 0, built.err[-2000:]
    report = (tmp_path / "with-budget" / "report.md").read_text()
    assert "latency_p50_ms" in report and "From the project file: latency_p50_ms" in report
