"""Step `load`: the project's model source, loaded (a torch module, or an ONNX file taken as given)."""

from __future__ import annotations

import dataclasses

from tapeout.core.errors import BadInput
from tapeout.core.hashing import sha256_file
from tapeout.records.report import ModelInfo, ProjectInfo
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


def require_torch(source: str, loaded) -> None:
    """[pruning] works on the torch module: an ONNX source has none."""
    if loaded.kind != "torch":
        raise BadInput(
            f'[pruning] needs a torch model, and [model] source = "{source}" is ONNX',
            fix="point [model] source at the torch module (file.py:callable, a Hugging Face directory "
            "or a .pt2), or remove [pruning] from the profile",
        )


class Load(Step):
    name = "load"
    adds = ("loaded",)

    def run(self, state: BuildState) -> None:
        from tapeout.exporters import sources

        project = state.setup.project
        with state.ui.step(f"load model ({project.model.source})"):
            loaded = sources.load(
                project.model.source, project.root, [s.name for s in project.inputs], project.model.outputs
            )
        for note in loaded.notes:
            state.ui.note(note)
        if state.setup.profile.pruning is not None:
            require_torch(project.model.source, loaded)
        if project.workload.kind == "generate":
            loaded = self._decoder(state, loaded)
        if project.workload.kind == "stream" and loaded.kind == "torch":
            _state_fits(project, loaded)
        state.loaded = loaded

    def _decoder(self, state: BuildState, loaded):
        """A generate workload: the decoder wrapped as the KV-cache graph, checked to fit the device at the declared
        context before anything is built, and the project from here on described as that graph's inputs."""
        from tapeout.exporters import generation

        project = state.setup.project
        if loaded.kind != "torch":
            raise BadInput(
                f'[workload] kind = "generate" exports the decoder with its KV cache, and [model] source = '
                f'"{project.model.source}" is ONNX',
                fix="point [model] source at the torch decoder "
                '(file.py:callable or a Hugging Face causal-LM directory), or use kind = "forward"',
            )
        if state.setup.profile.pruning is not None:
            raise BadInput(
                "[pruning] does not run on a generate workload yet (it prunes one forward call)",
                fix='remove [pruning] from the profile, or use [workload] kind = "forward"',
            )
        target = state.setup.target
        masked = target.static_decode()
        if masked and project.workload.batch != 1:
            raise BadInput(
                f"profile '{state.setup.profile.name}' decodes through graphs of static shapes, built for one "
                f"sequence at a time, and [workload] batch = {project.workload.batch}",
                fix="set [workload] batch = 1",
            )
        decoder = generation.decoder_of(loaded.module, project.model.source, masked, target.name)
        layout = generation.layout_of(decoder, project.workload, project.model.source, masked)
        fits(state, decoder, layout)
        loaded = dataclasses.replace(
            loaded, module=generation.cache_graph(decoder, masked), output_names=layout.outputs()
        )
        state.setup = dataclasses.replace(state.setup, project=generation.graph_project(project, layout))
        state.ui.note(
            f"generate: {layout.layers} layers, {layout.kv_heads} KV heads × {layout.head_dim}, vocabulary "
            f"{layout.vocab}; KV cache {layout.kv_bytes(layout.max_context, project.workload.batch) / 2**20:.1f} MB "
            f"at max_context {layout.max_context}"
        )
        return loaded

    def report(self, state: BuildState) -> dict[str, object]:
        project, loaded = state.setup.project, state.loaded
        return {
            "project": ProjectInfo(name=project.display_name, source=project.model.source, file=str(project.file)),
            "model": ModelInfo(
                kind=loaded.kind,
                description=loaded.description,
                weights_sha256=loaded.weights_sha256 or sha256_file(loaded.onnx_path),
                files={str(f.name): sha256_file(f) for f in loaded.files},
            ),
        }


def _state_fits(project, loaded) -> None:
    """A stream's state outputs have their state inputs' shapes, checked on one call before anything is built (an
    ONNX source is checked on the reference's first chunk)."""
    import numpy as np

    from tapeout.core.feeds import random_feeds
    from tapeout.exporters.torch_onnx import torch_outputs
    from tapeout.measurement.streaming import check_state_shapes

    feeds = random_feeds(project.inputs, project.dims, np.random.default_rng(project.seed))
    check_state_shapes(
        project, torch_outputs(loaded.module, feeds, [s.name for s in project.inputs], loaded.output_names)
    )


WEIGHT_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


def fits(state: BuildState, module, layout) -> None:
    """Before building: the weights at the profile's precision plus the KV cache at max_context against the
    device's memory (the device spec's, else this host's). One line naming the numbers when they cannot fit."""
    import psutil

    setup = state.setup
    workload = setup.project.workload
    params = sum(p.numel() for p in module.parameters())
    weights = params * WEIGHT_BYTES.get(setup.profile.precision, 4.0)
    kv = layout.kv_bytes(workload.max_context, workload.batch)
    if setup.device is not None:
        memory, where = (
            setup.device.memory_gb.value * 1e9,
            f"device {setup.device.name}'s {setup.device.memory_gb.value:g} GB",
        )
    else:
        memory, where = (
            float(psutil.virtual_memory().total),
            f"this host's {psutil.virtual_memory().total / 1e9:.1f} GB",
        )
    if weights + kv > memory:
        raise BadInput(
            f"the KV cache cannot fit: {params / 1e6:.1f} M parameters at {setup.profile.precision} "
            f"({weights / 1e9:.2f} GB) + KV cache at max_context {workload.max_context} × batch "
            f"{workload.batch} ({kv / 1e9:.2f} GB) = {(weights + kv) / 1e9:.2f} GB > {where}",
            fix="lower [workload] max_context or batch, or pick a lower precision or a larger device",
        )
