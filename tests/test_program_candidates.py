"""The precision step's candidates for a device-compiled torch.export target (aoti-cuda), our side: each candidate's
engine is compiled to score it, and only the kept program's engine moves to the build's engines/, where the engine
step finds it instead of compiling it again. The target here is a stand-in for the GPU compile (no GPU on CI): it
writes the program and stores an engine record the way targets/aoti_cuda.py does."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tapeout.core.artifact import Artifact
from tapeout.core.hashing import sha256_file
from tapeout.exporters.torch_onnx import save_program
from tapeout.steps.precision import ProgramCandidates
from tapeout.targets import engine_cache


class _DeviceCompiled:
    capabilities = SimpleNamespace(compile_on="device")

    def __init__(self):
        self.engines_built = 0

    def compile_program(self, program, out_dir: Path, inputs, dims, output_names) -> Artifact:
        out_dir.mkdir(parents=True)
        save_program(program, out_dir / "program.pt2")
        return Artifact("stand-in", out_dir, "program.pt2")

    def build_engine(self, artifact: Artifact, progress) -> None:
        key = {"gpu": "stand-in", "program_sha256": sha256_file(artifact.path)}
        engine_cache.store(engine_cache.entry(artifact.directory, key, ".pt2"), b"package", key, seconds=0.0)
        self.engines_built += 1


def _program(tmp_path: Path, scale: float) -> Path:
    import torch

    class Scale(torch.nn.Module):
        def forward(self, x):
            return x * scale

    path = tmp_path / f"candidate-{scale}.pt2"
    save_program(torch.export.export(Scale(), (torch.ones(2),)), path)
    return path


def test_only_the_kept_candidates_engine_moves_to_the_build(tmp_path):
    target = _DeviceCompiled()
    out = tmp_path / "staging"
    (out / "quantized").mkdir(parents=True)
    state = SimpleNamespace(
        out=out,
        ui=SimpleNamespace(detail=lambda line: None),
        setup=SimpleNamespace(
            target=target, capabilities=target.capabilities, project=SimpleNamespace(inputs=[], dims={})
        ),
        exported=SimpleNamespace(info={"output_names": ["y"]}),
    )
    first, second = _program(tmp_path, 2.0), _program(tmp_path, 3.0)
    with ProgramCandidates(state) as compiled:
        compiled(first)
        compiled(second)
        compiled(second)  # asked again (the model kept): not compiled twice
        kept = compiled.keep(second)
        assert target.engines_built == 2
        assert kept is not None and (kept.directory / "program.pt2").is_file()
        moved = sorted(p.name for p in (out / "engines").iterdir())
        assert len(moved) == 2 and {Path(n).suffix for n in moved} == {".pt2", ".json"}
        record = engine_cache.read_record(next((out / "engines").glob("*.json")))
        assert record["key"]["program_sha256"] == sha256_file(kept.directory / "program.pt2")
        assert record["key"]["program_sha256"] != sha256_file(first)
    assert not (out / "quantized" / ".compiled").exists()  # the other candidate's engine went with the scratch
