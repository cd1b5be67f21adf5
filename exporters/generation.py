"""Export for `[workload] kind = "generate"`: a decoder with its KV cache as graph inputs and outputs.

A user module follows this signature (samples/tiny-lm/model.py is one):

    forward(input_ids, *past) -> (logits, *present)
        input_ids  int64 [batch, seq]
        past       per layer a key and a value, [batch, kv_heads, past_len, head_dim] (past_len may be 0)
        logits     [batch, seq, vocab]
        present    per layer the key and value after this call, [batch, kv_heads, past_len + seq, head_dim]
    forward(input_ids) -> logits           (no past: the plain forward over the whole sequence)
    module.generation = {"layers": L, "kv_heads": H, "head_dim": D, "vocab": V, "max_context": C}

Positions are past_len .. past_len + seq - 1. For a runtime that pads prompts to static shapes and masks the padding
itself (OpenVINO's NPU pipeline) the graph also takes the positions and the mask (core/decoding.py); a user module
serves it by accepting them as keywords:

    forward(input_ids, *past, attention_mask=None, position_ids=None)
        attention_mask  int64 [batch, past_len + seq], 0 where a position is padding
        position_ids    int64 [batch, seq]

A Hugging Face causal LM (transformers' Llama, Qwen, Phi, Gemma,
GPT-2 classes) is wrapped into the same signature around transformers' own DynamicCache. tapeout exports one
graph for prefill and decode (core/decoding.py names its inputs and outputs) with logits for the last position
only, and verifies it against torch by greedy decoding several prompts and comparing every step's logits with
the plain forward over the whole sequence: a cache that is wrong anywhere shows as a divergence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tapeout.core.decoding import ATTENTION_MASK, INPUT_IDS, LOGITS, POSITION_IDS, CacheLayout, feed_back, greedy
from tapeout.core.errors import BadInput, ExportMismatch, user_code
from tapeout.core.heap import return_freed_memory
from tapeout.core.schemas import GenerateWorkload, InputSpec, Project

LAYOUT_KEYS = ("layers", "kv_heads", "head_dim", "vocab", "max_context")
FIX_SIGNATURE = (
    "follow the generation signature in the docs (docs/workloads.md): forward(input_ids, *past) -> "
    "(logits, *present) and module.generation = {layers, kv_heads, head_dim, vocab, max_context}"
)


def decoder_of(module, source: str, masked: bool = False, target: str = ""):
    """The decoder in the generation signature: a user module as it is; a Hugging Face causal LM wrapped around
    transformers' cache (exporters/hf.py). `masked`: the target feeds the mask and the positions, so the module must
    take them."""
    if getattr(module, "hugging_face", False):
        from tapeout.exporters import hf

        return hf.decoder(module.inner, source)
    if masked:
        import inspect

        parameters = inspect.signature(module.forward).parameters
        if not {ATTENTION_MASK, POSITION_IDS} <= set(parameters):
            raise BadInput(
                f"target '{target}' pads prompts to static shapes and feeds attention_mask and position_ids, "
                f"and [model] source {source} takes neither",
                fix="add the keywords attention_mask=None, position_ids=None to its forward "
                "(docs/workloads.md), or use a target with dynamic shapes",
            )
    return module


def layout_of(module, workload: GenerateWorkload, source: str, masked: bool = False) -> CacheLayout:
    """The decoder's cache layout from its `generation` attribute (a user module) or its config (Hugging Face)."""
    config = getattr(module, "generation", None)
    if not isinstance(config, dict):
        raise BadInput(
            f"[model] source {source} has no `generation` attribute: a generate workload needs a decoder "
            "that carries its KV cache",
            fix=FIX_SIGNATURE,
        )
    missing = [k for k in LAYOUT_KEYS if not isinstance(config.get(k), int) or config[k] < 1]
    if missing:
        raise BadInput(
            f"[model] source {source}: generation = {config} lacks positive integers for {', '.join(missing)}",
            fix=FIX_SIGNATURE,
        )
    layout = CacheLayout(**{k: int(config[k]) for k in LAYOUT_KEYS})
    if workload.max_context > layout.max_context:
        raise BadInput(
            f"[workload] max_context = {workload.max_context} is longer than the model's own context "
            f"({layout.max_context} tokens, from {source})",
            fix=f"set [workload] max_context <= {layout.max_context} and shorten prompt_lengths/new_tokens",
        )
    return CacheLayout(
        layout.layers,
        layout.kv_heads,
        layout.head_dim,
        layout.vocab,
        workload.max_context,
        masked=masked,
        max_prompt=workload.longest_prompt,
    )


