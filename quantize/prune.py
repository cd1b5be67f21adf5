"""Structured, dependency-aware pruning on the torch side, before export (DESIGN §6).

Torch-Pruning's DepGraph finds what must shrink together: channels coupled through residual adds,
concatenations, flatten, group and depthwise convolutions; the Q, K, V and output projections of an
attention head; a gated MLP's gate and up projections with its down projection. The architecture
decides what is never pruned (the first conv and the classifier of a CNN; embeddings, norms, the LM
head and task heads of a transformer; the hidden width that every residual and norm shares), and
the target decides the channel multiple kept (`Capabilities.channel_multiple`). After pruning the
forward must still run on the project's inputs with the teacher's output shapes; then recovery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tapeout.errors import BadInput, TargetUnavailable, first_line
from tapeout.types import PruningSettings

INSTALL = 'pip install "tapeout[prune]" (Torch-Pruning)'
HEAD_ATTRS = ("num_attention_heads", "num_heads", "n_heads", "n_head")
QKV = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"), ("q", "k", "v"))


@dataclass
class Structure:
    """What the model is made of, as far as pruning cares."""

    convs: list = field(default_factory=list)        # (name, module), in forward-definition order
    linears: list = field(default_factory=list)
    attention: list = field(default_factory=list)    # (name, module, [q, k, v], head attribute)
    headless_attention: list = field(default_factory=list)  # q/k/v found, no head-count attribute
    expansions: list = field(default_factory=list)   # (name, Linear) of the FFNs: out > in, not attention
    embeddings: list = field(default_factory=list)

    @property
    def transformer(self) -> bool:
        return bool(self.attention or self.headless_attention or self.embeddings)


def inspect(module) -> Structure:
    from torch import nn

    found = Structure()
    qkv_ids = set()
    for name, m in module.named_modules():
        for names in QKV:
            children = [getattr(m, n, None) for n in names]
            if all(isinstance(c, nn.Linear) for c in children):
                attr = next((a for a in HEAD_ATTRS if isinstance(getattr(m, a, None), int)), None)
                (found.attention if attr else found.headless_attention).append((name, m, children, attr))
                qkv_ids |= {id(c) for c in children}
                break
    for name, m in module.named_modules():
        if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d):
            found.convs.append((name, m))
        elif isinstance(m, nn.Linear):
            found.linears.append((name, m))
            if m.out_features > m.in_features and id(m) not in qkv_ids:
                found.expansions.append((name, m))
        elif isinstance(m, nn.Embedding):
            found.embeddings.append((name, m))
    return found


def protected(found: Structure, settings: PruningSettings, module) -> dict[str, str]:
    """Module name → why it is never pruned: the family's own list, then the profile's."""
    keep: dict[str, str] = {}
    if found.convs:
        keep[found.convs[0][0]] = "first conv: few input channels, most sensitive (research §2.2)"
    if found.linears:
        keep[found.linears[-1][0]] = ("LM head / classifier: its outputs are the model's" if found.transformer
                                      else "classifier: its outputs are the classes")
    names = dict(module.named_modules())
    for name in settings.protect:
        if name not in names:
            near = [n for n in names if n and name in n][:3]
            raise BadInput(f"[pruning] protect names module '{name}', which the model does not have",
                           fix=f"use module names from the model ({', '.join(near) or 'see model.named_modules()'})")
        keep[name] = "protected by [pruning] protect"
    return keep


def _pruner(tp, module, example, importance, ratio: float, ignored: list, round_to: int | None, **kw):
    return tp.pruner.MetaPruner(module, example, importance=importance, pruning_ratio=ratio, ignored_layers=ignored,
                                round_to=round_to, **kw)


def _importance(tp, settings: PruningSettings, module, calibration: list[tuple]):
    if settings.importance == "magnitude":
        return tp.importance.GroupMagnitudeImportance(p=2), None
    # Taylor (first order, |w · ∂L/∂w|) without labels: L is the outputs' energy on the calibration inputs, the
    # signal each weight carries forward. Gradients are accumulated once, before the pruner ranks.

    module.zero_grad()
    for args in calibration[:16]:
        loss = sum((t.float() ** 2).mean() for t in _tensors(module(*args)))
        loss.backward()
    return tp.importance.GroupTaylorImportance(), "Taylor on the outputs' energy over up to 16 calibration inputs"


def _tensors(result) -> list:
    import torch

    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, dict) or hasattr(result, "values"):
        return [v for v in result.values() if isinstance(v, torch.Tensor)]
    return [v for v in result if isinstance(v, torch.Tensor)]


def apply(module, example: tuple, settings: PruningSettings, round_to: int, calibration: list[tuple],
          log) -> tuple[Any, dict]:
    """Prune `module` in place by `settings` (2:4 masks aside); returns it and what was done."""
    try:
        import torch
        import torch_pruning as tp
    except ImportError as exc:
        raise TargetUnavailable(f"[pruning] needs Torch-Pruning, which does not import here ({first_line(exc)})",
                                fix=INSTALL) from None
    found = inspect(module)
    keep = protected(found, settings, module)
    names = dict(module.named_modules())
    with torch.no_grad():
        teacher_shapes = [tuple(t.shape) for t in _tensors(module(*example))]
        macs0, params0 = tp.utils.count_ops_and_params(module, example)
    kept_modules = [names[n] for n in keep]
    importance, how = _importance(tp, settings, module, calibration)
    done: list[dict] = []
    structural = [w for w in settings.what if w != "2:4"]
    for what in structural:
        if what == "channels":
            if found.transformer:
                raise BadInput("[pruning] what = \"channels\" on a transformer: its hidden width is shared by the "
                               "embeddings, every residual add and every norm", fix="prune \"heads\" and \"mlp\" instead")
            if not found.convs and not found.linears:
                raise BadInput("[pruning] what = \"channels\": the model has no conv or Linear layer",
                               fix="remove \"channels\" from [pruning] what")
            prunable = [(n, m) for n, m in found.convs + found.linears if n not in keep]
            if not prunable:
                raise BadInput("[pruning] every conv and Linear layer is protected: nothing to prune",
                               fix="protect fewer modules in [pruning] protect")
            pruner = _pruner(tp, module, example, importance, settings.ratio, kept_modules, round_to)
        elif what == "mlp":
            targets = [(n, m) for n, m in found.expansions if n not in keep]
            if not found.transformer or not targets:
                raise BadInput("[pruning] what = \"mlp\": no transformer FFN (an expanding Linear outside attention) "
                               + ("left unprotected" if found.expansions else "in this model"),
                               fix="use \"channels\" for CNNs and MLPs, or remove \"mlp\"")
            others = [m for _, m in found.convs + found.linears if all(m is not t for _, t in targets)]
            pruner = _pruner(tp, module, example, importance, settings.ratio, others, round_to)
        else:  # heads
            if not found.attention:
                why = (f"{len(found.headless_attention)} attention module(s) take Q/K/V but keep no head count the "
                       f"forward reads ({' / '.join(HEAD_ATTRS)}), so a pruned head count could not reach it"
                       if found.headless_attention else "the model has no attention module with Q/K/V projections")
                raise BadInput(f"[pruning] what = \"heads\": {why}", fix="prune \"mlp\" instead, or give the "
                               "attention module a head-count attribute its forward uses")
            heads = {proj: getattr(m, attr) for _, m, projs, attr in found.attention for proj in projs}
            others = [m for _, m in found.convs + found.linears if m not in heads]
            pruner = _pruner(tp, module, example, importance, settings.ratio, others, None, num_heads=heads,
                             prune_num_heads=True, prune_head_dims=False, head_pruning_ratio=settings.ratio)
        before = tp.utils.count_ops_and_params(module, example)
        try:
            pruner.step()
        except Exception as exc:  # DepGraph on a forward it cannot trace
            raise BadInput(f"[pruning] {what}: Torch-Pruning could not prune this model ({first_line(exc)})",
                           fix=f"remove \"{what}\" from [pruning] what, or protect the module it names") from None
        if what == "heads":
            for _, m, projs, attr in found.attention:
                count = pruner.num_heads.get(projs[0], getattr(m, attr))
                setattr(m, attr, count)
                if isinstance(getattr(m, "all_head_size", None), int):
                    m.all_head_size = projs[0].out_features
        after = tp.utils.count_ops_and_params(module, example)
        done.append({"what": what, "ratio": settings.ratio, "macs_before": before[0], "macs_after": after[0],
                     "params_before": before[1], "params_after": after[1],
                     "widths": _widths(found, what)})
        log(f"pruned {what}: MACs {before[0]:,.0f} → {after[0]:,.0f}, parameters {before[1]:,} → {after[1]:,}")
    _check_forward(module, example, teacher_shapes)
    sparsity = two_four(module, keep, found) if "2:4" in settings.what else None
    macs1, params1 = tp.utils.count_ops_and_params(module, example)
    return module, {
        "what": settings.what, "ratio": settings.ratio, "importance": settings.importance, "importance_how": how,
        "round_to": round_to, "protected": keep, "steps": done, "sparsity_2_4": sparsity,
        "transformer": found.transformer,
        "macs_before": macs0, "macs_after": macs1, "params_before": params0, "params_after": params1,
        "flops_reduction": 1 - macs1 / macs0 if macs0 else 0.0,
    }


def _widths(found: Structure, what: str) -> dict[str, int]:
    if what == "heads":
        return {name: getattr(m, attr) for name, m, _, attr in found.attention}
    if what == "mlp":
        return {name: m.out_features for name, m in found.expansions}
    return {name: getattr(m, "out_channels", getattr(m, "out_features", 0)) for name, m in found.convs + found.linears}


def _check_forward(module, example: tuple, shapes: list[tuple]) -> None:
    import torch

    try:
        with torch.no_grad():
            got = [tuple(t.shape) for t in _tensors(module(*example))]
    except Exception as exc:
        raise BadInput(f"[pruning] the pruned model's forward fails ({type(exc).__name__}: {first_line(exc)}): it "
                       "uses a width the pruning changed (a constant head count or hidden size in the code)",
                       fix="prune a structure whose sizes the forward reads from its layers, or protect that module") from None
    if got != shapes:
        raise BadInput(f"[pruning] the pruned model's outputs changed shape ({shapes} → {got})",
                       fix="protect the layers that produce the outputs ([pruning] protect)")


def two_four(module, keep: dict[str, str], found: Structure) -> dict:
    """Magnitude 2:4 masks (two of every four consecutive input weights kept) on the eligible Linear and conv
    weights: input width a multiple of 4, not protected. Returns the masks' coverage; `masks` are kept on the
    module (as `_tapeout_masks`) so recovery can re-apply them after each optimizer step."""
    import torch

    masks, eligible, total, zeros = {}, 0, 0, 0
    for name, m in found.convs + found.linears:
        w = m.weight
        total += w.numel()
        if name in keep or w.shape[1] % 4:
            continue
        moved = w.detach().transpose(0, 1).reshape(w.shape[1], -1).transpose(0, 1)  # rows: everything but input dim
        groups = moved.reshape(moved.shape[0], -1, 4)
        top = groups.abs().topk(2, dim=-1).indices
        mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, top, True)
        mask = mask.reshape(moved.shape).transpose(0, 1).reshape(w.shape[1], w.shape[0], *w.shape[2:]).transpose(0, 1)
        with torch.no_grad():
            w.mul_(mask)
        masks[name] = mask
        eligible += w.numel()
        zeros += int((w == 0).sum())
    module._tapeout_masks = masks
    return {"layers": len(masks), "eligible_share": eligible / total if total else 0.0,
            "zeros_in_eligible": zeros / eligible if eligible else 0.0, "layer_names": list(masks)}


def reapply_masks(module) -> None:
    import torch

    names = dict(module.named_modules())
    with torch.no_grad():
        for name, mask in getattr(module, "_tapeout_masks", {}).items():
            names[name].weight.mul_(mask)

