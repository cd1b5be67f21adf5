"""ONNX Runtime on the CPU execution provider: the embedded default target.

compile = let ORT apply its portable graph optimizations (basic, extended: constant folding,
fusions) once and save the result as the artifact. The "all" level adds layout optimizations
(NCHWc) whose weight blocking depends on the CPU's vector width: a model saved with them on an
AVX2 host computes garbage on an AVX-512 host (seen: cosine -0.11 on a Xeon for a model built on
an EPYC). So they are never saved; a session applies them at load, for the CPU it runs on.
"""

from __future__ import annotations

from pathlib import Path

from tapeout.core.artifact import Artifact
from tapeout.core.paths import external_data_files
from tapeout.core.schemas import InputSpec
from tapeout.targets.ort_ep import OrtOptions, OrtTarget

ARTIFACT_FILE = "model.onnx"
_LEVEL_ORDER = ("disable", "basic", "extended", "all")
PORTABLE_LEVEL = "extended"  # the highest level whose saved output runs on any CPU


class Options(OrtOptions):
    pass


class OrtCpu(OrtTarget):
    Options = Options  # the probe is the EP base's: the CPU EP is in every onnxruntime build

    def compile(self, model_path: Path, out_dir: Path, inputs: list[InputSpec], dims: dict[str, int]) -> Artifact:
        """Apply the portable optimizations once and save the result; that model is the artifact."""
        out_dir.mkdir(parents=True, exist_ok=True)
        saved = min(self.options.graph_optimization, PORTABLE_LEVEL, key=_LEVEL_ORDER.index)
        so = self._session_options(level=saved)
        so.optimized_model_filepath = str(out_dir / ARTIFACT_FILE)
        if external_data_files(Path(model_path)):  # ORT would save references to files it does not write
            so.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", ARTIFACT_FILE + ".data"
            )
            so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        self._load(Path(model_path), so, f"{model_path}")
        return Artifact(
            self.name,
            out_dir,
            ARTIFACT_FILE,
            meta={"saved_optimization": saved, "load_optimization": self.options.graph_optimization},
        )
