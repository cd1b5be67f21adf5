"""torch → ONNX, verified: the exported model must reproduce torch on several inputs or the export fails.

The dynamo exporter (torch.export) goes first; if it cannot trace the model, the TorchScript
exporter is tried and the reason for the fallback is reported, never hidden.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tapeout.core.errors import BadInput, ExportMismatch, first_line, runtime_detail, user_code
from tapeout.core.feeds import Feeds, random_feeds
from tapeout.core.heap import collect_and_return
from tapeout.core.onnx_graphs import save_model
from tapeout.core.parity import OutputParity, compare, worst
from tapeout.core.schemas import InputSpec, Project
from tapeout.exporters.sources import LoadedModel

DEFAULT_OPSET = 20  # new enough for every exporter feature we use, old enough for TensorRT/QNN parsers


@dataclass(frozen=True)
class ExportOptions:
    """How a model is exported and verified: the opset and IR version the target's runtime takes, dynamic
    axes or not, and the tolerance and number of random inputs the export is verified on."""

    opset: int
    max_ir_version: int
    dynamic: bool = True
    atol: float = 1e-4
    rtol: float = 1e-3
    samples: int = 3
    seed: int = 0

    @classmethod
    def for_project(
        cls, project: Project, max_opset: int, max_ir_version: int, samples: int | None = None
    ) -> ExportOptions:
        """The project's [export] settings within what the target's runtime takes: every export of a build (the
        model's, and the pruning search's of each candidate) is made with these."""
        export = project.export
        opset = export.opset or min(DEFAULT_OPSET, max_opset)
        if opset > max_opset:
            raise BadInput(
                f"[export] opset = {opset} is newer than the target runtime supports ({max_opset})",
                fix=f"set [export] opset <= {max_opset}",
            )
        return cls(
            opset,
            max_ir_version,
            export.dynamic,
            export.atol,
            export.rtol,
            export.samples if samples is None else samples,
            project.seed,
        )


@dataclass
class ExportResult:
    path: Path
    exporter: str
    opset: int
    ir_version: int
    input_names: list[str]
    output_names: list[str]
    parity: list[OutputParity]
    seconds: float
    fallback_reason: str = ""
    dynamic_dims: list[str] = field(default_factory=list)


def _takes(module, input_names: list[str]) -> None:
    """The project's inputs, one per positional parameter of forward: a mismatch is the project file's to fix, said
    before the call fails inside it."""
    import inspect

    forward = getattr(module, "forward", None)
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):  # a compiled or C++ forward: the call itself will say
        return
    try:
        signature.bind(*input_names)
    except TypeError:
        params = [p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p.name for p in params if p.default is p.empty]
        raise BadInput(
            f"the model's forward({', '.join(p.name for p in params)}) takes {len(required)} input(s) "
            f"({', '.join(required) or 'none required'}), and the project declares {len(input_names)} "
            f"([[inputs]] {', '.join(input_names)})",
            fix="declare one [[inputs]] entry per input of forward, in forward's order",
        ) from None


def torch_outputs(
    module, feeds: Feeds, input_names: list[str], output_names: list[str] | None = None
) -> dict[str, np.ndarray]:
    """Run the torch model once; outputs named by `output_names`, dict keys, or output_<i>."""
    import torch

    args = [torch.from_numpy(np.ascontiguousarray(feeds[name])) for name in input_names]
    shapes = ", ".join(f"{n} {list(a.shape)}" for n, a in zip(input_names, args, strict=True))
    _takes(module, input_names)
    with torch.inference_mode(), user_code(f"the model's forward on the project's inputs ({shapes})"):
        result = module(*args)
    if isinstance(result, dict):
        values, names = list(result.values()), list(result.keys())
    elif isinstance(result, tuple | list):
        values, names = list(result), [f"output_{i}" for i in range(len(result))]
    else:
        values, names = [result], ["output"]
    if output_names is not None:
        if len(output_names) != len(values):
            raise BadInput(
                f"[model] outputs names {len(output_names)} outputs but the model returns {len(values)}",
                fix=f"give exactly {len(values)} names, or leave 'outputs' out",
            )
        names = output_names
    outputs = {n: v.detach().cpu().numpy() for n, v in zip(names, values, strict=True) if v is not None}
    if not outputs:  # the user's forward() returned nothing to compare or export: say so, not an exporter error
        returned = "None" if result is None else f"a {type(result).__name__} with no tensor in it"
        raise BadInput(
            f"the model's forward() returned {returned}: there is no output to export",
            fix="return the output tensor (or a tuple or dict of tensors) from forward()",
        )
    return outputs


def _trace_dims(dims: dict[str, int]) -> dict[str, int]:
    # torch.export specializes any dimension that is 1 in the example, so trace dynamic dims at >= 2.
    return {name: max(value, 2) for name, value in dims.items()}


def _dynamic_shapes(module, inputs: list[InputSpec]):
    per_input = tuple(
        {axis: dim for axis, dim in enumerate(spec.shape) if isinstance(dim, str)} or None for spec in inputs
    )
    params = [p for p in inspect.signature(module.forward).parameters.values()]
    star = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
    if star is not None and len(per_input) > star:  # forward(a, *rest) given rest: torch.export wants the shapes
        return (*per_input[:star], per_input[star:])  # nested as the arguments are (none given: nothing to nest)
    return per_input


def _program_dims(shapes, auto: bool = False):
    """The ONNX exporter takes a symbolic dim by name; torch.export wants a `Dim` object, one per name so that
    inputs sharing a name (`batch`) are kept equal. `auto`: Dim.AUTO for each, export infers their ranges and
    equalities (for a model whose code bounds a dim, e.g. by its position table)."""
    import torch

    made: dict[str, object] = {}

    def dim(name: str):
        if auto:
            return torch.export.Dim.AUTO
        if name not in made:
            safe = re.sub(r"\W", "_", name)
            made[name] = torch.export.Dim(safe if safe.isidentifier() else f"d_{safe}")
        return made[name]

    def convert(entry):
        if isinstance(entry, tuple):
            return tuple(convert(e) for e in entry)
        if isinstance(entry, dict):
            return {axis: dim(name) for axis, name in entry.items()}
        return entry

    return convert(shapes)


@contextlib.contextmanager
def _quiet() -> io.StringIO:
    """The exporters print progress and warnings; keep them for error messages, off the user's terminal."""
    buffer = io.StringIO()
    names = (
        "torch",
        "torch.onnx",
        "torch.export",
        "torch._dynamo",
        "torch.fx",
        "torch.fx.experimental.symbolic_shapes",
        "onnxscript",
    )
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            warnings.simplefilter("ignore")
            yield buffer
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _export_dynamo(module, args, inputs, output_names, opset, dynamic):
    import torch

    program = torch.onnx.export(
        module,
        tuple(args),
        dynamo=True,
        opset_version=opset,
        verbose=False,
        input_names=[s.name for s in inputs],
        output_names=output_names,
        dynamic_shapes=_dynamic_shapes(module, inputs) if dynamic else None,
        optimize=False,
    )
    _optimize(program)
    return program.model_proto


