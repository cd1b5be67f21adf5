"""2:4 sparsity on an NVIDIA GPU: which layers gain with PyTorch's semi-structured sparse tensors.

    python bench/sparsity.py [--samples minilm tiny-lm] [--tokens 128 4096] [--runs 50]

Per sample, tapeout's own 2:4 masks (`quantize/prune.two_four`: magnitude, two of every four input
weights kept, protected layers skipped) go on the torch module in FP16 on the GPU. Then, per
eligible Linear, at each token count (batch × sequence rows of the activation):

  dense    F.linear(x, W) with the masked weight, as the dense tensor cores run it
  2:4      F.linear(x, to_sparse_semi_structured(W)), the sparse tensor cores (Ampere and newer)

timed with CUDA events, median of `--runs` after warm-up, and the whole module's forward dense
against every eligible Linear sparse, with the output cosine between the two (same masks, so only
the kernels differ). Layers whose shape the sparse kernels do not take are listed as such. Exits 4
with one line without a CUDA GPU of compute capability 8.0 or newer. This is what decides whether
`[pruning] what = ["2:4"]` pays for a model on a GPU; TensorRT's `sparse_weights` is measured by
bench/gpu.py's TensorRT rows where TensorRT is installed.
"""

from __future__ import annotations

import argparse
import copy
import statistics
from pathlib import Path

from cuda_host import cuda_torch, fail

REPO = Path(__file__).resolve().parents[1]


def _require_gpu():
    torch = cuda_torch("run it on an NVIDIA GPU, Ampere or newer")
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        fail(f"{torch.cuda.get_device_name()} is compute capability {major}.{minor}: 2:4 sparse tensor cores "
             "need 8.0 (Ampere) or newer")
    try:
        from torch.sparse import to_sparse_semi_structured
    except ImportError:
        fail(f"this torch ({torch.__version__}) has no torch.sparse.to_sparse_semi_structured")
    return torch, to_sparse_semi_structured


def _median_us(torch, fn, runs: int) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def _masked_module(sample: str):
    """The sample's torch module (loaded as a build loads it) with tapeout's 2:4 masks, one real input, and the
    masks' coverage."""
    from tapeout import config
    from tapeout.data import sample_inputs
    from tapeout.exporters import sources
    from tapeout.quantize import prune
    from tapeout.types import PruningSettings

    project = config.load_project(REPO / "samples" / sample)
    loaded = sources.load(project.model.source, project.root, [s.name for s in project.inputs],
                          project.model.outputs)
    module = loaded.module.eval()
    [feeds], _ = sample_inputs(project, 1)
    found = prune.inspect(module)
    keep = prune.protected(found, PruningSettings(what=["2:4"], ratio=0.5), module)
    names = dict(module.named_modules())
    coverage = prune.two_four(module, {id(names[n]) for n in keep}, found)
    return module, {s.name: feeds[s.name] for s in project.inputs}, coverage


def run(sample: str, token_counts: list[int], runs: int, torch, sparse) -> None:
    import torch.nn.functional as F

    module, feeds, coverage = _masked_module(sample)
    module = module.half().cuda().eval()
    names = dict(module.named_modules())
    print(f"\n**{sample}**: {coverage['layers']} layers masked 2:4, {coverage['eligible_share']:.0%} of the "
          f"Linear/conv weights\n")
    print("| layer | weight (out × in) | tokens | dense µs | 2:4 µs | speed-up |")
    print("|---|---|---|---|---|---|")
    sparse_weights = {}
    for name in coverage["layer_names"]:
        layer = names[name]
        if not isinstance(layer, torch.nn.Linear):
            continue
        weight = layer.weight.detach()
        try:
            packed = sparse(weight)
        except (RuntimeError, ValueError) as exc:
            print(f"| {name} | {tuple(weight.shape)} | — | — | — | not taken: {str(exc).splitlines()[0][:80]} |")
            continue
        sparse_weights[name] = packed
        for tokens in token_counts:
            x = torch.randn(tokens, weight.shape[1], device="cuda", dtype=torch.float16)
            dense_us = _median_us(torch, lambda x=x, w=weight: F.linear(x, w), runs)
            try:
                sparse_us = _median_us(torch, lambda x=x, w=packed: F.linear(x, w), runs)
            except (RuntimeError, ValueError) as exc:
                print(f"| {name} | {tuple(weight.shape)} | {tokens} | {dense_us:.1f} | — | not taken: "
                      f"{str(exc).splitlines()[0][:80]} |")
                continue
            print(f"| {name} | {tuple(weight.shape)} | {tokens} | {dense_us:.1f} | {sparse_us:.1f} | "
                  f"{dense_us / sparse_us:.2f}× |")
    inputs = tuple(torch.from_numpy(v).cuda() if v.dtype.kind in "iu" else torch.from_numpy(v).half().cuda()
                   for v in feeds.values())
    with torch.no_grad():
        dense_out = module(*inputs)
        dense_us = _median_us(torch, lambda: module(*inputs), runs)
        sparse_module = copy.deepcopy(module)
        sparse_names = dict(sparse_module.named_modules())
        for name, packed in sparse_weights.items():
            sparse_names[name].weight = torch.nn.Parameter(packed, requires_grad=False)
        sparse_out = sparse_module(*inputs)
        sparse_us = _median_us(torch, lambda: sparse_module(*inputs), runs)
    a = _first(dense_out).float().flatten()
    b = _first(sparse_out).float().flatten()
    cosine = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    print(f"\nwhole module, FP16 eager, the sample's input: dense {dense_us:.1f} µs, {len(sparse_weights)} Linears "
          f"2:4 {sparse_us:.1f} µs ({dense_us / sparse_us:.2f}×); output cosine {cosine:.6f}")


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
    parser.add_argument("--tokens", nargs="+", type=int, default=[128, 4096],
                        help="activation rows per layer: batch 1 × seq 128, and batch 32 × seq 128")
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    torch, sparse = _require_gpu()
    print(f"GPU: {torch.cuda.get_device_name()} (compute capability {'.'.join(map(str, torch.cuda.get_device_capability()))}), "
          f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    for sample in args.samples:
        run(sample, args.tokens, args.runs, torch, sparse)


if __name__ == "__main__":
    main()
