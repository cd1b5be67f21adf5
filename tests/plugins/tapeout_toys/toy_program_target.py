"""Target `toy-torch-export`: a target that compiles from the torch.export program, not from ONNX — its
capabilities say `compiles_from = "torch.export"`, and the build hands `compile_program` the ExportedProgram
its export step made. The artifact is that program saved as a .pt2; a session runs it with torch (so this
toy's device side needs torch, as ExecuTorch's and AOTInductor's Python runtimes do)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from tapeout.core.artifact import Artifact
from tapeout.core.capabilities import Capabilities
from tapeout.targets import TargetInfo
from tapeout.targets.base import Probe, Session, Target


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProgramSession(Session):
    def __init__(self, artifact: Artifact):
        from tapeout.core import pt2

        self._module = pt2.load(artifact.path).module()  # the safe loader: a .pt2 from a build dir is data
        io = json.loads((artifact.directory / "io.json").read_text())
        self.input_names, self.output_names = io["inputs"], io["outputs"]

    def _run(self, feeds):
        import torch

        with torch.inference_mode():
            out = self._module(*(torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in self.input_names))
        outs = out if isinstance(out, tuple | list) else (out,)
        return {name: t.numpy() for name, t in zip(self.output_names, outs, strict=True)}


class ToyTorchExport(Target):
    Options = Options

    @classmethod
    def probe(cls) -> Probe:
        try:
            import torch
        except ImportError as exc:
            return Probe(False, reason=f"torch cannot be imported ({exc})", install_hint="pip install torch")
        return Probe(True, torch.__version__)

    def compile_program(self, program, out_dir: Path, inputs, dims, output_names) -> Artifact:
        import torch

        out_dir.mkdir(parents=True, exist_ok=True)
        torch.export.save(program, str(out_dir / "model.pt2"))
        (out_dir / "io.json").write_text(json.dumps({"inputs": [s.name for s in inputs], "outputs": output_names}))
        return Artifact(self.name, out_dir, "model.pt2", meta={"program_nodes": len(program.graph.nodes)})

    def session(self, artifact: Artifact) -> Session:
        return ProgramSession(artifact)


TARGET = TargetInfo(
    name="toy-torch-export",
    cls="tapeout_toys.toy_program_target:ToyTorchExport",
    summary="runs the torch.export program it compiles from (a plug-in target)",
    device_classes=("cpu",),
    install_hint="pip install torch",
    capabilities=Capabilities(precisions={"fp32": ("fp32",)}, meters=("rss",), compiles_from="torch.export"),
)