def _optimize(program) -> None:
    """The exporter's own optimization, with the graph folded and its dead nodes dropped first: its pattern
    rewriter then walks the live graph only (a third of a 30-layer decoder's nodes as traced), which gives the
    same model, byte for byte, in a quarter less time. Its rules are tried only on nodes of their pattern's
    first op (`_rules_by_first_op`)."""
    import onnxscript.optimizer

    onnxscript.optimizer.fold_constants(program.model)
    onnxscript.optimizer.remove_unused_nodes(program.model)
    with _rules_by_first_op():
        program.optimize()


@contextlib.contextmanager
def _rules_by_first_op():
    """The exporter's default rewrite rules, each tried only on a node its pattern's first output node matches by
    op type and domain: the rewriter tries every rule on every node, and a pattern of several output nodes indexes
    the whole graph on each try, so a 30-layer decoder's rewrite costs tens of seconds, almost all of it in tries
    the matcher's own first check refuses. Skipping exactly those tries gives the same model, byte for byte
    (tests/test_export.py); a rule whose pattern or matcher is not the kind read here is tried everywhere, as
    before."""
    import copy
    import types

    import onnxscript.rewriter as rewriter

    try:
        from onnxscript.rewriter import _matcher, _rewrite_rule

        rules = _rewrite_rule.RewriteRuleSet(rewriter._DEFAULT_REWRITE_RULES).rules
    except (AttributeError, ImportError, TypeError):  # another onnxscript: its optimizer as it is
        yield
        return

    def guarded(rule):
        first = (getattr(getattr(rule, "_target_pattern", None), "output_nodes", None) or [None])[0]
        known = hasattr(first, "op") and hasattr(first, "domain")
        if not known or not isinstance(getattr(rule, "_matcher", None), _matcher.SimplePatternMatcher):
            return rule
        tries = rule.try_rewrite

        def try_rewrite(self, model, graph, node, *, verbose=None, tracer=None):
            if tracer is None and not (first.op.matches(node.op_type) and first.domain.matches(node.domain)):
                return None
            return tries(model, graph, node, verbose=verbose, tracer=tracer)

        copied = copy.copy(rule)
        copied.try_rewrite = types.MethodType(try_rewrite, copied)
        return copied

    saved = rewriter._DEFAULT_REWRITE_RULES
    rewriter._DEFAULT_REWRITE_RULES = [guarded(rule) for rule in rules]
    try:
        yield
    finally:
        rewriter._DEFAULT_REWRITE_RULES = saved
        _forget_last_matches(rules)


