"""2:4 sparsity on an NVIDIA GPU: which layers gain with PyTorch's semi-structured sparse tensors.

    python bench/sparsity.py [--samples minilm tiny-lm] [--tokens 128 4096 32768] [--runs 50] [--control 8192]

Per sample, tapeout's own 2:4 masks (`quantize/prune.two_four`: magnitude, two of every four input
weights kept, protected layers skipped) go on the torch module in FP16 on the GPU. Then, per weight
shape among the eligible Linears, at each token count (batch × sequence rows of the activation):

  dense        F.linear(x, W) with the masked weight, as the dense tensor cores run it
  cuSPARSELt   F.linear(x, W) with W packed by cuSPARSELt (PyTorch's default 2:4 backend)
  CUTLASS      the same with PyTorch's CUTLASS 2:4 kernels

each timed with CUDA events around 20 back-to-back calls (one call alone times the launch gap, not the
kernel), median and p10–p90 of `--runs` such batches after warm-up. Then the whole module's forward,
dense against every eligible Linear 2:4 by each backend, with the output cosine between them (same
masks, so only the kernels differ). A control layer far larger than the samples' (`--control`, random
weights) shows where the sparse kernels do pay on this GPU. Shapes a backend refuses are listed as
such. Exits 4 with one line without a CUDA GPU of compute capability 8.0 or newer. This is what
decides whether `[pruning] what = ["2:4"]` pays for a model on a GPU; TensorRT's `sparse_weights` is
measured by bench/gpu.py's TensorRT rows where TensorRT is installed.
"""

from __future__ import annotations

import argparse
import copy
import statistics
from pathlib import Path

from cuda_host import cuda_torch, fail

from tapeout.core.config import load_project

REPO = Path(__file__).resolve().parents[1]


def _require_gpu():
    torch = cuda_torch("run it on an NVIDIA GPU, Ampere or newer")
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        fail(
            f"{torch.cuda.get_device_name()} is compute capability {major}.{minor}: 2:4 sparse tensor cores "
            "need 8.0 (Ampere) or newer"
        )
    try:
        from torch.sparse import SparseSemiStructuredTensorCUSPARSELT, SparseSemiStructuredTensorCUTLASS
    except ImportError:
        fail(f"this torch ({torch.__version__}) has no semi-structured sparse tensors (torch.sparse)")
    return torch, {
        "cuSPARSELt": SparseSemiStructuredTensorCUSPARSELT.from_dense,
        "CUTLASS": SparseSemiStructuredTensorCUTLASS.from_dense,
    }


def _time_us(torch, fn, runs: int, inner: int = 20) -> tuple[float, float, float]:
    """Per-call device time: events around `inner` back-to-back calls (one call alone would time the launch
    gap, not the kernel), `runs` such batches after warm-up; (median, p10, p90) in µs."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / inner)
    q = statistics.quantiles(times, n=10)
    return statistics.median(times), q[0], q[-1]


def _cell(t: tuple[float, float, float] | None) -> str:
    return "—" if t is None else f"{t[0]:.1f} ({t[1]:.1f}–{t[2]:.1f})"


def _masked_module(sample: str):
    """The sample's torch module (loaded as a build loads it) with tapeout's 2:4 masks, one real input, and the
    masks' coverage."""
    from tapeout.core.inputs import sample_inputs
    from tapeout.core.profile_schema import PruningSettings
    from tapeout.exporters import sources
    from tapeout.quantize import prune

    project = load_project(REPO / "samples" / sample)
    loaded = sources.load(project.model.source, project.root, [s.name for s in project.inputs], project.model.outputs)
    module = loaded.module.eval()
    [feeds], _ = sample_inputs(project, 1)
    found = prune.inspect(module)
    keep = prune.protected(found, PruningSettings(what=["2:4"], ratio=0.5), module)
    names = dict(module.named_modules())
    coverage = prune.two_four(module, {id(names[n]) for n in keep}, found)
    return module, {s.name: feeds[s.name] for s in project.inputs}, coverage


