"""`tapeout init MODEL`: a tapeout.toml for the user's own model, its inputs read from the model where it says them
(a Hugging Face config, an ONNX graph) and asked for where it does not (a torch module's forward), with the
budgets to declare written as comments. The file is validated as `build` will read it before it is written.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tapeout.core import workload
from tapeout.core.config import PROJECT_FILE, load_project
from tapeout.core.errors import BadInput

# a decoder's first build: the shapes users time a small language model at
PROMPT, NEW_TOKENS, CONTEXT = 128, 128, 256
ENCODER_SEQUENCE = 128
INPUT_FLAG = re.compile(r"^(?P<name>[A-Za-z_]\w*)=(?P<shape>[\w,x]+)(?::(?P<dtype>\w+))?$")
ONNX_DTYPES = {1: "float32", 10: "float16", 11: "float64", 7: "int64", 6: "int32", 3: "int8", 2: "uint8", 9: "bool"}


@dataclass
class Draft:
    """What init learned about the model: enough to write a project file."""

    source: str
    inputs: list[dict] = field(default_factory=list)
    dims: dict[str, int] = field(default_factory=dict)
    outputs: list[str] | None = None
    workload: dict | None = None
    state: dict[str, str] = field(default_factory=dict)  # a stream's state input → the output that feeds it
    said: list[str] = field(default_factory=list)  # what was inferred, and from what


def init(model: str, directory: Path, inputs: list[str], force: bool) -> int:
    directory = directory.resolve()
    target = directory / PROJECT_FILE
    if target.exists() and not force:
        raise BadInput(f"{target} exists", fix="pass --force to replace it, or --dir for another folder")
    draft = _draft(model, directory, [_input_flag(text) for text in inputs])
    text = render(draft)
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{PROJECT_FILE}.partial"
    partial.write_text(text, encoding="utf-8")
    try:
        load_project(partial)  # what build reads: a file init writes must load
    except BadInput:
        partial.unlink()
        raise
    partial.replace(target)
    print(f"wrote {target}")
    for line in draft.said:
        print(f"  {line}")
    print("next:")
    print(
        f"  tapeout build {_shown(directory)} -p cpu-fp32        # export, verify, measure (profiles: tapeout profiles list)"
    )
    print(
        f"  tapeout check {_shown(directory / 'build' / 'cpu-fp32')}   # on the device: measure again, judge the budgets"
    )
    print("  declare budgets in its [budgets] table; a metric in [evaluation] judges accuracy; real inputs in")
    print("  [calibration] (a CNN's INT8 is calibrated on them)")
    return 0


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd())) or "."
    except ValueError:
        return str(path)


def _input_flag(text: str) -> dict:
    match = INPUT_FLAG.match(text.replace(" ", ""))
    if not match:
        raise BadInput(
            f"--input {text!r} is not NAME=SHAPE[:DTYPE]", fix="write e.g. --input image=1x3x224x224:float32"
        )
    shape = [int(d) if d.isdigit() else d for d in re.split(r"[x,]", match["shape"]) if d]
    return {"name": match["name"], "shape": shape, "dtype": match["dtype"] or "float32"}


def _draft(model: str, directory: Path, given: list[dict]) -> Draft:
    path = Path(model)
    if ":" in model and not path.exists():
        return _from_callable(model, directory, given)
    if not path.exists():
        raise BadInput(
            f"{model} not found", fix="give a Hugging Face directory, an .onnx file, a .pt2 file or file.py:callable"
        )
    source = _relative(path.resolve(), directory)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise BadInput(f"{model} is a folder without config.json", fix="give a Hugging Face model directory")
        draft = _from_hf_config(path / "config.json", source)
    elif path.suffix == ".onnx":
        draft = _from_onnx(path, source)
    elif path.suffix == ".pt2":
        draft = Draft(source)
        if not given:
            raise BadInput(
                f"{model}: a .pt2 program's inputs are not read here",
                fix="give each input: --input NAME=SHAPE[:DTYPE], e.g. --input x=1x3x224x224",
            )
    else:
        raise BadInput(
            f"{model}: not a model tapeout reads",
            fix="give a Hugging Face directory, an .onnx file, a .pt2 file or file.py:callable",
        )
    return _with_given(draft, given)


def _relative(path: Path, directory: Path) -> str:
    try:
        return str(path.relative_to(directory)) or "."
    except ValueError:
        return str(path)


def _with_given(draft: Draft, given: list[dict]) -> Draft:
    """--input entries replace what was inferred, input by input (a new name is added)."""
    for entry in given:
        known = next((i for i in draft.inputs if i["name"] == entry["name"]), None)
        if known is not None:
            draft.inputs[draft.inputs.index(known)] = {**known, **entry}
        else:
            draft.inputs.append(entry)
        for dim in entry["shape"]:
            if isinstance(dim, str):
                draft.dims.setdefault(dim, 1)
        draft.said.append(f"input {entry['name']}: {entry['shape']} {entry['dtype']} (--input)")
    return draft


def _from_hf_config(config_file: Path, source: str) -> Draft:
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BadInput(f"{config_file}: not readable JSON ({exc})", fix="check the model directory") from None
    arch = (config.get("architectures") or [""])[0]
    vocab = config.get("vocab_size")
    draft = Draft(source)
    if config.get("is_encoder_decoder") and config.get("model_type") == "whisper":
        bins, frames = config.get("num_mel_bins", 80), 2 * config.get("max_source_positions", 1500)
        seconds = frames / 100  # Whisper's 10 ms frames
        draft.inputs = [{"name": "input_features", "shape": [1, bins, frames], "dtype": "float32"}]
        draft.workload = {"kind": "transcribe", "audio_s": sorted({min(10.0, seconds), seconds})}
        draft.said.append(
            f"{arch or 'Whisper'}: a speech recognizer, built as it transcribes (the encoder once over {bins} mel bins "
            f"× {frames} frames, {seconds:g} s; the decoder over its cache and the cross cache); give your clips' "
            "features in [workload] clips"
        )
        return draft
    if config.get("is_encoder_decoder"):
        raise BadInput(
            f"{config_file}: {arch or config.get('model_type')} is an encoder-decoder model, and the transcribe "
            "workload runs Whisper's only",
            fix="wrap it in a module with the encoder-decoder signature (docs/workloads.md) and init that",
        )
    if arch.endswith(("ForCausalLM", "LMHeadModel")) and isinstance(vocab, int):
        context = min(CONTEXT, config.get("max_position_embeddings") or CONTEXT)
        prompt = min(PROMPT, context // 2)
        draft.inputs = [{"name": "input_ids", "shape": ["batch", context], "dtype": "int64", "range": [0, vocab - 1]}]
        draft.dims = {"batch": 1}
        draft.outputs = ["logits"]
        draft.workload = {
            "kind": "generate",
            "prompt_lengths": [prompt],
            "new_tokens": context - prompt,
            "max_context": context,
        }
        draft.said.append(
            f"{arch}: a decoder, built as a generator (prompt {prompt}, {context - prompt} new tokens, "
            f"KV cache at {context}); vocabulary {vocab}"
        )
    elif "pixel_values" in json.dumps(config) or arch.endswith("ForImageClassification"):
        size = config.get("image_size") or 224
        channels = config.get("num_channels") or 3
        draft.inputs = [
            {"name": "pixel_values", "shape": ["batch", channels, size, size], "dtype": "float32", "range": [-1.0, 1.0]}
        ]
        draft.dims = {"batch": 1}
        draft.outputs = ["logits"]
        draft.said.append(f"{arch}: an image model, {channels}×{size}×{size} inputs")
    elif isinstance(vocab, int):
        draft.inputs = [
            {"name": "input_ids", "shape": ["batch", "sequence"], "dtype": "int64", "range": [0, vocab - 1]},
            {"name": "attention_mask", "shape": ["batch", "sequence"], "dtype": "int64", "range": [1, 1]},
        ]
        draft.dims = {"batch": 1, "sequence": ENCODER_SEQUENCE}
        draft.said.append(
            f"{arch or config.get('model_type', 'a text model')}: token ids and a mask, sequence "
            f"{ENCODER_SEQUENCE}; vocabulary {vocab}"
        )
    else:
        raise BadInput(
            f"{config_file}: cannot tell this model's inputs from its config ({arch or 'no architecture'})",
            fix="give each input: --input NAME=SHAPE[:DTYPE], e.g. --input x=1x3x224x224",
        )
    return draft


def _from_onnx(path: Path, source: str) -> Draft:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # a malformed file is the user's input: one line
        raise BadInput(f"{path}: not a readable ONNX model ({type(exc).__name__})", fix="check the file") from None
    weights = {init.name for init in model.graph.initializer}
    draft = Draft(source, outputs=[o.name for o in model.graph.output] or None)
    for graph_input in model.graph.input:
        if graph_input.name in weights:
            continue
        tensor = graph_input.type.tensor_type
        dtype = ONNX_DTYPES.get(tensor.elem_type)
        if dtype is None:
            raise BadInput(
                f"{path}: input {graph_input.name!r} has element type {tensor.elem_type}, which tapeout does not feed",
                fix=f"use one of: {', '.join(ONNX_DTYPES.values())}",
            )
        shape: list[int | str] = []
        for k, dim in enumerate(tensor.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                shape.append(int(dim.dim_value))
            else:
                name = re.sub(r"\W", "_", dim.dim_param) if dim.dim_param else f"{graph_input.name}_dim{k}"
                name = name if name.isidentifier() else f"d_{name}"
                shape.append(name)
                draft.dims.setdefault(name, 1)
        entry = {"name": graph_input.name, "shape": shape, "dtype": dtype}
        if dtype != "bool":
            entry["range"] = [0.0, 1.0] if dtype.startswith("float") else [0, 1]
        draft.inputs.append(entry)
    draft.state = _state_pairs([i["name"] for i in draft.inputs], draft.outputs or [])
    symbolic = ", ".join(f"{k} = 1" for k in draft.dims)
    draft.said.append(
        f"{len(draft.inputs)} inputs and {len(draft.outputs or [])} outputs from the graph"
        + (f"; symbolic dims set to 1 ({symbolic}): set the sizes you deploy at" if symbolic else "")
        + "; input ranges [0, 1]: set the values your model takes"
    )
    if draft.state:
        draft.said.append(f"a streaming model: state {draft.state} carried from chunk to chunk")
    return draft


def _state_pairs(inputs: list[str], outputs: list[str]) -> dict[str, str]:
    """State inputs by their outputs' names (h → h_out, state → state_next, c0 → cn): a streaming model's export."""
    pairs = {}
    for name in inputs:
        stem = name.removesuffix("_in").removesuffix("0")
        for out in (f"{name}_out", f"{stem}_out", f"{name}_next", f"{stem}_next", f"{stem}n", f"new_{stem}"):
            if out in outputs and out not in pairs.values():
                pairs[name] = out
                break
    return pairs if len(pairs) < len(inputs) else {}


def _from_callable(ref: str, directory: Path, given: list[dict]) -> Draft:
    from tapeout.core.errors import user_code
    from tapeout.core.user_code import resolve_callable

    build = resolve_callable(ref, directory, "tapeout init")
    with user_code(f"tapeout init {ref}", directory):  # the user's maker failing is one line naming its line
        made = build()
    if isinstance(made, str | Path):  # a maker that returns a Hugging Face directory or a model file
        found = _draft(str(Path(directory, made)), directory, [])
        return _with_given(
            Draft(ref, found.inputs, found.dims, found.outputs, found.workload, found.state, found.said), given
        )
    names = _forward_inputs(made)
    draft = Draft(ref)
    missing = [n for n in names if n not in {g["name"] for g in given}]
    if missing and not sys.stdin.isatty():
        example = " ".join(f"--input {n}=1x…:float32" for n in missing)
        raise BadInput(
            f"{ref}: forward({', '.join(names)}) does not say its inputs' shapes", fix=f"give each: {example}"
        )
    for name in missing:
        answer = input(f"shape and dtype of {name!r} (e.g. 1x3x224x224:float32): ")
        given.append(_input_flag(f"{name}={answer}"))
    ordered = sorted(given, key=lambda g: names.index(g["name"]) if g["name"] in names else len(names))
    draft = _with_given(draft, ordered)
    with user_code(f"tapeout init {ref}: forward on zeros of the given shapes", directory):
        _outputs_by_one_call(made, draft)
    return draft


def _outputs_by_one_call(module, draft: Draft) -> None:
    """One call on zeros names the outputs; an input whose shape and dtype only one output shares is state that
    output feeds on the next call (a streaming model: h → h_out), as a streaming model's ONNX names show it."""
    import torch

    feeds = [
        torch.zeros(
            [d if isinstance(d, int) else draft.dims.get(d, 1) for d in i["shape"]], dtype=getattr(torch, i["dtype"])
        )
        for i in draft.inputs
    ]
    with torch.inference_mode():
        result = module(*feeds)
    results = list(result) if isinstance(result, tuple | list) else [result]
    if not all(isinstance(r, torch.Tensor) for r in results):
        return  # a dict or a model output object: the export names those; nothing to infer here
    shapes = [(tuple(r.shape), str(r.dtype)) for r in results]
    names = ["output" if len(results) == 1 else f"output{k}" for k in range(len(results))]
    for entry, tensor in zip(draft.inputs, feeds, strict=True):
        same = [k for k, shape in enumerate(shapes) if shape == (tuple(tensor.shape), str(tensor.dtype))]
        if len(same) == 1 and not names[same[0]].endswith("_out"):
            names[same[0]] = f"{entry['name']}_out"
            draft.state[entry["name"]] = names[same[0]]
    if len(draft.state) == len(draft.inputs):  # every input fed back: nothing streams in, so it is no stream
        draft.state = {}
        names = ["output" if len(results) == 1 else f"output{k}" for k in range(len(results))]
    draft.outputs = names
    draft.said.append(f"outputs {names}: {', '.join(str(list(s)) for s, _ in shapes)} on zeros")
    if draft.state:
        draft.said.append(
            f"a streaming model: state {draft.state} (inputs whose shape one output shares) carried from chunk to "
            "chunk; set deadline_ms to the real time one chunk stands for"
        )