def cache_graph(decoder, masked: bool = False):
    """The module exported: the decoder's step with logits for the last position only (all that decoding reads);
    `masked`, with the mask and the positions as inputs after the token ids."""
    import torch

    class CacheGraph(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, *past):
            logits, *present = self.inner(input_ids, *past)
            return (logits[:, -1:, :], *present)

    class MaskedCacheGraph(CacheGraph):
        def forward(self, input_ids, attention_mask, position_ids, *past):
            logits, *present = self.inner(input_ids, *past, attention_mask=attention_mask, position_ids=position_ids)
            return (logits[:, -1:, :], *present)

    return (MaskedCacheGraph if masked else CacheGraph)(decoder).eval()


def graph_inputs(spec: InputSpec, layout: CacheLayout) -> list[InputSpec]:
    """The graph's inputs: the token ids (the project's own entry, range set to the vocabulary), then the cache."""
    ids = InputSpec(
        name=INPUT_IDS,
        shape=[spec.shape[0] if isinstance(spec.shape[0], str) else "batch", "seq"],
        dtype="int64",
        range=(0, layout.vocab - 1),
    )
    cache = [
        InputSpec(name=n, shape=[ids.shape[0], layout.kv_heads, "past", layout.head_dim], dtype=layout.dtype)
        for n in layout.past()
    ]
    if not layout.masked:
        return [ids, *cache]
    # what random samples of them hold is what decoding feeds: every position real, positions within the context
    mask = InputSpec(name=ATTENTION_MASK, shape=[ids.shape[0], "context"], dtype="int64", range=(1, 1))
    positions = InputSpec(
        name=POSITION_IDS, shape=[ids.shape[0], "seq"], dtype="int64", range=(0, layout.max_context - 1)
    )
    return [ids, mask, positions, *cache]


def graph_project(project: Project, layout: CacheLayout) -> Project:
    """The project as the export and every later step see it: the cache graph's inputs, at one decode step at
    the maximum context (the forward the per-call figures, the golden samples and the estimate describe)."""
    workload = project.workload
    assert isinstance(workload, GenerateWorkload)
    inputs = graph_inputs(project.inputs[0], layout)
    batch_dim = inputs[0].shape[0]
    dims = {
        **project.dims,
        batch_dim: workload.batch,
        "seq": 1,
        "past": workload.max_context - 1,
        **({"context": workload.max_context} if layout.masked else {}),
    }
    return project.model_copy(update={"inputs": inputs, "dims": dims, "calibration": None})


def export_dims(graph: Project) -> dict[str, int]:
    """Small shapes to trace and spot-check the export at (the verification by decoding covers real lengths)."""
    return {**graph.dims, "seq": 3, "past": 5, **({"context": 8} if "context" in graph.dims else {})}


@dataclass
class Verification:
    prompts: int
    tokens: int
    max_abs: float  # worst |logit difference| over every compared step
    ties: int  # steps where the reference's top two logits were within tolerance (a swap is noise)

    def to_json(self) -> dict:
        return {
            "prompts": self.prompts,
            "tokens_per_prompt": self.tokens,
            "max_abs_logit_diff": self.max_abs,
            "near_ties": self.ties,
            "method": "greedy decoding through the cache (ONNX Runtime CPU), every step's "
            "logits compared with the decoder's plain forward over the whole sequence (torch, one call a prompt, "
            "teacher-forced on the graph's tokens); the greedy tokens are the generate step's reference",
        }


def torch_step(graph_module, layout: CacheLayout) -> Callable:
    """The torch cache graph as a one-step callable on feeds named as the ONNX graph's (core/decoding.py's loops)."""
    import torch

    names = layout.inputs()

    def step(feeds):
        args = [torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in names]
        with torch.inference_mode(), user_code("the decoder's forward with its cache"):
            out = graph_module(*args)
        return {name: t.numpy() for name, t in zip(layout.outputs(), out, strict=True)}

    return step