def run(sample: str, token_counts: list[int], runs: int, torch, kernels: dict) -> None:
    module, feeds, coverage = _masked_module(sample)
    module = module.half().cuda().eval()
    names = dict(module.named_modules())
    print(
        f"\n**{sample}**: {coverage['layers']} layers masked 2:4, {coverage['eligible_share']:.0%} of the "
        f"Linear/conv weights\n"
    )
    by_shape: dict[tuple[int, int], list[str]] = {}
    for name in coverage["layer_names"]:
        if isinstance(names[name], torch.nn.Linear):
            by_shape.setdefault(tuple(names[name].weight.shape), []).append(name)
    _layer_table(
        torch,
        {f"{len(v)} × e.g. {v[0]}": names[v[0]].weight.detach() for v in by_shape.values()},
        token_counts,
        runs,
        kernels,
    )
    inputs = tuple(
        torch.from_numpy(v).cuda() if v.dtype.kind in "iu" else torch.from_numpy(v).half().cuda()
        for v in feeds.values()
    )
    with torch.no_grad():
        dense_out = _first(module(*inputs)).float().flatten()
        whole = {"dense": _time_us(torch, lambda: module(*inputs), runs, inner=5)}
        for kernel, pack in kernels.items():
            sparse_module = copy.deepcopy(module)
            sparse_names = dict(sparse_module.named_modules())
            try:
                for layers in by_shape.values():
                    for name in layers:
                        sparse_names[name].weight = torch.nn.Parameter(
                            pack(sparse_names[name].weight.detach()), requires_grad=False
                        )
                out = _first(sparse_module(*inputs)).float().flatten()
                whole[kernel] = _time_us(torch, lambda m=sparse_module: m(*inputs), runs, inner=5)
            except (RuntimeError, ValueError) as exc:
                print(f"whole module with {kernel}: not taken: {str(exc).splitlines()[0][:100]}")
                continue
            cosine = float(torch.nn.functional.cosine_similarity(dense_out, out, dim=0))
            print(
                f"whole module, FP16 eager, the sample's input, every eligible Linear 2:4 by {kernel}: "
                f"{_cell(whole[kernel])} µs against dense {_cell(whole['dense'])} µs "
                f"({whole['dense'][0] / whole[kernel][0]:.2f}×); output cosine {cosine:.6f}"
            )


def _layer_table(torch, weights: dict, token_counts: list[int], runs: int, kernels: dict) -> None:
    """One row per weight and token count: dense F.linear against each 2:4 kernel, median (p10–p90) µs."""
    import torch.nn.functional as F

    print(
        f"| layers | weight (out × in) | tokens | dense µs | {' | '.join(f'2:4 {k} µs' for k in kernels)} | best speed-up |"
    )
    print(f"|---|---|---|---|{'---|' * len(kernels)}---|")
    for label, weight in weights.items():
        packed, refused = {}, {}
        for kernel, pack in kernels.items():
            try:
                packed[kernel] = pack(weight)
            except (RuntimeError, ValueError) as exc:
                refused[kernel] = str(exc).splitlines()[0][:60]
        for tokens in token_counts:
            x = torch.randn(tokens, weight.shape[1], device="cuda", dtype=torch.float16)
            dense = _time_us(torch, lambda x=x, w=weight: F.linear(x, w), runs)
            cells, best = [], None
            for kernel in kernels:
                if kernel in refused:
                    cells.append(f"not taken: {refused[kernel]}")
                    continue
                try:
                    t = _time_us(torch, lambda x=x, w=packed[kernel]: F.linear(x, w), runs)
                except (RuntimeError, ValueError) as exc:
                    cells.append(f"not taken: {str(exc).splitlines()[0][:60]}")
                    continue
                cells.append(_cell(t))
                best = t[0] if best is None else min(best, t[0])
            gain = f"{dense[0] / best:.2f}×" if best else "—"
            print(f"| {label} | {tuple(weight.shape)} | {tokens} | {_cell(dense)} | {' | '.join(cells)} | {gain} |")


def control(token_counts: list[int], runs: int, torch, kernels: dict, size: int) -> None:
    """A layer much larger than the samples' (random weights, 2:4 masked): where the sparse kernels do pay."""
    weight = torch.randn(size, size, device="cuda", dtype=torch.float16)
    keep = weight.abs().reshape(size, size // 4, 4).argsort(dim=-1)[..., 2:]  # the two largest of every four
    mask = torch.zeros_like(weight).reshape(size, size // 4, 4).scatter_(-1, keep, 1.0).reshape(size, size)
    print(f"\n**control**: one {size} × {size} Linear, random weights, magnitude 2:4 (not part of any sample)\n")
    _layer_table(torch, {"control": weight * mask}, token_counts, runs, kernels)


def _first(result):
    import torch

    if isinstance(result, torch.Tensor):
        return result
    if isinstance(result, dict) or hasattr(result, "values"):
        return next(v for v in result.values() if isinstance(v, torch.Tensor))
    return next(v for v in result if isinstance(v, torch.Tensor))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", nargs="+", default=["minilm", "tiny-lm"])
    parser.add_argument(
        "--tokens",
        nargs="+",
        type=int,
        default=[128, 4096, 32768],
        help="activation rows per layer: batch 1, 32 and 256 × seq 128",
    )
    parser.add_argument("--control", type=int, default=8192, help="side of the large control layer (0: none)")
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    torch, kernels = _require_gpu()
    print(
        f"GPU: {torch.cuda.get_device_name()} (compute capability {'.'.join(map(str, torch.cuda.get_device_capability()))}), "
        f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    )
    for sample in args.samples:
        run(sample, args.tokens, args.runs, torch, kernels)
    if args.control:
        control(args.tokens, args.runs, torch, kernels, args.control)


if __name__ == "__main__":
    main()
