"""ONNX Runtime on the CPU execution provider: the embedded default target.

compile = let ORT apply its portable graph optimizations (basic, extended: constant folding,
fusions) once and save the result as the artifact. The "all" level adds layout optimizations
(NCHWc) whose weight blocking depends on the CPU's vector width: a model saved with them on an
AVX2 host computes garbage on an AVX-512 host (seen: cosine -0.11 on a Xeon for a model built on
an EPYC). So they are never saved; a session applies them at load, for the CPU it runs on.

A generate workload's cache graph first gets its attention as ORT's fused GroupQueryAttention (the target-stage
pass `group-query-attention`: rotary embedding, cache append and causal attention in one kernel per layer); the
artifact's meta records what the pass did.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tapeout.core.artifact import Artifact
from tapeout.core.decoding import INPUT_IDS
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
        source, passes = Path(model_path), []
        if _is_cache_graph(inputs, dims):
            source, passes = _fuse_attention(source, out_dir.parent / "fused-attention", dims["past"] + 1)
        try:
            if external_data_files(source):  # ORT would save references to files it does not write
                so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                            ARTIFACT_FILE + ".data")
                so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
            self._load(source, so, f"{model_path}")
        finally:
            if source != Path(model_path):
                shutil.rmtree(source.parent, ignore_errors=True)
        return Artifact(self.name, out_dir, ARTIFACT_FILE,
                        meta={"saved_optimization": saved, "load_optimization": self.options.graph_optimization,
                              **({"passes": passes} if passes else {})})


def _is_cache_graph(inputs: list[InputSpec], dims: dict[str, int]) -> bool:
    """A generate workload's graph (exporters/generation.py): input_ids and the past keys and values."""
    names = {spec.name for spec in inputs}
    return INPUT_IDS in names and "past_key_0" in names and "past" in dims


def _fuse_attention(model_path: Path, folder: Path, max_context: int) -> tuple[Path, list[dict]]:
    """The cache graph with ORT's GroupQueryAttention where the pass matches (saved in `folder`, which the caller
    removes), else the model as it was; and the pass's record."""
    import onnx

    from tapeout.quantize.passes.base import run_on_proto
    from tapeout.quantize.passes.group_query_attention import GroupQueryAttention

    model, records = run_on_proto(onnx.load(str(model_path)), [GroupQueryAttention(max_context)])
    if not any(r["outcome"] == "applied" for r in records):
        return model_path, records
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / ARTIFACT_FILE), save_as_external_data=True, location=ARTIFACT_FILE + ".data")
    return folder / ARTIFACT_FILE, records

