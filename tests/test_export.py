"""Export from every source kind, verified against torch with real ONNX Runtime sessions."""

import contextlib
import textwrap

import onnx
import pytest

from conftest import SAMPLES, one_line_error, run_cli

MISMATCH_MODEL = '''
import torch

class TwoHeads(torch.nn.Module):
    """Behaves differently under tracing: the exported graph scales one output by 1.01."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(6, 8)

    def forward(self, x):
        h = self.body(x)
        scores = h * 1.01 if torch.compiler.is_exporting() else h
        return {"embedding": torch.tanh(h), "scores": scores}

def build():
    return TwoHeads().eval()
'''

PROJECT = """
[model]
source = "{source}"
{extra}
[[inputs]]
name = "x"
shape = ["batch", 6]
range = [-1.0, 1.0]

[dims]
batch = 1
"""


def make_project(tmp_path, source, extra="", files=None):
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "tapeout.toml").write_text(PROJECT.format(source=source, extra=extra))
    return tmp_path


def test_mismatch_fails_and_names_the_output(tmp_path):
    project = make_project(tmp_path, "model.py:build", files={"model.py": MISMATCH_MODEL})
    result = run_cli("export", project, "--out", tmp_path / "out.onnx")
    assert result.code == 2
    line = one_line_error(result)
    assert "'scores'" in line and "'embedding'" not in line and "1 of 2 outputs" in line
    assert not (tmp_path / "out.onnx").exists()  # nothing half-written


def test_digits_export_pins_ir_version_and_verifies(tmp_path):
    out = tmp_path / "digits.onnx"
    result = run_cli("export", SAMPLES / "digits-cnn", "--out", out, "--json")
    assert result.code == 0, result.err
    info = result.json()
    assert info["exporter"] == "dynamo" and info["dynamic_dims"] == ["batch"]
    assert info["parity"][0]["output"] == "logits" and info["parity"][0]["within_tolerance"]
    model = onnx.load(str(out))
    assert model.ir_version <= 13  # what onnxruntime 1.31 accepts
    assert [i.name for i in model.graph.input] == ["image"]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


@pytest.mark.slow
def test_hugging_face_directory_source(tmp_path):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    BertModel(config).eval().save_pretrained(tmp_path / "tiny-bert")
    (tmp_path / "tapeout.toml").write_text(
        textwrap.dedent("""
        [model]
        source = "tiny-bert"
        [[inputs]]
        name = "input_ids"
        shape = ["batch", "sequence"]
        dtype = "int64"
        range = [0, 119]
        [[inputs]]
        name = "attention_mask"
        shape = ["batch", "sequence"]
        dtype = "int64"
        range = [1, 1]
        [dims]
        batch = 1
        sequence = 16
    """)
    )
    result = run_cli("export", tmp_path, "--out", tmp_path / "bert.onnx", "--json")
    assert result.code == 0, result.err
    info = result.json()
    assert info["output_names"] == ["output"] and info["parity"][0]["cosine"] > 0.99999
    dims = [d.dim_param for d in onnx.load(str(tmp_path / "bert.onnx")).graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "sequence"]


def test_pt2_source(tmp_path):
    import torch

    module = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU()).eval()
    program = torch.export.export(module, (torch.randn(2, 6),))
    torch.export.save(program, str(tmp_path / "model.pt2"))
    (tmp_path / "tapeout.toml").write_text('[model]\nsource = "model.pt2"\n[[inputs]]\nname = "x"\nshape = [2, 6]\n')
    result = run_cli("export", tmp_path, "--out", tmp_path / "pt2.onnx", "--json")
    assert result.code == 0, result.err
    assert result.json()["parity"][0]["within_tolerance"]


def test_onnx_source_builds_and_shape_mismatch_is_named(tmp_path, fast_profile, digits_build):
    onnx_file = digits_build / "export" / "model.onnx"
    (tmp_path / "m.onnx").write_bytes(onnx_file.read_bytes())
    (tmp_path / "tapeout.toml").write_text(
        textwrap.dedent("""
        [model]
        source = "m.onnx"
        [[inputs]]
        name = "image"
        shape = [1, 1, 8, 8]
    """)
    )
    result = run_cli("build", tmp_path, "--profile", fast_profile, "--out", tmp_path / "b", "--json")
    assert result.code == 0, result.err
    assert result.json()["golden"]["reference"].startswith("the source ONNX model")

    (tmp_path / "tapeout.toml").write_text(
        textwrap.dedent("""
        [model]
        source = "m.onnx"
        [[inputs]]
        name = "image"
        shape = [1, 1, 8, 9]
    """)
    )
    result = run_cli("build", tmp_path, "--profile", fast_profile, "--out", tmp_path / "c")
    assert result.code == 2
    line = one_line_error(result)
    assert "'image' axis 3 is fixed to 8" in line and "set axis 3" in line
    assert not (tmp_path / "c").exists()