_MATCH_STATE = ("_match", "_graph", "_current_node", "_tracer")  # what a matcher sets for each try


def _forget_last_matches(rules) -> None:
    """The default rules are module-level and each matcher keeps its last try (the graph, the values it bound):
    after an export that is the exported graph, whose initializers wrap the torch module's parameters, which would
    keep the module's weights alive after the module is let go (0.5 GB at 135 M parameters). Set again at each
    match's start."""
    for rule in rules:
        matcher = getattr(rule, "_matcher", None)
        for name in _MATCH_STATE:
            if name in getattr(matcher, "__dict__", {}):
                setattr(matcher, name, None)


def _export_torchscript(module, args, inputs, output_names, opset, dynamic):
    import onnx
    import torch

    axes = {s.name: {a: d for a, d in enumerate(s.shape) if isinstance(d, str)} for s in inputs} if dynamic else None
    buffer = io.BytesIO()
    torch.onnx.export(
        module,
        tuple(args),
        buffer,
        dynamo=False,
        opset_version=min(opset, 20),
        input_names=[s.name for s in inputs],
        output_names=output_names,
        dynamic_axes={k: v for k, v in (axes or {}).items() if v} or None,
    )
    return onnx.load_from_string(buffer.getvalue())


def export(
    loaded: LoadedModel,
    inputs: list[InputSpec],
    dims: dict[str, int],
    out_path: Path,
    options: ExportOptions,
    log: Callable[[str], None] = lambda _msg: None,
    rewrite: Callable | None = None,
    stage: Callable[[str], None] = lambda _what: None,
) -> ExportResult:
    """`loaded`'s module as ONNX at `out_path`, verified against torch on `options.samples` random inputs.
    `rewrite(proto) -> proto` runs on the exported model before it is saved and verified (the export stage's
    graph passes), so the verification covers what it did. `stage` hears what the export is doing now."""
    import torch

    opset, max_ir_version, dynamic = options.opset, options.max_ir_version, options.dynamic
    atol, rtol = options.atol, options.rtol
    started = time.perf_counter()
    module = loaded.module
    input_names = [s.name for s in inputs]
    rng = np.random.default_rng(options.seed)
    trace_feeds = random_feeds(inputs, _trace_dims(dims) if dynamic else dims, rng)
    output_names = list(torch_outputs(module, trace_feeds, input_names, loaded.output_names))
    args = [torch.from_numpy(trace_feeds[n]) for n in input_names]

    exporter, fallback_reason = "dynamo", ""
    stage("torch.export traces the model, then it is translated to ONNX and optimized")
    with _quiet() as noise:
        try:
            proto = _export_dynamo(module, args, inputs, output_names, opset, dynamic)
        except Exception as exc:
            fallback_reason = _root_cause(exc)
            exporter = "torchscript"
            try:
                proto = _export_torchscript(module, args, inputs, output_names, opset, dynamic)
            except Exception as exc2:
                raise BadInput(
                    f"export failed with both exporters: dynamo: {fallback_reason}; torchscript: {first_line(exc2)}",
                    fix="make the model traceable by torch.export (see the exportdb docs), or export it to ONNX yourself "
                    f"and point [model] source at the .onnx file{_tail(noise)}",
                ) from None
    if fallback_reason:  # said outside the quiet block, so the user sees it
        log(f"dynamo exporter failed ({fallback_reason}); used the TorchScript exporter instead")

    if rewrite is not None:
        stage("graph passes")
        proto = rewrite(proto)
    # The runtime decides what is loadable: stamp the newest IR version it accepts, never a newer one.
    proto.ir_version = min(proto.ir_version, max_ir_version)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    save_model(proto, out_path)
    opset_used = next((i.version for i in proto.opset_import if i.domain in ("", "ai.onnx")), opset)
    ir_version = proto.ir_version
    # the weights' serialized copy and the exporter's graphs (in reference cycles) go, their pages handed back,
    # before ONNX Runtime loads the model again: a language model's build would otherwise hold its weights four times
    # over here
    del proto
    collect_and_return()

    stage(f"ONNX Runtime against torch on {options.samples} random inputs")
    parity = verify(module, out_path, inputs, dims, output_names, options, rng)
    bad = [p for p in parity if not p.within_tolerance]
    if bad:
        w = worst(bad)
        raise ExportMismatch(
            f"exported ONNX output '{w.output}' differs from torch beyond tolerance: max-abs {w.max_abs:.3g}, "
            f"max-rel {w.max_rel:.3g}, cosine {w.cosine:.6f} (atol {atol:g}, rtol {rtol:g}; "
            f"{len(bad)} of {len(parity)} outputs off)",
            fix="look for code that behaves differently under tracing (data-dependent branches, "
            "torch.compiler.is_exporting), or loosen [export] atol/rtol if the difference is expected",
        )
    dynamic_dims = sorted({d for s in inputs for d in s.shape if isinstance(d, str)}) if dynamic else []
    return ExportResult(
        out_path,
        exporter,
        opset_used,
        ir_version,
        input_names,
        output_names,
        parity,
        time.perf_counter() - started,
        fallback_reason,
        dynamic_dims,
    )