def _forward_inputs(module) -> list[str]:
    import inspect

    forward = getattr(module, "forward", None)
    if forward is None:
        raise BadInput(
            f"the callable returned {type(module).__name__}, not a torch module",
            fix="return a torch.nn.Module, a Hugging Face directory or an .onnx path",
        )
    params = inspect.signature(forward).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]


def render(draft: Draft) -> str:
    out = [
        "# Written by `tapeout init`: check the shapes, ranges and dims, then `tapeout build . -p cpu-fp32`.",
        "",
        "[model]",
        f"source = {json.dumps(draft.source)}",
    ]
    if draft.outputs:
        out.append(f"outputs = {json.dumps(draft.outputs)}")
    for entry in draft.inputs:
        out += [
            "",
            "[[inputs]]",
            f"name = {json.dumps(entry['name'])}",
            f"shape = {json.dumps(entry['shape'])}",
            f"dtype = {json.dumps(entry['dtype'])}",
        ]
        if "range" in entry:
            out.append(f"range = {json.dumps(entry['range'])}         # the values random inputs are drawn from")
    if draft.dims:
        out += ["", "[dims]                          # each symbolic dim's size for this build"]
        out += [f"{name} = {value}" for name, value in draft.dims.items()]
    if draft.workload:
        out += ["", "[workload]"] + [f"{k} = {json.dumps(v)}" for k, v in draft.workload.items()]
    elif draft.state:
        state = ", ".join(f"{k} = {json.dumps(v)}" for k, v in draft.state.items())
        out += [
            "",
            "[workload]                      # chunk after chunk, the state carried",
            'kind = "stream"',
            f"state = {{ {state} }}",
            "deadline_ms = 32                # the real time one chunk stands for",
        ]
    else:
        out += [
            "",
            "# A streaming model (chunk after chunk, its state carried): map each state input to the output",
            "# that feeds it on the next chunk ([model] outputs names them).",
            "# [workload]",
            '# kind = "stream"',
            '# state = { h = "h_out" }',
            "# deadline_ms = 32",
        ]
    out += [
        "",
        *_kind(draft).example_data,
        "",
        "[budgets]                       # judged by every build and check, over the shipped profiles' defaults",
    ]
    out += _budget_lines(draft)
    return "\n".join(out) + "\n"


def _kind(draft: Draft) -> workload.Workload:
    return workload.get((draft.workload or {}).get("kind") or ("stream" if draft.state else "forward"))


def _budget_lines(draft: Draft) -> list[str]:
    kind = _kind(draft)
    lines = [*kind.example_budgets, "# peak_memory_mb = 512"]
    if any("[evaluation]" in line for line in kind.example_data):  # a kind that takes a metric
        lines.append("# accuracy_max_rel_drop = 0.01  # with an [evaluation] metric")
    return lines