def test_malformed_onnx_is_one_line(tmp_path, fast_profile):
    (tmp_path / "m.onnx").write_bytes(b"this is not a protobuf")
    (tmp_path / "tapeout.toml").write_text('[model]\nsource = "m.onnx"\n[[inputs]]\nname = "x"\nshape = [1]\n')
    result = run_cli("build", tmp_path, "--profile", fast_profile, "--out", tmp_path / "b")
    assert result.code == 2
    assert "m.onnx" in one_line_error(result)
    assert not (tmp_path / "b").exists()


BRANCHY_MODEL = '''
import torch

class Branchy(torch.nn.Module):
    """A data-dependent Python branch: torch.export refuses it; TorchScript tracing records the path taken."""

    def __init__(self, threshold):
        super().__init__()
        torch.manual_seed(0)
        self.threshold = threshold
        self.body = torch.nn.Linear(6, 4)

    def forward(self, x):
        if x.max() > self.threshold:
            return self.body(x)
        return -self.body(x)

def always_first():
    return Branchy(-10.0).eval()   # inputs lie in [-1, 1]: the first branch, always

def input_dependent():
    return Branchy(0.9).eval()     # which branch depends on the input
'''


def test_dynamo_failure_falls_back_to_torchscript_and_says_why(tmp_path):
    project = make_project(tmp_path, "branchy.py:always_first", files={"branchy.py": BRANCHY_MODEL})
    result = run_cli("export", project, "--out", tmp_path / "o.onnx")
    assert result.code == 0, result.err
    assert "dynamo exporter failed (GuardOnDataDependentSymNode" in " ".join(result.err.split())
    assert "(torchscript" in result.out


def test_fallback_that_froze_the_wrong_branch_is_caught(tmp_path):
    project = make_project(
        tmp_path, "branchy.py:input_dependent", extra="[export]\nsamples = 16", files={"branchy.py": BRANCHY_MODEL}
    )
    result = run_cli("export", project, "--out", tmp_path / "o.onnx")
    assert result.code == 2
    assert "'output' differs from torch beyond tolerance" in one_line_error(result)


def test_module_callable_source(tmp_path):
    # `package.module:callable`, importable from the project directory
    project = make_project(tmp_path, "branchy:always_first", files={"branchy.py": BRANCHY_MODEL})
    result = run_cli("export", project, "--out", tmp_path / "o.onnx", "--json")
    assert result.code == 0, result.err
    assert result.json()["exporter"] == "torchscript"


def test_lint_lists_every_problem_of_an_onnx_source(tmp_path, digits_build):
    (tmp_path / "m.onnx").write_bytes((digits_build / "export" / "model.onnx").read_bytes())
    (tmp_path / "tapeout.toml").write_text(
        textwrap.dedent("""
        [model]
        source = "m.onnx"
        [[inputs]]
        name = "image"
        shape = [1, 1, 8, 9]
        dtype = "int64"
    """)
    )
    result = run_cli("lint", tmp_path)
    assert result.code == 2
    assert "'image' is float32 in the model but int64" in result.out
    assert "axis 3 is fixed to 8" in result.out
    assert "2 error(s)" in result.out


HF_HEADS = {
    # architecture class → (config kwargs, output shape): the head's logits, not the backbone's hidden state
    "DistilBertForSequenceClassification": (
        "DistilBertConfig",
        dict(vocab_size=100, dim=32, n_layers=1, n_heads=2, hidden_dim=64, num_labels=3),
        [1, 3],
    ),
    "GPT2LMHeadModel": (
        "GPT2Config",
        dict(vocab_size=100, n_embd=32, n_layer=1, n_head=2, n_positions=32),
        [1, 8, 100],
    ),
}


# GPT-2 in the full suite only (the generate tests export GPT-2 again); the fast subset keeps DistilBERT
@pytest.mark.parametrize(
    "architecture", [pytest.param(a, marks=pytest.mark.slow) if a == "GPT2LMHeadModel" else a for a in HF_HEADS]
)
def test_hugging_face_directories_keep_their_task_head(tmp_path, architecture):
    import torch
    import transformers

    config_name, kwargs, shape = HF_HEADS[architecture]
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(getattr(transformers, config_name)(**kwargs)).eval()
    model.save_pretrained(tmp_path / "hf")
    (tmp_path / "tapeout.toml").write_text(
        '[model]\nsource = "hf"\noutputs = ["logits"]\n\n[[inputs]]\n'
        'name = "input_ids"\nshape = [1, 8]\ndtype = "int64"\nrange = [0, 99]\n'
    )
    result = run_cli("export", tmp_path, "--out", tmp_path / "m.onnx", "--json")
    assert result.code == 0, result.err
    out = onnx.load(str(tmp_path / "m.onnx")).graph.output[0]
    assert [d.dim_value for d in out.type.tensor_type.shape.dim] == shape  # AutoModel gave [1, 8, hidden]
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(1))
    import onnxruntime as ort

    got = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"input_ids": ids.numpy()}
    )[0]
    with torch.no_grad():
        want = model(input_ids=ids).logits.numpy()
    assert abs(got - want).max() < 1e-4  # the model saved, head included, not a re-initialised one
    if architecture == "GPT2LMHeadModel":  # a directory's config backs detection as a module's does
        family = run_cli("analyze", tmp_path, "--json").json()["families"][0]
        assert family["family"] == "decoder-llm" and "Hugging Face config model_type = 'gpt2'" in family["evidence"]


