"""The `share-kv-buffer` target pass and the ONNX Runtime target that runs its graph: a Hugging Face Llama's cache
graph, its attention fused by `group-query-attention`, then its cache made one buffer per layer that the kernel
appends to in place. Through the target every caller keeps the cache graph's interface (a past of P positions in,
a present of P + new out) and gets what the graph without the pass computes; its decoder appends in place."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from test_generate import HF_PROJECT

from conftest import run_cli
from tapeout import targets
from tapeout.core.artifact import Artifact
from tapeout.core.decoding import INPUT_IDS, LOGITS, PAST_LENGTH, CacheLayout, feed_back, greedy
from tapeout.core.errors import BadInput
from tapeout.core.schemas import InputSpec
from tapeout.quantize.passes.base import run_on_proto
from tapeout.quantize.passes.group_query_attention import GroupQueryAttention
from tapeout.quantize.passes.share_kv_buffer import ShareKvBuffer

CONTEXT = 64
INPUTS = [
    InputSpec(name="input_ids", shape=[1, "seq"], dtype="int64"),
    InputSpec(name="past_key_0", shape=[1, 2, "past", 16]),
]
DIMS = {"past": CONTEXT - 1}
LAYOUT = CacheLayout(layers=2, kv_heads=2, head_dim=16, vocab=128, max_context=CONTEXT)


def _copy(model):
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """The exported cache graph with its attention fused (ORT's GroupQueryAttention), and the same with its cache
    shared; each with its passes' records."""
    import zoo_models

    tmp = tmp_path_factory.mktemp("share")
    (tmp / "p").mkdir()
    zoo_models.save_hf("llama16", tmp / "p" / "hf")
    (tmp / "p" / "tapeout.toml").write_text(HF_PROJECT.format(context=CONTEXT))
    result = run_cli("export", tmp / "p", "--out", tmp / "fp32.onnx")
    assert result.code == 0, result.err
    exported = onnx.load(tmp / "fp32.onnx")
    fused, fusing = run_on_proto(_copy(exported), [GroupQueryAttention(INPUTS, DIMS)])
    shared, sharing = run_on_proto(_copy(fused), [ShareKvBuffer(INPUTS, DIMS)])
    assert fusing[0]["outcome"] == "applied"
    return {"exported": exported, "fused": fused, "shared": shared, "records": sharing, "dir": tmp}


def _loaded(graphs, name: str):
    path = graphs["dir"] / f"{name}.onnx"
    onnx.save(graphs[name], path)
    target = targets.create("onnxruntime", {"threads": 1})
    return target.session(Artifact("onnxruntime", graphs["dir"], path.name))


def test_the_cache_becomes_one_buffer_of_max_context_per_layer_read_by_the_attention_alone(graphs):
    shared, record = graphs["shared"], graphs["records"][0]
    assert (record["outcome"], record["rewrites"]) == ("applied", 2)  # one attention per layer
    inputs = {i.name: i for i in shared.graph.input}
    assert inputs[PAST_LENGTH].type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert not inputs[PAST_LENGTH].type.tensor_type.shape.dim  # a scalar
    for value in [*shared.graph.input, *shared.graph.output]:
        if value.name.startswith(("past_key", "past_value", "present_")):
            assert value.type.tensor_type.shape.dim[2].dim_value == CONTEXT, value.name
    readers = {n.op_type for n in shared.graph.node for i in n.input if i.startswith(("past_key", "past_value"))}
    assert readers <= {"GroupQueryAttention", "Shape"}


def test_greedy_decoding_through_the_shared_buffer_is_the_fused_graphs_to_the_bit(graphs):
    """Prompts of 8 then 5 tokens through one decoder (the second reuses the first's buffers, whose positions past
    the second prompt still hold the first's keys): every step's logits equal the fused graph's own loop."""
    fused, shared = _loaded(graphs, "fused"), _loaded(graphs, "shared")
    assert PAST_LENGTH not in shared.input_names  # fed by the target; callers see the cache graph's inputs
    decoder = shared.decoder(LAYOUT)
    assert "appended in place" in decoder.description
    rng = np.random.default_rng(0)
    for length in (8, 5):
        prompt = rng.integers(0, LAYOUT.vocab, (1, length))
        expected = greedy(fused.run, LAYOUT, prompt, 12)
        logits = [decoder.prefill(prompt)]
        tokens = [int(logits[-1].argmax())]
        for _ in range(11):
            logits.append(decoder.step(np.array([[tokens[-1]]])))
            tokens.append(int(logits[-1].argmax()))
        assert tokens == expected[0].tolist()
        # the very logits the fused graph computes at each position (the same kernels on the same values)
        out = fused.run(LAYOUT.feeds(prompt, LAYOUT.empty_past(1)))
        np.testing.assert_array_equal(logits[0], out[LOGITS][:, -1])
        for token, got in zip(tokens[:-1], logits[1:], strict=True):
            out = fused.run(LAYOUT.feeds(np.array([[token]]), feed_back(LAYOUT, out)))
            np.testing.assert_array_equal(got, out[LOGITS][:, -1])


def test_a_call_with_a_past_returns_what_the_fused_graph_does_and_one_past_the_buffer_is_one_line(graphs):
    """A call of the cache graph's interface (a past of 8 positions and 5 new tokens: what golden inputs and
    teacher forcing feed) copied into the buffer; the present comes back 13 positions long, as the fused graph's."""
    fused, shared = _loaded(graphs, "fused"), _loaded(graphs, "shared")
    rng = np.random.default_rng(1)
    first = fused.run(LAYOUT.feeds(rng.integers(0, LAYOUT.vocab, (1, 8)), LAYOUT.empty_past(1)))
    feeds = LAYOUT.feeds(rng.integers(0, LAYOUT.vocab, (1, 5)), feed_back(LAYOUT, first))
    expected, got = fused.run(feeds), shared.run(feeds)
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert got[name].shape == value.shape, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    call = shared.bind(feeds)  # what the latency loop times: the same call, appended in place each time
    call()
    call()
    # its outputs, in the order bound: each layer's buffer (past bound as present), then the logits
    bound = [value.numpy() for value in call.args[0].get_outputs()]
    np.testing.assert_array_equal(bound[-1], expected[LOGITS])
    for name, buffer in zip(LAYOUT.present(), bound, strict=False):
        assert buffer.shape[2] == CONTEXT, name
        np.testing.assert_array_equal(buffer[:, :, :13], expected[name], err_msg=name)
    past = {name: np.zeros((1, 2, CONTEXT - 2, 16), np.float32) for name in LAYOUT.past()}
    with pytest.raises(BadInput, match="holds 64 positions and a call asked for 65"):
        shared.run({INPUT_IDS: np.zeros((1, 3), np.int64), **past})
    decoder = shared.decoder(LAYOUT)  # and the loop: a step past the buffer is the same line, not a write past it
    decoder.prefill(np.zeros((1, CONTEXT - 1), np.int64))
    decoder.step(np.zeros((1, 1), np.int64))
    with pytest.raises(BadInput, match="holds 64 positions and a call asked for 65"):
        decoder.step(np.zeros((1, 1), np.int64))


def test_it_leaves_a_cache_read_by_anything_but_the_fused_attention_and_a_project_without_one(graphs):
    # the exported graph's cache is read by its Concat (no fused attention): nothing shared, the reason named
    _, records = run_on_proto(_copy(graphs["exported"]), [ShareKvBuffer(INPUTS, DIMS)])
    assert records[0]["outcome"] == "skipped" and "read by a Concat" in records[0]["reason"]
    _, records = run_on_proto(_copy(graphs["fused"]), [ShareKvBuffer(INPUTS[:1], {})])
    assert records[0]["outcome"] == "skipped" and "not a KV-cache graph" in records[0]["reason"]
    # a graph already shared is left as it is
    _, records = run_on_proto(_copy(graphs["shared"]), [ShareKvBuffer(INPUTS, DIMS)])
    assert records[0]["outcome"] == "skipped"
