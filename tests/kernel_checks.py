"""Kernel checks that must run in a fresh process: Triton's interpreter has to be on before triton is imported,
and the test worker may have imported it already (Inductor does). `python tests/kernel_checks.py SCENARIO` prints
one JSON object; tests/test_kernels.py runs it."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"


def planted() -> dict:
    """Four kernels that must fail verification: an off-by-one in a mask, a write past the output's end, a cached
    result, an aliased output."""
    import importlib.util

    from tapeout.measurement import kernel_harness as harness
    from tapeout.targets.kernels import add_norm, silu_mul

    source = Path(add_norm.__file__).read_text()
    assert "inside = cols < width\n" in source
    folder = Path(tempfile.mkdtemp())
    (folder / "off_by_one.py").write_text(source.replace("inside = cols < width\n", "inside = cols < width - 1\n"))
    spec = importlib.util.spec_from_file_location("off_by_one", folder / "off_by_one.py")
    mutated = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mutated)

    class OffByOne(add_norm.AddLayerNorm):
        source = mutated._add_norm

    silu = Path(silu_mul.__file__).read_text()
    assert "inside = cols < width\n" in silu
    (folder / "past_the_end.py").write_text(silu.replace("inside = cols < width\n", "inside = cols < width + 1\n"))
    spec = importlib.util.spec_from_file_location("past_the_end", folder / "past_the_end.py")
    overrun = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(overrun)

    class PastTheEnd(silu_mul.SiluMul):  # each row writes one element more: the last row's lands past the output
        source = overrun._silu_mul

    class Cached(silu_mul.SiluMul):
        kept = None

        def run(self, inputs, outputs, config):
            if self.kept is None:
                super().run(inputs, outputs, config)
                self.kept = outputs["out"].clone()
            outputs["out"].copy_(self.kept)

    class Aliased(silu_mul.SiluMul):
        def outputs(self, case, dtype, inputs, device):
            return {"out": inputs["gate"]}

    found = {}
    for name, kernel in (
        ("off_by_one", OffByOne()),
        ("past_the_end", PastTheEnd()),
        ("cached", Cached()),
        ("aliased", Aliased()),
        ("honest", silu_mul.SiluMul()),
    ):
        checks = harness.verify(kernel, "interpreter", ("float32",))
        found[name] = [{"case": c.case, "ok": c.ok, "problem": c.problem, "unwritten": c.unwritten} for c in checks]
    return found


def substitution() -> dict:
    """A block with every chain the kernels replace, exported; a stand-in timing table (the kernel faster than
    Inductor everywhere but silu·mul, each timed with the last config of its tuning space, not the default); the
    rewritten program run in the interpreter against the original."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from tapeout.targets import kernels
    from tapeout.targets.kernels import substitute, timings

    class Block(nn.Module):
        def __init__(self, d=64, heads=4):
            super().__init__()
            self.heads = heads
            self.qkv, self.ln = nn.Linear(d, 3 * d), nn.LayerNorm(d)
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.gate, self.up2 = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False)
            self.rms, self.out = nn.RMSNorm(d, eps=1e-6), nn.Linear(2 * d, d)

        def forward(self, x, mask, cos, sin):
            b, n, d = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            half = q.shape[-1] // 2

            def rotate(t):
                return t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin

            a = F.scaled_dot_product_attention(rotate(q), rotate(k), v, attn_mask=mask).transpose(1, 2).reshape(b, n, d)
            h = self.ln(a + x)
            h2 = self.down(F.gelu(self.up(h)))
            r = self.rms(h2 + h)
            return self.out(F.silu(self.gate(r)) * self.up2(r))

    torch.manual_seed(0)
    model = Block().eval()
    x, mask = torch.randn(2, 8, 64), torch.zeros(2, 1, 1, 8)
    mask[1, ..., 6:] = torch.finfo(torch.float32).min
    angle = torch.rand(1, 1, 8, 8)
    cos, sin = torch.cat([angle, angle], -1).cos(), torch.cat([angle, angle], -1).sin()
    inputs = (x, mask, cos, sin)
    with torch.no_grad():
        want = model(*inputs)
        on_cpu = torch.export.export(model, inputs)
        _, cpu_decisions = substitute.substitute(on_cpu, {}, None)
        program = torch.export.export(model, inputs)
        matches = substitute.find(program)
        tuned = {m.kernel: kernels.get(m.kernel).configs(m.case)[-1].key for m in matches}
        table = {
            timings.entry_key(m.kernel, m.case.key, m.dtype): timings.Timing(
                config=tuned[m.kernel],
                kernel_ms=1.0,
                kernel_p90_ms=1.1,
                inductor_ms=0.5 if m.kernel == "silu-mul" else 2.0,
                calls=10,
            )
            for m in matches
        }
        replaced, decisions = substitute.substitute(program, table, "stand-in GPU")
        got = program.module()(*inputs)
    calls = [n for n in program.graph_module.graph.nodes if str(n.target).startswith("tapeout.")]
    ops = sorted(str(n.target) for n in calls)
    launched = sorted({(str(n.target), n.args[-1]) for n in calls})
    return {
        "replaced": replaced,
        "decisions": [d.row() for d in decisions],
        "ops": ops,
        "tuned": tuned,
        "launched": [list(pair) for pair in launched],
        "cpu": [d.row() for d in cpu_decisions],
        "max_abs": float((got - want).abs().max()),
        "sdpa_left": sum(
            str(n.target) == "aten.scaled_dot_product_attention.default" for n in program.graph_module.graph.nodes
        ),
    }


