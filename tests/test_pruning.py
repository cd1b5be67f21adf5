"""Structured pruning (quantize/prune.py, steps/prune.py): real Torch-Pruning on real modules.

digits-cnn end to end (channels, built-in distillation, export parity against the pruned module, the
report's section); a residual CNN and an attention block, where coupled layers must stay consistent;
depth pruning of a block list; the activation-aware importance; recovery on the blocks' hidden states;
2:4 masks; the latency search, timed here or estimated for a device; and the bad inputs the profile
can carry.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from conftest import SAMPLES, one_line_error, run_cli
from tapeout.core.errors import BadInput
from tapeout.core.profile_schema import PruningSettings
from tapeout.quantize import prune

pytest.importorskip("torch_pruning", reason="the prune extra (Torch-Pruning) is not installed")

PROFILE = """extends = "cpu-fp32"
[pruning]
{pruning}
[budgets]
accuracy_max_drop = 0.01
[check]
iterations = 100
repeats = 1
"""


def _profile(tmp_path, pruning: str, name: str = "pruned"):
    path = tmp_path / f"{name}.toml"
    path.write_text(PROFILE.format(pruning=pruning))
    return path


def test_digits_channels_pruned_by_half_lose_under_a_point_after_distillation(tmp_path):
    out = tmp_path / "b"
    result = run_cli(
        "build",
        SAMPLES / "digits-cnn",
        "--profile",
        _profile(tmp_path, 'what = ["channels"]\nratio = 0.5\ndistill_steps = 300'),
        "--out",
        out,
        "--json",
    )
    assert result.code == 0, result.err
    report = result.json()
    p = report["pruning"]
    assert p["flops_reduction"] >= 0.40  # the target: FLOPs -40 % ...
    acc = report["accuracy"]
    assert acc["reference"] - acc["artifact"] <= 0.01  # ... with top-1 within a point
    assert set(p["protected"]) == {"features.0", "classifier.3"}  # first conv, classifier
    assert all(w % 8 == 0 for n, w in p["steps"][0]["widths"].items() if n not in p["protected"])
    assert p["recovery"]["steps"] == 300 and p["recovery"]["loss_last"] < p["recovery"]["loss_first"]
    assert (p["recovery"]["batch"], p["recovery"]["trimmed"]) == (16, False)  # images stack; nothing to trim
    assert report["export"]["parity"] and all(
        x["within_tolerance"] for x in report["export"]["parity"]
    )  # vs the pruned module
    assert report["golden"]["reference"] == "the pruned torch module (FP32)"
    assert "## Pruning" in (md := (out / "report.md").read_text())
    assert "on 64 inputs from calibration data data/calibration.npz, 16 a step." in md


def test_the_precision_loop_is_not_run_when_the_pruned_float_model_already_misses_the_budget(tmp_path):
    """Moving groups to FP32 cannot recover what pruning removed: it would only give up the INT8 speed."""
    profile = tmp_path / "int8-pruned.toml"
    profile.write_text(
        PROFILE.replace("cpu-fp32", "cpu-int8")
        .format(pruning='what = ["channels"]\nratio = 0.75\ndistill_steps = 0')
        .replace("0.01", "0.0001")
    )
    out = tmp_path / "b"
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", profile, "--out", out, "--json")
    assert result.code == 1, result.err  # the accuracy budget is missed, and said so
    report = result.json()
    pruned = report["pruning"]["metric_fp32"]
    assert pruned < report["accuracy"]["reference"] - 0.0001
    search = report["quantization"]["search"]
    assert (
        search["evaluations"] == 1
        and "the loop was not run: the pruned FP32 model already misses it" in search["stopped"]
    )
    assert "before the precision step" in (out / "report.md").read_text()


class ResidualCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.a = nn.Conv2d(32, 32, 3, padding=1)
        self.b = nn.Conv2d(32, 32, 3, padding=1)
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)  # depthwise: in and out channels move together
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = x + self.b(torch.relu(self.a(x)))  # residual: stem's and b's output channels are one group
        x = torch.relu(self.dw(x))
        return self.head(x.mean((2, 3)))


class Attention(nn.Module):
    def __init__(self, width: int = 64, heads: int = 8) -> None:
        super().__init__()
        self.num_heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, self.num_heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        attn = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ v
        return x + self.o_proj(attn.transpose(1, 2).reshape(b, t, -1))


class TinyEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 64)
        self.attn = Attention()
        self.up, self.down = nn.Linear(64, 256), nn.Linear(256, 64)
        self.head = nn.Linear(64, 3)

    def forward(self, ids):
        x = self.attn(self.embed(ids))
        x = x + self.down(torch.relu(self.up(x)))
        return self.head(x)


def _settings(**kw) -> PruningSettings:
    return PruningSettings(**{"ratio": 0.5, "distill_steps": 0, **kw})


def test_residual_and_depthwise_channels_stay_coupled():
    torch.manual_seed(0)
    model = ResidualCNN().eval()
    x = (torch.randn(1, 3, 16, 16),)
    model, info = prune.apply(model, x, _settings(what=["channels"]), 8, [x], lambda _: None)
    # the residual add ties stem, b and the depthwise conv into one width; the stem (first conv) is protected,
    # so that whole group keeps its 32 channels, while a's output (b's input) is free and halves
    widths = {
        model.stem.out_channels,
        model.b.out_channels,
        model.dw.in_channels,
        model.dw.out_channels,
        model.head.in_features,
    }
    assert widths == {32} and model.dw.groups == 32
    assert model.a.out_channels == model.b.in_channels == 16
    assert model(*x).shape == (1, 5) and info["flops_reduction"] > 0.2
    assert "stem" in info["protected"] and "head" in info["protected"]
    # unprotected, the residual group shrinks as one: every member the same multiple of 8
    free = ResidualCNN().eval()
    free, _ = prune.apply(free, x, _settings(what=["channels"]), 8, [x], lambda _: None)
    assert len({free.b.out_channels, free.dw.out_channels, free.dw.in_channels, free.head.in_features}) == 1


def test_attention_heads_and_mlp_width_pruned_consistently():
    torch.manual_seed(0)
    model = TinyEncoder().eval()
    ids = (torch.randint(0, 100, (1, 12)),)
    model, info = prune.apply(model, ids, _settings(what=["heads", "mlp"]), 8, [ids], lambda _: None)
    attn = model.attn
    assert attn.num_heads == 4  # half the heads, the count the forward reads updated
    assert attn.q_proj.out_features == attn.k_proj.out_features == attn.v_proj.out_features == 32
    assert attn.o_proj.in_features == 32 and attn.o_proj.out_features == 64  # the residual width is untouched
    assert model.up.out_features == model.down.in_features == 128
    assert model(*ids).shape == (1, 12, 3)
    assert [s["what"] for s in info["steps"]] == ["heads", "mlp"]


class Block(nn.Module):
    def __init__(self, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.attn = Attention()
        self.up, self.down = nn.Linear(64, 128), nn.Linear(128, 64)

    def forward(self, x):
        x = self.attn(x)
        return x + self.down(torch.relu(self.up(x)))


class Config:
    num_hidden_layers = 4


class DeepEncoder(nn.Module):
    """Four residual blocks in a ModuleList, its length in a config the forward loops over, as HF models do."""

    def __init__(self) -> None:
        super().__init__()
        self.config = Config()
        self.embed = nn.Embedding(100, 64)
        self.layers = nn.ModuleList(Block(i) for i in range(4))
        self.head = nn.Linear(64, 3)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers[: self.config.num_hidden_layers]:
            x = layer(x)
        return self.head(x)


def _quiet(block: Block) -> None:
    """A block that barely changes its stream: its residual branches scaled to almost nothing."""
    with torch.no_grad():
        block.attn.o_proj.weight.mul_(1e-3)
        block.attn.o_proj.bias.zero_()
        block.down.weight.mul_(1e-3)
        block.down.bias.zero_()


def test_depth_pruning_removes_the_blocks_that_change_their_input_least():
    torch.manual_seed(0)
    model = DeepEncoder().eval()
    _quiet(model.layers[1])
    _quiet(model.layers[2])
    teacher = DeepEncoder().eval()
    teacher.load_state_dict(model.state_dict())
    ids = [(torch.randint(0, 100, (1, 12)),) for _ in range(4)]
    model, info = prune.apply(model, ids[0], _settings(what=["depth"]), 8, ids, lambda _: None)
    [step] = info["steps"]
    assert step["removed"] == ["layers.1", "layers.2"] and step["kept"] == [0, 3]
    assert step["influence"]["layers.1"] < 0.01 < step["influence"]["layers.0"]
    assert len(model.layers) == 2 and model.config.num_hidden_layers == 2  # the loop's bound follows
    assert [b.layer_idx for b in model.layers] == [0, 1]  # renumbered, as a KV cache indexes them
    assert info["flops_reduction"] > 0.4
    with torch.no_grad():  # the quiet blocks were nearly identities: the output barely moves
        assert torch.allclose(model(*ids[0]), teacher(*ids[0]), atol=0.05)
    # recovery matches each kept block's hidden state to the teacher block it came from
    from tapeout.quantize.distill import block_pairs, distill

    pairs = block_pairs(model, teacher)
    assert [t for _, t in pairs] == [teacher.layers[0], teacher.layers[3]]
    result = distill(model, teacher, ids, _settings(what=["depth"], distill_steps=3, distill_lr=1e-4), lambda _: None)
    assert result["hidden_blocks"] == 2 and "hidden states of 2 blocks" in result["method"]


class MaskedEncoder(nn.Module):
    """Attention over real tokens only (padding keys masked out), as BERT-like encoders do. `leak`: the output
    also takes the mean over every position, padding included, so trimming padding changes it; `mix`: each row
    takes the batch's mean, so stacking inputs changes it."""

    def __init__(self, leak: bool = False, mix: bool = False) -> None:
        super().__init__()
        self.leak, self.mix = leak, mix
        self.embed, self.pos = nn.Embedding(100, 32), nn.Embedding(64, 32)
        self.q, self.k, self.v = (nn.Linear(32, 32) for _ in range(3))
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, ids, mask):
        x = self.embed(ids) + self.pos(torch.arange(ids.shape[1]))
        scores = self.q(x) @ self.k(x).transpose(-2, -1) / 32**0.5
        scores = scores.masked_fill(mask[:, None, :] == 0, torch.finfo(scores.dtype).min)
        x = x + torch.softmax(scores, -1) @ self.v(x)
        x = x + self.down(torch.relu(self.up(x)))
        if self.leak:
            x = x + x.mean(1, keepdim=True)
        if self.mix:
            x = x + x.mean(0, keepdim=True)
        return x


