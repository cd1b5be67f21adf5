"""The kernel harness: proves a kernel correct, then times it, on the device it will run on.

verify: for every case (the sample models' shapes and edge cases) and dtype, two calls on fresh random inputs;
outputs pre-filled with NaN, so an element the kernel never wrote is counted, not compared; each output against
the float32 reference at the dtype's tolerance (|out − ref| ≤ atol + rtol·|ref|); a kernel whose outputs do not
change with fresh inputs returned a cached result; an output sharing memory with an input is refused. On a GPU
it runs there; without one in Triton's interpreter (CPU tensors, cases cut to a quick size, which the row says).

bench (a GPU only): every config of the tuning space timed, the fastest kept (cached per device); then the kernel,
the eager PyTorch chain and Inductor's code for it (torch.compile) each timed with CUDA events around the call
alone, after a warm-up, inputs rotated over a pool (a result cached by pointer cannot pass), L2 flushed before
each call when the working set would fit it, the GPU held in a spin until the host has enqueued the call (device
time: a Python launch slower than the kernel is not timed as the kernel; the launch's host time is its own
column); p50 and p90, achieved bandwidth and FLOP/s, and the fraction of the device spec's roof.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, replace

from tapeout.core.errors import TargetUnavailable, first_line
from tapeout.targets.kernels.base import Case, Config, Kernel

INTERPRETER_WORK = 1 << 16  # product of a case's dims the interpreter runs at (it is ~1e4× slower than a GPU)
POOL = 4  # input sets a timed loop rotates over
FLUSH_BYTES = 256 << 20  # written between timed calls to evict L2 (H100: 50 MB, H200: 60 MB)
SPIN_CYCLES = 2_000_000  # a GPU spin (~1 ms at 2 GHz) ahead of each timed call: the host enqueues the call
# and both events while the GPU waits, so its Python launch cost is not timed


@dataclass
class Check:
    kernel: str
    case: str
    label: str
    dtype: str
    config: str
    ok: bool | None  # None: not verifiable here (the reason in `problem`)
    worst: float = 0.0  # largest |out − ref| / tolerance (≤ 1 passes)
    max_abs: float = 0.0
    unwritten: int = 0
    problem: str | None = None
    cut_from: str | None = None  # the model's case, where the interpreter ran a smaller one

    def row(self) -> dict:
        return asdict(self)


def backend() -> str:
    """ "cuda" where torch sees a GPU (and TRITON_INTERPRET is not set), else "interpreter", which it turns on
    before any kernel compiles."""
    import torch

    if os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available():
        return "cuda"
    os.environ["TRITON_INTERPRET"] = "1"
    return "interpreter"


def cut(kernel: Kernel, case: Case, work: int = INTERPRETER_WORK) -> Case:
    """`case` with its shrinkable dims halved, largest first, until the product of its dims is at most `work`."""
    dims = dict(case.dims)
    while kernel.work(Case(tuple(dims.items()))) > work:
        name = max((d for d in kernel.shrinkable if dims.get(d, 1) > 1), key=lambda d: dims[d], default=None)
        if name is None:
            break
        dims[name] = max(1, dims[name] // 2)
    return case if dims == dict(case.dims) else Case(tuple(dims.items()), case.label)


def verify(
    kernel: Kernel, where: str, dtypes: tuple[str, ...] | None = None, all_configs: bool = False, seed: int = 0
) -> list[Check]:
    """Every case × dtype (× config, with `all_configs`) of `kernel` checked on `where` ("cuda" or "interpreter")."""
    device = "cuda" if where == "cuda" else "cpu"
    checks = []
    for case in kernel.cases():
        ran = cut(kernel, case) if where == "interpreter" else case
        for dtype in dtypes or kernel.dtypes:
            if dtype not in kernel.dtypes:
                continue
            configs = kernel.configs(ran)
            for config in configs if all_configs else configs[:1]:
                base = Check(
                    kernel.name,
                    ran.key,
                    case.label,
                    dtype,
                    config.key,
                    None,
                    cut_from=case.key if ran is not case else None,
                )
                if where == "interpreter" and dtype in kernel.interpreter_limits:
                    checks.append(replace(base, problem=kernel.interpreter_limits[dtype]))
                    continue
                checks.append(_check(kernel, ran, dtype, config, device, seed, base))
    return checks


def _check(kernel: Kernel, case: Case, dtype: str, config: Config, device: str, seed: int, base: Check) -> Check:
    import torch

    atol, rtol = kernel.tolerance(dtype)
    seen, refs, worst, max_abs, unwritten = [], [], 0.0, 0.0, 0
    for trial in range(2):
        generator = torch.Generator().manual_seed(seed * 7919 + trial)
        inputs = kernel.inputs(case, dtype, generator, device)
        outputs = kernel.outputs(case, dtype, inputs, device)
        shared = [
            name
            for name, out in outputs.items()
            if any(isinstance(t, torch.Tensor) and _overlap(out, t) for t in inputs.values())
        ]
        if shared:
            return replace(base, ok=False, problem=f"output {shared[0]} shares memory with an input")
        guarded = {name: _guarded(out) for name, out in outputs.items()}
        outputs = {name: view for name, (view, _) in guarded.items()}
        for out in outputs.values():
            out.fill_(float("nan"))
        try:
            kernel.run(inputs, outputs, config)
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # the kernel's own failure (a compile error, a bad launch) is its verdict
            return replace(base, ok=False, problem=f"raised {type(exc).__name__}: {first_line(exc)}")
        for name, (_, guards) in guarded.items():
            spoiled = _spoiled(guards)
            if spoiled:
                return replace(
                    base,
                    ok=False,
                    problem=f"wrote past the end of output {name}: {spoiled} element(s) of "
                    f"the {GUARD}-element guard zones around it changed",
                )
        ref = kernel.reference(**inputs)
        for name, out in outputs.items():
            got, want = out.float().cpu(), ref[name].float().cpu()
            missing = torch.isnan(got) & ~torch.isnan(want)
            unwritten += int(missing.sum())
            err = (got - want).abs().masked_fill(missing, 0).nan_to_num(nan=math.inf)
            if err.numel():
                max_abs = max(max_abs, float(err.max()))
                worst = max(worst, float((err / (atol + rtol * want.abs())).max()))
        seen.append({n: o.detach().clone().cpu() for n, o in outputs.items()})
        refs.append(ref)
    changed = any(not torch.equal(refs[0][n].cpu(), refs[1][n].cpu()) for n in refs[0])
    if changed and all(torch.equal(seen[0][n], seen[1][n]) for n in seen[0]):
        return replace(
            base,
            ok=False,
            worst=worst,
            max_abs=max_abs,
            unwritten=unwritten,
            problem="returned the result of an earlier call: its outputs did not change with fresh inputs",
        )
    if unwritten:
        return replace(
            base,
            ok=False,
            worst=worst,
            max_abs=max_abs,
            unwritten=unwritten,
            problem=f"left {unwritten} output element(s) unwritten (still NaN)",
        )
    if worst > 1:
        return replace(
            base,
            ok=False,
            worst=worst,
            max_abs=max_abs,
            problem=f"off by {max_abs:.3g}, {worst:.3g}× the {dtype} tolerance (atol {atol}, rtol {rtol})",
        )
    return replace(base, ok=True, worst=worst, max_abs=max_abs)


GUARD = 16384  # elements of sentinel each side of a contiguous output


def _guarded(out):
    """(`out` moved into the middle of a buffer GUARD elements longer on each side, (the buffer, the guards as
    filled)): a kernel's write past either end lands in a guard, where it is found, not in memory the harness does
    not own (in the interpreter such a write corrupted the heap and killed the process). A strided output as it
    is, unguarded."""
    import torch

    if not out.is_contiguous() or not out.is_floating_point():
        return out, None
    buffer = torch.empty(out.numel() + 2 * GUARD, dtype=out.dtype, device=out.device)
    buffer.fill_(-7000.0)
    view = buffer[GUARD : GUARD + out.numel()].view(out.shape)
    return view, (buffer, buffer[:GUARD].clone(), buffer[-GUARD:].clone())


def _spoiled(guards) -> int:
    """How many guard elements a call changed (0: none, or no guards)."""
    if guards is None:
        return 0
    buffer, low, high = guards
    return int((buffer[:GUARD] != low).sum()) + int((buffer[-GUARD:] != high).sum())


def _overlap(a, b) -> bool:
    if a.device != b.device or not a.numel() or not b.numel():
        return False
    a_lo, b_lo = a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()
    return a_lo < b_lo + b.untyped_storage().nbytes() and b_lo < a_lo + a.untyped_storage().nbytes()


# ---- timing (GPU) ----------------------------------------------------------------------------------------------


@dataclass
class BenchRow:
    kernel: str
    case: str
    label: str
    dtype: str
    config: str
    calls: int
    kernel_ms: float
    kernel_p90_ms: float
    launch_us: float  # host time of the kernel's Python launch (p50): what eager PyTorch would pay
    eager_ms: float | None
    inductor_ms: float | None
    max_autotune_ms: float | None
    bytes: float
    flops: float
    roof_ms: float | None  # max(bytes / bandwidth, flops / peak) on the device spec
    achieved_gbs: float
    achieved_tflops: float
    flushed: bool
    device: str
    notes: list[str] = field(default_factory=list)

    @property
    def roof_fraction(self) -> float | None:
        return self.roof_ms / self.kernel_ms if self.roof_ms else None

    def row(self) -> dict:
        return {**asdict(self), "roof_fraction": self.roof_fraction}


def gpu() -> dict:
    """The GPU this process times on: its name, compute capability, L2 size and the device key timings live under;
    exit 4 without one."""
    import torch
    import triton

    if backend() != "cuda":
        raise TargetUnavailable(
            "timing kernels needs an NVIDIA GPU with CUDA, and torch sees none here",
            fix="run `tapeout kernels bench` on the GPU machine; `tapeout kernels verify` runs "
            "here, in Triton's interpreter",
        )
    from tapeout.targets.kernels import timings

    props = torch.cuda.get_device_properties(0)
    capability = (props.major, props.minor)
    return {
        "name": props.name,
        "capability": capability,
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)),
        "key": timings.device_key(props.name, capability, triton.__version__, torch.__version__),
    }


def roof_ms(spec, nbytes: float, flops: float, dtype: str) -> float | None:
    """The device spec's lower bound on the call's time, or None without a spec."""
    if spec is None:
        return None
    peak = spec.peak_dense_tops.get({"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[dtype])
    bound = nbytes / (spec.memory_bandwidth_gbs.value * 1e9)
    if peak is not None:
        bound = max(bound, flops / (peak.value * 1e12))
    return bound * 1e3


def time_calls(
    call, pool: list, calls: int, flush=None, device_only: bool = True, host_us: list | None = None
) -> list[float]:
    """Milliseconds of `call(inputs)` per call, CUDA events around the call alone; inputs rotated over `pool`;
    `flush` (a tensor) zeroed before each call, outside the events.

    `device_only`: the GPU spins before each call's start event, so the host has enqueued the call before the GPU
    reaches it and the events time the GPU's work, not the Python launch (a launch slower than the kernel would
    otherwise be timed as the kernel). Without it, consecutive calls are timed as a program runs them, host cost
    included. `host_us` collects each call's host time (µs, without a sync)."""
    import time

    import torch

    for i in range(max(3, len(pool))):
        call(pool[i % len(pool)])
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    for i in range(calls):
        if flush is not None:
            flush.zero_()
        if device_only:
            torch.cuda._sleep(SPIN_CYCLES)
        starts[i].record()
        began = time.perf_counter()
        call(pool[i % len(pool)])
        if host_us is not None:
            host_us.append((time.perf_counter() - began) * 1e6)
        ends[i].record()
        if device_only and i % 16 == 15:
            torch.cuda.synchronize()  # keep the queue short: spins are not to pile up behind a slow host
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=False)]