def test_a_hugging_face_directory_without_architectures_loads_the_backbone_and_says_so(tmp_path):
    import json

    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    BertModel(
        BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    ).eval().save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config.pop("architectures", None)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    (tmp_path / "tapeout.toml").write_text(
        '[model]\nsource = "hf"\n\n[[inputs]]\nname = "input_ids"\nshape = [1, 4]\ndtype = "int64"\nrange = [0, 49]\n'
    )
    result = run_cli("export", tmp_path, "--out", tmp_path / "m.onnx")
    assert result.code == 0, result.err
    assert "names no architecture: loaded the bare model" in result.err


def test_the_rewrite_rules_tried_by_first_op_give_the_exporters_own_model_byte_for_byte():
    """The exporter's optimization with its rewrite rules tried only on nodes of their pattern's first op gives the
    very model its own optimization gives, on a decoder with attention, rotary positions, norms and a KV cache, and
    tries far fewer nodes."""
    import onnx_ir as ir
    import torch
    import transformers
    from onnxscript._framework_apis.torch_2_8 import optimize
    from onnxscript.rewriter import _rewrite_rule

    from tapeout.exporters import torch_onnx

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    from tapeout.exporters import generation, hf

    graph = generation.cache_graph(hf.decoder(transformers.LlamaForCausalLM(config).eval(), "hf"))
    past = [torch.zeros(1, 2, 4, 8) for _ in range(4)]  # two layers' keys and values: four cached tokens
    program = torch.onnx.export(graph, (torch.randint(0, 64, (1, 3)), *past), dynamo=True, optimize=False)
    raw = ir.serde.serialize_model(program.model)
    counted = {"tries": 0}
    tries = _rewrite_rule.RewriteRule.try_rewrite

    def counting(self, *args, **kwargs):
        counted["tries"] += 1
        return tries(self, *args, **kwargs)

    optimized = {}
    for guarded in (False, True):
        model_ir = ir.serde.deserialize_model(raw)
        counted["tries"] = 0
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_rewrite_rule.RewriteRule, "try_rewrite", counting)
            with torch_onnx._rules_by_first_op() if guarded else contextlib.nullcontext():
                optimize(model_ir)
        optimized[guarded] = (ir.serde.serialize_model(model_ir).SerializeToString(), counted["tries"])
    assert optimized[True][0] == optimized[False][0]
    assert optimized[True][1] < optimized[False][1] / 5  # the matcher ran on a fifth of the nodes or fewer


def test_a_model_is_saved_as_the_bytes_protobuf_gives_without_a_serialized_copy_in_memory(tmp_path):
    """The ONNX file of a model under the protobuf limit is exactly `SerializeToString()`'s bytes (a model with
    metadata, value_info, a control-flow body and several initializers), written without that copy: the largest
    Python allocation while saving is about one weight, not the model."""
    import tracemalloc

    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from tapeout.core.onnx_graphs import save_model

    weights = [numpy_helper.from_array(np.full((1024, 1024), i, np.float32), f"w{i}") for i in range(8)]  # 32 MB
    branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y_then"])],
        "then",
        [],
        [helper.make_tensor_value_info("y_then", 1, None)],
    )
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"], [f"h{i}"]) for i in range(8)]
    nodes.append(helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch))
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024]),
            helper.make_tensor_value_info("cond", 9, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=weights,
        value_info=[helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, 1024])],
        doc_string="after the initializers",
    )
    model = helper.make_model(graph, producer_name="test", opset_imports=[helper.make_opsetid("", 17)])
    helper.set_model_props(model, {"origin": "test"})
    expected = model.SerializeToString()
    tracemalloc.start()
    save_model(model, tmp_path / "model.onnx")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert (tmp_path / "model.onnx").read_bytes() == expected
    assert peak < 3 * 4 * 2**20  # a weight is 4 MiB; the whole model 32 MiB
    assert onnx.load(str(tmp_path / "model.onnx")) == model