def verify(
    module,
    onnx_path: Path,
    inputs: list[InputSpec],
    dims: dict[str, int],
    output_names: list[str],
    options: ExportOptions,
    rng,
) -> list[OutputParity]:
    """Torch vs ONNX Runtime (basic optimizations only, CPU) on `options.samples` fresh random inputs."""
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(str(onnx_path), verification_options(), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise BadInput(
            f"the exported model does not load in onnxruntime: {first_line(exc)}",
            detail=runtime_detail(exc),
            fix="pin [export] opset to one the installed onnxruntime supports",
        ) from None
    input_names = [s.name for s in inputs]
    reference, actual = [], []
    for _ in range(options.samples):
        feeds = random_feeds(inputs, dims, rng)
        reference.append(torch_outputs(module, feeds, input_names, output_names))
        actual.append(dict(zip(output_names, sess.run(output_names, feeds), strict=True)))
    return compare(reference, actual, options.atol, options.rtol)


def verification_options(arena: bool = True):
    """ONNX Runtime's options for checking an export against torch: basic optimizations only (the graph as exported),
    errors only, and no prepacked weights: a check runs each weight a few times, and packed copies would only add to
    the build's peak (~0.5 GB at 0.5 B). `arena=False` where a loop's largest buffers would stay held to its end."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_prepacking", "1")
    so.enable_cpu_mem_arena = arena
    return so


def _root_cause(exc: BaseException) -> str:
    """The exporters wrap the real reason in 'step 1/3 failed'; report the innermost one."""
    inner = exc
    while (inner.__cause__ or inner.__context__) is not None and inner is not (inner.__cause__ or inner.__context__):
        inner = inner.__cause__ or inner.__context__
    return f"{type(inner).__name__}: {first_line(inner)}" if inner is not exc else first_line(exc)


def _tail(noise: io.StringIO) -> str:
    lines = [ln for ln in noise.getvalue().splitlines() if ln.strip()]
    return f" (exporter said: {lines[-1][:200]})" if lines else ""


def export_program(loaded: LoadedModel, inputs: list[InputSpec], dims: dict[str, int], options: ExportOptions):
    """`loaded`'s module as a torch.export ExportedProgram (what PyTorch-native targets compile from), traced at
    the project's shapes with its symbolic dims dynamic; a model torch.export cannot capture is one line with the
    exporter's reason."""
    import torch

    module = loaded.module
    rng = np.random.default_rng(options.seed)
    feeds = random_feeds(inputs, _trace_dims(dims) if options.dynamic else dims, rng)
    args = tuple(torch.from_numpy(feeds[s.name]) for s in inputs)
    shapes = _dynamic_shapes(module, inputs) if options.dynamic else None
    with _quiet() as noise:
        try:
            try:
                return torch.export.export(module, args, dynamic_shapes=shapes and _program_dims(shapes))
            except Exception as exc:  # the model's own code bounds a dim (MiniLM's sequence by its 512 positions)
                if shapes is None or "Constraints violated" not in str(exc):
                    raise
                return torch.export.export(module, args, dynamic_shapes=_program_dims(shapes, auto=True))
        except Exception as exc:
            raise BadInput(
                f"torch.export could not capture the model: {_root_cause(exc)}",
                detail=runtime_detail(exc),
                fix="make the model traceable by torch.export (data-dependent control flow as torch.cond, "
                f"see the exportdb docs), or build for a target that compiles from ONNX{_tail(noise)}",
            ) from None


def save_program(program, path: Path) -> None:
    """The program as a .pt2 archive: what a PT2E quantization starts from, read back by the safe reader
    (core/pt2.py) like any other .pt2."""
    import torch

    with _quiet():
        torch.export.save(program, str(path))