def _padded(count: int, length: int = 48) -> list[tuple]:
    """Right-padded token inputs of 3 to 12 real tokens each, batch 1, as a tokenizer pads to a fixed length."""
    gen = torch.Generator().manual_seed(0)
    inputs = []
    for _ in range(count):
        real = int(torch.randint(3, 13, (1,), generator=gen))
        ids = torch.zeros(1, length, dtype=torch.long)
        ids[0, :real] = torch.randint(1, 100, (real,), generator=gen)
        mask = (ids != 0).long()
        inputs.append((ids, mask))
    return inputs


@pytest.mark.parametrize(
    ("model", "batch", "trimmed"),
    [
        ("masked", 8, True),  # answers unchanged either way: 8 inputs a step, cut to the longest real one
        ("leak", 8, False),  # padding reaches the output: stacked, not trimmed
        ("mix", 1, True),  # rows mix across the batch: one input a step, trimmed
    ],
)
def test_recovery_stacks_and_trims_inputs_only_where_the_teachers_answers_stay_the_same(model, batch, trimmed):
    from tapeout.core.schemas import InputSpec
    from tapeout.quantize.distill import distill
    from tapeout.steps.prune import batch_layout

    torch.manual_seed(0)
    teacher = MaskedEncoder(leak=model == "leak", mix=model == "mix").eval()
    student = MaskedEncoder(leak=model == "leak", mix=model == "mix").eval()
    student.load_state_dict(teacher.state_dict())
    with torch.no_grad():
        student.up.weight.mul_(0.5)  # a damaged student for recovery to repair
    for p in teacher.parameters():
        p.requires_grad_(False)
    layout = batch_layout(
        [
            InputSpec(name="ids", shape=["batch", "sequence"], dtype="int64"),
            InputSpec(name="mask", shape=["batch", "sequence"], dtype="int64"),
        ],
        1,
    )
    assert layout.stack and layout.trim == (1, 1)
    inputs = _padded(32)
    result = distill(
        student,
        teacher,
        inputs,
        _settings(what=["mlp"], distill_steps=40, distill_batch=8, distill_lr=3e-3),
        lambda _: None,
        1,
        layout,
    )
    assert (result["batch"], result["trimmed"]) == (batch, trimmed)
    assert result["samples"] == 32 and result["loss_last"] < result["loss_first"]
    assert ("batching" in result) == (model != "masked")