def samples() -> dict:
    """The samples' own programs (real weights): which chains match in MiniLM and llama-40m; MiniLM with every
    match substituted (a stand-in table: the kernels faster everywhere), run in the interpreter against torch."""
    import torch

    from tapeout.core.config import load_project
    from tapeout.exporters import sources, torch_onnx
    from tapeout.targets.kernels import get, substitute, timings

    repo = Path(__file__).resolve().parents[1]
    found = {}
    for sample in ("minilm", "llama-40m"):
        project = load_project(repo / "samples" / sample / "tapeout.toml")
        loaded = sources.load(
            project.model.source, repo / "samples" / sample, [i.name for i in project.inputs], project.model.outputs
        )
        options = torch_onnx.ExportOptions(opset=18, max_ir_version=10)
        program = torch_onnx.export_program(loaded, project.inputs, project.dims, options)
        matches = substitute.find(program, inputs=project.inputs, dims=project.dims)
        found[sample] = {
            "matches": [f"{m.kernel} {m.dtype}" for m in matches],
            "cases": sorted({f"{m.kernel} {m.case.key}" for m in matches}),
            "traced_at": sorted({f"{m.kernel} {m.case.key}" for m in substitute.find(program)}),
        }
        if sample != "minilm":
            continue
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, 30522, (1, 128), generator=generator)
        mask = torch.ones(1, 128, dtype=torch.int64)
        mask[0, 100:] = 0
        inputs = (ids, mask, torch.zeros(1, 128, dtype=torch.int64))
        with torch.no_grad():
            want = program.module()(*inputs)
            table = {
                timings.entry_key(m.kernel, m.case.key, m.dtype): timings.Timing(
                    config=get(m.kernel).configs(m.case)[-1].key,
                    kernel_ms=1.0,
                    kernel_p90_ms=1.0,
                    inductor_ms=2.0,
                    calls=10,
                )
                for m in matches
            }
            replaced, _ = substitute.substitute(program, table, "stand-in GPU", project.inputs, project.dims)
            got = program.module()(*inputs)
        want, got = (t[0] if isinstance(t, (tuple, list)) else t for t in (want, got))
        found[sample].update(
            replaced=replaced,
            max_abs=float((got - want).abs().max()),
            left=sorted(
                {
                    str(n.target)
                    for n in program.graph_module.graph.nodes
                    if str(n.target) in ("aten.softmax.int", "aten.layer_norm.default", "aten.gelu.default")
                }
            ),
        )
    return found


def aoti_cuda() -> dict:
    """aoti-cuda's use of the pass (targets/aoti_cuda.substitute_kernels) on a dynamic program, our side: the chains
    priced at the project's dims the build recorded, decided from the timings file of the GPU named (a stand-in
    file here), and that file's digest in the package's cache key."""
    import torch

    from tapeout.targets.aoti_cuda import EngineSettings, kernel_timings_digest, substitute_kernels
    from tapeout.targets.kernels import get, substitute, timings

    class AddNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(384)

        def forward(self, x, y):
            return self.ln(x + y)

    batch = torch.export.Dim("batch", min=1, max=64)
    args = (torch.randn(2, 128, 384), torch.randn(2, 128, 384))
    program = torch.export.export(AddNorm().eval(), args, dynamic_shapes=({0: batch}, {0: batch}))
    settings = EngineSettings(
        freezing=True,
        max_autotune=False,
        precision="fp32",
        built_with_torch=torch.__version__,
        input_shapes=[["batch", 128, 384], ["batch", 128, 384]],
        dims={"batch": 4},
    )
    folder, gpu = Path(tempfile.mkdtemp()), "stand-in GPU | sm90 | triton x | torch y"
    before = kernel_timings_digest(gpu, folder)
    untimed = substitute_kernels(program, settings, gpu, folder)
    (match,) = substitute.find(
        program, inputs=[type("S", (), {"shape": s})() for s in settings.input_shapes], dims=settings.dims
    )
    config = get(match.kernel).configs(match.case)[-1].key
    timings.save(
        gpu,
        {
            timings.entry_key(match.kernel, match.case.key, match.dtype): timings.Timing(
                config=config, kernel_ms=0.004, kernel_p90_ms=0.0045, inductor_ms=0.006, calls=100
            )
        },
        folder,
    )
    timed = substitute_kernels(program, settings, gpu, folder)
    return {
        "untimed": untimed,
        "timed": timed,
        "case": match.case.key,
        "digest_before": before,
        "digest_after": kernel_timings_digest(gpu, folder),
        "ops": sorted(str(n.target) for n in program.graph_module.graph.nodes if str(n.target).startswith("tapeout.")),
    }


if __name__ == "__main__":
    print(
        json.dumps(
            {"planted": planted, "substitution": substitution, "samples": samples, "aoti_cuda": aoti_cuda}[
                sys.argv[1]
            ]()
        )
    )