def plain_forward(graph_module) -> Callable:
    """The decoder's plain forward over whole sequences as a metric's predict: every position's logits, as the
    cache loops return them (core/decoding.teacher_forced). The FP32 reference's metric: one call a sequence where
    the cache takes one a token (tiny-lm's 64 windows: about 14× faster than token by token), and
    the model as it was trained, so a cache path that lost accuracy shows as the artifact's drop, not the
    reference's."""
    import torch

    decoder = graph_module.inner

    def predict(feeds):
        ids = torch.from_numpy(np.ascontiguousarray(feeds[INPUT_IDS]).astype(np.int64))
        with torch.inference_mode(), user_code("the decoder's plain forward (no cache)"):
            full = decoder(ids)
        return {LOGITS: (full[0] if isinstance(full, tuple | list) else full).numpy()}

    return predict


def verify(
    decoder,
    onnx_path: Path,
    layout: CacheLayout,
    prompts: list[np.ndarray],
    tokens: int,
    atol: float,
    rtol: float,
    progress: Callable[[int, int], None] = lambda _done, _total: None,
) -> tuple[Verification, np.ndarray]:
    """Greedy decode each prompt through the exported cache graph, then check every step against one call of the
    decoder's plain forward over the whole sequence (torch, teacher-forced on the graph's tokens): the logits within
    tolerance at every position, and each token the plain forward's own choice. A token that differs where the
    reference's choice was clear (its top two logits further apart than the tolerance) fails the export; at a near
    tie the reference's token is taken and the graph decodes on from it. Returns the verification and the torch
    model's greedy tokens [prompts, tokens]: the reference a generate build judges agreement against, made here in
    one torch call a prompt where stepping torch through its cache took one a token."""
    import onnxruntime as ort
    import torch

    from tapeout.exporters.torch_onnx import verification_options

    sess = ort.InferenceSession(str(onnx_path), verification_options(arena=False), providers=["CPUExecutionProvider"])
    names = layout.outputs()

    def onnx_step(feeds):
        return dict(zip(names, sess.run(names, feeds), strict=True))

    def decode(prefix: np.ndarray, count: int) -> tuple[list[int], list[np.ndarray]]:
        """`count` greedy tokens after `prefix` through the graph, and the logits each was chosen from."""
        out = onnx_step(layout.feeds(prefix[None].astype(np.int64), layout.empty_past(1)))
        chosen, logits = [], []
        for i in range(count):
            logits.append(out[LOGITS][0, -1])
            chosen.append(int(logits[-1].argmax()))
            if i + 1 < count:
                out = onnx_step(layout.feeds(np.array([[chosen[-1]]], np.int64), feed_back(layout, out)))
        return chosen, logits

    worst, ties, greedy_tokens = 0.0, 0, []
    for p, prompt in enumerate(prompts):
        progress(p, len(prompts))
        fixed: list[int] = []  # tokens settled as the reference's own, up to a near tie the graph resolved otherwise
        while True:
            chosen, logits = decode(np.concatenate([prompt, np.asarray(fixed, np.int64)]), tokens - len(fixed))
            sequence = [*fixed, *chosen]
            ids = torch.from_numpy(np.concatenate([prompt, np.asarray(sequence[:-1], np.int64)])[None])
            with torch.inference_mode(), user_code("the decoder's plain forward (no cache)"):
                full = decoder(ids)
            # a copy of the compared positions only: the whole sequence's logits (155 MB at 0.5 B) go at once
            ref_all = np.array((full[0] if isinstance(full, tuple | list) else full)[0, len(prompt) - 1 :].float())
            del full
            resumed = False
            for i in range(len(fixed), tokens):
                ref, got = ref_all[i], logits[i - len(fixed)]
                diff = np.abs(ref - got)
                worst = max(worst, float(diff.max()))
                if not np.all(diff <= atol + rtol * np.abs(ref)):
                    raise ExportMismatch(
                        f"the exported cache graph drifts from the plain forward: prompt {p + 1} of {len(prompts)}, "
                        f"token {i + 1}: max-abs logit difference {diff.max():.3g} (atol {atol:g}, rtol {rtol:g})",
                        fix="check that positions start at past_len and that present = past + this call's keys/values "
                        "(docs/workloads.md), or loosen [export] atol/rtol if the difference is float noise",
                    )
                want = int(ref.argmax())
                if sequence[i] != want:
                    top2 = np.sort(ref)[-2:]
                    if top2[1] - top2[0] > atol + rtol * abs(top2[1]):
                        raise ExportMismatch(
                            f"the exported cache graph chose token {sequence[i]} where torch chose "
                            f"{want} (prompt {p + 1}, step {i + 1})",
                            fix=FIX_SIGNATURE,
                        )
                    ties += 1
                    fixed = [*sequence[:i], want]  # follow the reference so the comparison stays on its sequence
                    resumed = True
                    break
            if not resumed or len(fixed) == tokens:
                greedy_tokens.append(fixed if resumed else sequence)
                break
        del logits, ref_all  # before the next prompt's decode, and their pages handed back
        return_freed_memory()
    return Verification(len(prompts), tokens, worst, ties), np.asarray(greedy_tokens, dtype=np.int64)