def test_batch_layout_follows_the_declared_dims():
    from tapeout.core.schemas import InputSpec
    from tapeout.steps.prune import batch_layout

    image = [InputSpec(name="image", shape=["batch", 1, 8, 8])]
    assert batch_layout(image, None).stack and not batch_layout(image, None).trim
    pinned = [InputSpec(name="ids", shape=[1, 16], dtype="int64"), InputSpec(name="mask", shape=[1, 16], dtype="int64")]
    assert not batch_layout(pinned, 1).stack and not batch_layout(pinned, 1).trim  # nothing named: nothing assumed
    mixed = [
        InputSpec(name="ids", shape=["batch", "seq"], dtype="int64"),
        InputSpec(name="pixels", shape=["batch", 3, 8, 8]),
        InputSpec(name="mask", shape=["batch", "seq"], dtype="int64"),
    ]
    assert batch_layout(mixed, 2).trim == (1, None, 1)


def test_depth_requests_that_cannot_be_met_are_clear_errors():
    ids = [(torch.randint(0, 100, (1, 12)),)]
    with pytest.raises(BadInput, match="no repeated block list"):
        prune.apply(TinyEncoder().eval(), ids[0], _settings(what=["depth"]), 8, ids, lambda _: None)
    with pytest.raises(BadInput, match="removes no whole block"):
        prune.apply(DeepEncoder().eval(), ids[0], _settings(what=["depth"], ratio=0.1), 8, ids, lambda _: None)
    with pytest.raises(BadInput, match="only 1 can go"):  # three of the four blocks hold a protected module
        prune.apply(
            DeepEncoder().eval(),
            ids[0],
            _settings(what=["depth"], ratio=0.5, protect=["layers.0", "layers.1.up", "layers.2.attn"]),
            8,
            ids,
            lambda _: None,
        )