def bench(
    kernel: Kernel,
    dtype: str,
    calls: int = 100,
    cases: list[Case] | None = None,
    max_autotune: bool = False,
    spec=None,
    retune: bool = False,
) -> list[BenchRow]:
    """Each of `kernel`'s model cases at `dtype` timed on this GPU beside eager PyTorch and Inductor; the tuned
    config and the times saved in the device's timings file."""
    import numpy as np
    import torch

    from tapeout.targets.kernels import timings

    where = gpu()
    known = timings.load(where["key"])
    rows, saved = [], {}
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    for case in cases or kernel.bench_cases():
        pool = [kernel.inputs(case, dtype, torch.Generator().manual_seed(i), "cuda") for i in range(POOL)]
        out_pool = [kernel.outputs(case, dtype, inputs, "cuda") for inputs in pool]
        nbytes, flops = kernel.traffic(case, dtype)
        flushed = nbytes < 2 * max(where["l2_bytes"], 1)
        use_flush = flush if flushed else None
        pairs = list(zip(pool, out_pool, strict=False))
        key = timings.entry_key(kernel.name, case.key, dtype)
        configs = {c.key: c for c in kernel.configs(case)}
        if key in known and known[key].config in configs and not retune:
            best = configs[known[key].config]
        else:  # autotune: the fastest config by p50 over a short run
            tried = {}
            for config in configs.values():
                try:
                    tried[config.key] = float(
                        np.median(
                            time_calls(
                                lambda p, c=config: kernel.run(p[0], p[1], c), pairs, max(10, calls // 5), use_flush
                            )
                        )
                    )
                except Exception:  # a config that does not compile for this shape (registers, shared memory)
                    continue
            if not tried:
                raise TargetUnavailable(
                    f"no config of kernel {kernel.name} launches for {case.key} on {where['name']}",
                    fix="run `tapeout kernels verify` on this GPU for the error",
                )
            best = configs[min(tried, key=tried.get)]
        host: list[float] = []
        times = time_calls(lambda p, c=best: kernel.run(p[0], p[1], c), pairs, calls, use_flush, host_us=host)
        eager = time_calls(lambda p: kernel.eager(**p[0]), pairs, calls, use_flush)
        notes = []
        inductor = _compiled_times(kernel, "default", pairs, calls, use_flush, notes)
        # without CUDA graphs: a replay first copies fresh inputs into the graph's static buffers, which is not the
        # chain's work (on an H100, max-autotune with graphs read 18.5 µs where the default mode read 4.9 µs)
        autotuned = (
            _compiled_times(kernel, "max-autotune-no-cudagraphs", pairs, calls, use_flush, notes)
            if max_autotune
            else None
        )
        p50 = float(np.median(times))
        row = BenchRow(
            kernel.name,
            case.key,
            case.label,
            dtype,
            best.key,
            calls,
            p50,
            float(np.percentile(times, 90)),
            float(np.median(host)),
            float(np.median(eager)),
            float(np.median(inductor)) if inductor else None,
            float(np.median(autotuned)) if autotuned else None,
            nbytes,
            flops,
            roof_ms(spec, nbytes, flops, dtype),
            nbytes / (p50 * 1e-3) / 1e9,
            flops / (p50 * 1e-3) / 1e12,
            flushed,
            where["name"],
            notes,
        )
        rows.append(row)
        saved[key] = timings.Timing(
            config=best.key,
            kernel_ms=p50,
            kernel_p90_ms=row.kernel_p90_ms,
            eager_ms=row.eager_ms,
            inductor_ms=row.inductor_ms,
            calls=calls,
        )
    if saved:
        timings.save(where["key"], saved)
    return rows


def _compiled_times(kernel: Kernel, mode: str, pairs: list, calls: int, flush, notes: list[str]) -> list[float] | None:
    """Inductor's code for the eager chain (torch.compile in `mode`), timed like the kernel; None with a note when
    it does not compile here."""
    import torch

    # Dynamo keys its cache on the code object, shared by every case of a kernel: past its recompile limit it
    # would quietly run the eager chain and call that Inductor's time. Each case starts from an empty cache.
    torch._dynamo.reset()
    compiled = torch.compile(kernel.eager, mode=None if mode == "default" else mode, dynamic=False)
    try:
        return time_calls(lambda p: compiled(**p[0]), pairs, calls, flush)
    except Exception as exc:  # Inductor failing on a chain is a row's note, not the kernel's failure
        notes.append(f"torch.compile ({mode}) failed: {first_line(exc)}")
        return None