MAX_PROMPTS = 100_000  # items read from a prompts callable before it is taken to have no more usable ones


def prompt_tokens(
    project: Project, layout: CacheLayout, count: int, length: int, seed_offset: int = 0
) -> tuple[list[np.ndarray], str]:
    """`count` token sequences of `length`: from [workload] prompts (cut to length; too short is an error), else
    seeded random tokens over the vocabulary."""
    workload = project.workload
    assert isinstance(workload, GenerateWorkload)
    if workload.prompts is None:
        rng = np.random.default_rng(project.seed + seed_offset)
        return [
            rng.integers(0, layout.vocab, size=length, dtype=np.int64) for _ in range(count)
        ], "random tokens (seeded)"
    from tapeout.core.user_code import resolve_callable

    source = resolve_callable(workload.prompts, project.root, "[workload] prompts")
    # taken as needed: a generator that never ends is read up to `count` long-enough sequences (or MAX_PROMPTS items)
    items, long_enough = [], 0
    with user_code(f"[workload] prompts {workload.prompts}", project.root):
        for item in source():
            items.append(item)
            long_enough += np.size(item) >= length
            if long_enough >= count or len(items) >= MAX_PROMPTS:
                break
    usable = []
    for i, seq in enumerate(items):
        array = np.asarray(seq)
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
            raise BadInput(
                f"[workload] prompts {workload.prompts}: item {i} is {array.dtype} of shape "
                f"{list(array.shape)}, not a 1-D sequence of token ids",
                fix="return 1-D integer arrays",
            )
        if array.size and (array.min() < 0 or array.max() >= layout.vocab):
            raise BadInput(
                f"[workload] prompts {workload.prompts}: item {i} has token ids outside [0, {layout.vocab})",
                fix="tokenize with the model's own vocabulary",
            )
        if array.size >= length:
            usable.append(array[:length].astype(np.int64))
    if len(usable) < count:
        raise BadInput(
            f"[workload] prompts {workload.prompts} gave {len(usable)} sequences of at least {length} "
            f"tokens; {count} are needed",
            fix=f"return at least {count} sequences of {length}+ tokens, or lower agreement_prompts / prompt_lengths",
        )
    return usable[:count], f"[workload] prompts {workload.prompts}"


def decode_feeds(step: Callable, layout: CacheLayout, sequences: list[np.ndarray], batch: int) -> list[dict]:
    """One decode step per sequence at past = len(sequence) - 1: the cache filled by prefilling all but the last
    token (through `step`, the torch cache graph), then the last token as input_ids. Batch rows repeat it."""
    feeds = []
    for seq in sequences:
        ids = np.repeat(seq[None].astype(np.int64), batch, axis=0)
        out = step(layout.feeds(ids[:, :-1], layout.empty_past(batch)))
        feeds.append(layout.feeds(ids[:, -1:], feed_back(layout, out)))
    return feeds


def reference_greedy(step: Callable, layout: CacheLayout, prompts: list[np.ndarray], tokens: int) -> np.ndarray:
    """The torch model's greedy tokens [prompts, tokens] for each prompt (batch 1)."""
    return np.concatenate([greedy(step, layout, p[None], tokens) for p in prompts], axis=0)