class DeadChannels(nn.Module):
    """Half of fc1's outputs are never active (ReLU of an always-negative pre-activation), yet fc2 reads them with
    the largest weights: magnitude keeps them, activation-aware importance removes them."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.fc1, self.fc2, self.head = nn.Linear(4, 8), nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 2)
        with torch.no_grad():
            self.fc1.weight[:8] = 0.0
            self.fc1.bias[:8] = -1.0
            self.fc2.weight[:, :8] *= 100.0

    def forward(self, x):
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(torch.relu(self.stem(x)))))))


def test_activation_importance_removes_channels_that_never_fire():
    torch.manual_seed(0)
    xs = [(torch.randn(2, 4),) for _ in range(8)]
    outputs = {}
    for importance in ("activation", "magnitude"):
        torch.manual_seed(1)
        model = DeadChannels().eval()
        with torch.no_grad():
            before = model(*xs[0])
        model, info = prune.apply(
            model,
            xs[0],
            _settings(what=["channels"], importance=importance, protect=["stem", "fc2"]),
            8,
            xs,
            lambda _: None,
        )
        assert model.fc1.out_features == 8
        with torch.no_grad():
            outputs[importance] = (model(*xs[0]) - before).abs().max().item()
        assert ("activation-aware" in (info["importance_how"] or "")) == (importance == "activation")
    assert outputs["activation"] < 1e-5 < outputs["magnitude"]  # only the dead channels went


def test_two_four_masks_keep_two_of_every_four_input_weights():
    torch.manual_seed(0)
    model = TinyEncoder().eval()
    ids = (torch.randint(0, 100, (1, 12)),)
    model, info = prune.apply(model, ids, _settings(what=["2:4"]), 8, [ids], lambda _: None)
    sparsity = info["sparsity_2_4"]
    assert sparsity["layers"] == 6 and "head" not in sparsity["layer_names"]  # every Linear but the protected head
    assert sparsity["zeros_in_eligible"] >= 0.5  # measured on the weights, not assumed
    for name in sparsity["layer_names"]:
        w = dict(model.named_modules())[name].weight.detach()
        assert ((w.reshape(w.shape[0], -1, 4) != 0).sum(-1) <= 2).all()
    from tapeout.quantize.distill import distill

    teacher = TinyEncoder().eval()
    distill(model, teacher, [ids], _settings(what=["2:4"], distill_steps=5), lambda _: None)
    w = model.up.weight.detach()
    assert ((w.reshape(w.shape[0], -1, 4) != 0).sum(-1) <= 2).all()  # masks survive recovery


def test_requests_the_structure_cannot_satisfy_are_clear_errors():
    ids = (torch.randint(0, 100, (1, 12)),)
    with pytest.raises(BadInput, match='"channels" on a transformer'):
        prune.apply(TinyEncoder().eval(), ids, _settings(what=["channels"]), 8, [ids], lambda _: None)
    x = (torch.randn(1, 3, 16, 16),)
    with pytest.raises(BadInput, match='"heads": the model has no attention module'):
        prune.apply(ResidualCNN().eval(), x, _settings(what=["heads"]), 8, [x], lambda _: None)
    with pytest.raises(BadInput, match="every conv and Linear layer is protected"):
        prune.apply(
            ResidualCNN().eval(), x, _settings(what=["channels"], protect=["a", "b", "dw"]), 8, [x], lambda _: None
        )
    with pytest.raises(BadInput, match="protect names module 'nope'"):
        prune.apply(ResidualCNN().eval(), x, _settings(what=["channels"], protect=["nope"]), 8, [x], lambda _: None)


def test_bad_pruning_input_is_one_line_exit_2_and_no_build_dir(tmp_path):
    cases = [
        ('what = ["channels"]\nratio = 1.5', "ratio", SAMPLES / "digits-cnn"),
        ('what = ["heads"]\nratio = 0.25', "keep no head count", SAMPLES / "tiny-lm" / "forward.toml"),
        ('what = ["depth"]\nratio = 0.5', "no repeated block list", SAMPLES / "digits-cnn"),
        ('what = ["depth"]\nratio = 0.1', "removes no whole block", SAMPLES / "tiny-lm" / "forward.toml"),
        (
            'what = ["channels"]\nratio = 0.5\ndata = "data/recovery.npz"',
            "[pruning] data: data file",
            SAMPLES / "digits-cnn",
        ),
        ('what = ["channels"]\nratio = 0.5\ndata = "metric.py:nothing_here"', "[pruning] data", SAMPLES / "digits-cnn"),
    ]
    for i, (pruning, expected, project) in enumerate(cases):
        out = tmp_path / f"b{i}"
        result = run_cli("build", project, "--profile", _profile(tmp_path, pruning, f"p{i}"), "--out", out)
        assert result.code == 2, result.err
        assert expected in one_line_error(result)
        assert not out.exists()


def test_an_onnx_source_and_a_raising_recovery_hook_are_named(tmp_path, digits_build):
    project = tmp_path / "onnx-project"
    project.mkdir()
    (project / "model.onnx").write_bytes((digits_build / "export" / "model.onnx").read_bytes())
    (project / "tapeout.toml").write_text(
        '[model]\nsource = "model.onnx"\n[[inputs]]\nname = "image"\nshape = [1, 1, 8, 8]\n'
    )
    result = run_cli(
        "build", project, "--profile", _profile(tmp_path, 'what = ["channels"]\nratio = 0.5'), "--out", tmp_path / "b"
    )
    assert result.code == 2 and "[pruning] needs a torch model" in one_line_error(result)

    raising = tmp_path / "digits"
    shutil.copytree(SAMPLES / "digits-cnn", raising, ignore=shutil.ignore_patterns("build"))
    (raising / "recover.py").write_text(
        "def recover(student, teacher, data):\n    raise RuntimeError('no GPU for training')\n"
    )
    result = run_cli(
        "build",
        raising,
        "--profile",
        _profile(tmp_path, 'what = ["channels"]\nratio = 0.5\nrecover = "recover.py:recover"', "hook"),
        "--out",
        tmp_path / "c",
    )
    assert result.code == 2
    line = one_line_error(result)
    assert "[pruning] recover recover.py:recover raised RuntimeError: no GPU for training" in line
    assert not (tmp_path / "c").exists()


def test_recovery_reads_its_own_data_when_the_profile_names_it(tmp_path):
    import numpy as np

    project = tmp_path / "digits"
    shutil.copytree(SAMPLES / "digits-cnn", project, ignore=shutil.ignore_patterns("build"))
    images = np.load(project / "data" / "calibration.npz")["image"]
    shifted = np.roll(images, 1, axis=-1)  # unlabelled extra inputs: the same digits moved a pixel
    np.savez(project / "data" / "recovery.npz", image=np.concatenate([images, shifted, images[:, :, :, ::-1]]))
    out = tmp_path / "b"
    result = run_cli(
        "build",
        project,
        "--profile",
        _profile(
            tmp_path,
            'what = ["channels"]\nratio = 0.5\ndata = "data/recovery.npz"\ndata_samples = 150\ndistill_steps = 20',
        ),
        "--out",
        out,
        "--json",
    )
    assert result.code in (0, 1), result.err
    p = result.json()["pruning"]
    assert p["recovery_data"] == "[pruning] data data/recovery.npz"
    assert p["recovery"]["samples"] == 150 and p["recovery"]["steps"] == 20  # 192 there, capped by data_samples
    assert "on 150 inputs from [pruning] data data/recovery.npz, 16 a step." in (out / "report.md").read_text()


@pytest.mark.slow  # several timed pruning steps; the fast subset keeps the ratio-driven pruning builds
def test_latency_driven_search_stops_at_the_first_step_that_meets_the_budget(tmp_path):
    pruning = 'what = ["channels"]\nratio = 0.6\nuntil = "latency"\nstep = 0.3\ndistill_steps = 300'
    profile = tmp_path / "search.toml"
    profile.write_text(PROFILE.format(pruning=pruning).replace("[budgets]\n", "[budgets]\nlatency_p50_ms = 1000\n"))
    out = tmp_path / "b"
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", profile, "--out", out, "--json")
    assert result.code == 0, result.err
    search = result.json()["pruning"]["search"]
    assert [s["ratio"] for s in search["steps"]] == [0.0, 0.3] and search["stopped"] == "latency budget met"
    assert "Latency-driven search" in (out / "report.md").read_text()
    no_budget = _profile(tmp_path, 'what = ["channels"]\nratio = 0.5\nuntil = "latency"', "nobudget")
    result = run_cli("build", SAMPLES / "digits-cnn", "--profile", no_budget, "--out", tmp_path / "c")
    assert result.code == 2 and "needs a latency_p50_ms budget" in one_line_error(result)


@pytest.mark.slow
def test_latency_search_for_a_device_not_here_runs_on_its_calibrated_estimate(tmp_path):
    """TensorRT is compiled on the device: the search estimates each step for the profile's L4 spec, and only with
    a calibration. The calibration is made from synthetic records: it checks our side (the search's path) only."""
    from test_estimate import _record

    from tapeout.estimation import fit

    profile = tmp_path / "trt-l4-search.toml"
    profile.write_text(
        'extends = "tensorrt-fp16"\ndevice = "l4"\n[pruning]\nwhat = ["channels"]\nratio = 0.6\n'
        'until = "latency"\nstep = 0.3\ndistill_steps = 50\n[budgets]\nlatency_p50_ms = 50\n'
        "accuracy_max_drop = 0.05\n"
    )
    env = {"TAPEOUT_CALIBRATION": str(tmp_path / "cal")}
    refused = run_cli("build", SAMPLES / "digits-cnn", "-p", profile, "-o", tmp_path / "a", env=env)
    assert refused.code == 2 and "no calibration for l4 × tensorrt" in one_line_error(refused)
    assert not (tmp_path / "a").exists()
    records = [
        _record(
            f"m{i}",
            {c: (1e-6, 5.0) for c in ("conv", "matmul", "reduce", "movement")},
            {"conv": 1e-6, "matmul": 2e-6 * (i + 1), "reduce": 1e-7, "movement": 1e-7},
            {"conv": 2, "matmul": 2 + i, "reduce": 1, "movement": 1},
            5e-6,
            1e-6,
            "fp16",
        )
        for i in range(3)
    ]
    [cal] = fit.make(
        [(r, {"device": "l4", "target": "tensorrt", "kind": "gpu", "roof": {}}) for r in records], "now", "test"
    )
    fit.save(cal, tmp_path / "cal")
    out = tmp_path / "b"
    result = run_cli("build", SAMPLES / "digits-cnn", "-p", profile, "-o", out, "--json", env=env)
    assert result.code == 0, result.err
    search = result.json()["pruning"]["search"]
    assert search["estimated"] and search["method"].startswith("estimated p50 on l4")
    assert [s["ratio"] for s in search["steps"]] == [0.0, 0.3] and search["stopped"] == "latency budget met"
    assert 0 < search["steps"][1]["latency_ms"] < search["steps"][0]["latency_ms"]  # fewer channels, less time
    assert "estimated p50 ms" in (out / "report.md").read_text()


def test_two_four_turns_on_the_sparse_kernels_of_targets_that_have_them(tmp_path):
    from tapeout.core.console import UI
    from tapeout.steps.setup import for_build

    path = tmp_path / "trt-sparse.toml"
    path.write_text('extends = "tensorrt-fp16"\n[pruning]\nwhat = ["2:4"]\nratio = 0.5\n')
    assert for_build(SAMPLES / "digits-cnn", str(path), UI()).target.options.sparse_weights is True
    path.write_text(
        'extends = "tensorrt-fp16"\n[options]\nsparse_weights = false\n[pruning]\nwhat = ["2:4"]\nratio = 0.5\n'
    )
    assert for_build(SAMPLES / "digits-cnn", str(path), UI()).target.options.sparse_weights is False  # said: kept
