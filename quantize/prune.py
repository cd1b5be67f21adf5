"""Structured, dependency-aware pruning on the torch side, before export (DESIGN §6).

Torch-Pruning's DepGraph finds what must shrink together: channels coupled through residual adds,
concatenations, flatten, group and depthwise convolutions; the Q, K, V and output projections of an
attention head; a gated MLP's gate and up projections with its down projection. The architecture
decides what is never pruned (the first conv and the classifier of a CNN; embeddings, norms, the LM
head and task heads of a transformer; the hidden width that every residual and norm shares), and
the target decides the channel multiple kept (`Capabilities.channel_multiple`). Depth pruning drops
whole blocks of the model's repeated block list (a transformer's layers), those that change their
input least on the calibration data. After pruning the forward must still run on the project's inputs
with the teacher's output shapes; then recovery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tapeout.core.errors import BadInput, TargetUnavailable, first_line
from tapeout.core.profile_schema import PruningSettings

INSTALL = 'pip install "tapeout[prune]" (Torch-Pruning)'
HEAD_ATTRS = ("num_attention_heads", "num_heads", "n_heads", "n_head")
LAYER_COUNT_ATTRS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers")  # configs a forward may loop over
IMPORTANCE_SAMPLES = 16  # calibration inputs the data-driven importances look at
QKV = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"), ("q", "k", "v"))


@dataclass
class Structure:
    """What the model is made of, as far as pruning cares."""

    convs: list = field(default_factory=list)  # (name, module), in forward-definition order
    linears: list = field(default_factory=list)
    attention: list = field(default_factory=list)  # (name, module, [q, k, v], head attribute)
    headless_attention: list = field(default_factory=list)  # q/k/v found, no head-count attribute
    expansions: list = field(default_factory=list)  # (name, Linear) of the FFNs: out > in, not attention
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
        keep[found.convs[0][0]] = "first conv: few input channels, most sensitive"
    if found.linears:
        keep[found.linears[-1][0]] = (
            "LM head / classifier: its outputs are the model's"
            if found.transformer
            else "classifier: its outputs are the classes"
        )
    names = dict(module.named_modules())
    for name in settings.protect:
        if name not in names:
            near = [n for n in names if n and name in n][:3]
            raise BadInput(
                f"[pruning] protect names module '{name}', which the model does not have",
                fix=f"use module names from the model ({', '.join(near) or 'see model.named_modules()'})",
            )
        keep[name] = "protected by [pruning] protect"
    return keep


def _pruner(tp, module, example, importance, ratio: float, ignored: list, round_to: int | None, **kw):
    return tp.pruner.MetaPruner(
        module, example, importance=importance, pruning_ratio=ratio, ignored_layers=ignored, round_to=round_to, **kw
    )


def _importance(tp, settings: PruningSettings, module, calibration: list[tuple], token_mask: int | None):
    if settings.importance == "magnitude":
        return tp.importance.GroupMagnitudeImportance(p=2), None
    if settings.importance == "activation":
        norms = activation_norms(module, calibration[:IMPORTANCE_SAMPLES], token_mask)
        return _activation_importance(tp, norms), (
            f"activation-aware: ‖W[:, j]‖ · ‖x_j‖ on up to {IMPORTANCE_SAMPLES} "
            "calibration inputs" + (", real tokens only" if token_mask is not None else "")
        )
    # Taylor (first order, |w · ∂L/∂w|) without labels: L is the outputs' energy on the calibration inputs, the
    # signal each weight carries forward. Gradients are accumulated once, before the pruner ranks.

    module.zero_grad()
    for args in calibration[:IMPORTANCE_SAMPLES]:
        loss = sum((t.float() ** 2).mean() for t in _tensors(module(*args)))
        loss.backward()
    return (
        tp.importance.GroupTaylorImportance(),
        f"Taylor on the outputs' energy over up to {IMPORTANCE_SAMPLES} calibration inputs",
    )


def activation_norms(module, calibration: list[tuple], token_mask: int | None) -> dict:
    """Module → the L2 norm of each of its input channels over the calibration inputs (Linear: every token, or
    only the real ones where `token_mask` marks them; conv: every position). Padding tokens are most of a padded
    sentence and carry no meaning, so they would rank the channels by noise."""
    import torch
    from torch import nn

    sums: dict = {}
    mask: dict = {}

    def hook(m, args, _out):
        if not args or not isinstance(args[0], torch.Tensor):
            return
        x = args[0].detach().float()
        if isinstance(m, nn.Linear):
            rows = x.reshape(-1, x.shape[-1])
            real = mask.get("now")
            if real is not None and x.dim() == 3 and tuple(x.shape[:2]) == tuple(real.shape):
                rows = rows[real.reshape(-1) > 0]
            squares = (rows**2).sum(0)
        else:
            squares = (x.transpose(0, 1).flatten(1) ** 2).sum(1)
        sums[m] = sums[m] + squares if m in sums else squares

    hooks = [
        m.register_forward_hook(hook)
        for m in module.modules()
        if isinstance(m, nn.Linear | nn.Conv1d | nn.Conv2d | nn.Conv3d)
    ]
    _observe(module, hooks, calibration, token_mask, mask)
    return {m: s.sqrt() for m, s in sums.items()}


def _observe(module, hooks: list, calibration: list[tuple], token_mask: int | None, mask: dict) -> None:
    """Run the calibration inputs through `module` while `hooks` watch, `mask["now"]` holding each input's token
    mask for them; the hooks are removed after."""
    import torch

    try:
        with torch.no_grad():
            for args in calibration:
                mask["now"] = args[token_mask] if token_mask is not None else None
                module(*args)
    finally:
        for h in hooks:
            h.remove()


def _activation_importance(tp, norms: dict):
    """Wanda's score summed over a layer's rows, per input channel: ‖W[:, j]‖₂ · ‖x_j‖₂. A channel matters by what
    it carries times how much of it the next layer uses; weights alone miss channels that are never active.
    Scored where a group removes a layer's input channels (an FFN's down projection, an attention output's heads,
    the next conv); groups with none of those fall back to the weights' magnitude."""
    import torch

    class ActivationAware(tp.importance.GroupMagnitudeImportance):
        @torch.no_grad()
        def __call__(self, group):
            scores, roots = [], []
            into = (tp.pruner.function.prune_linear_in_channels, tp.pruner.function.prune_conv_in_channels)
            for i, (dep, idxs) in enumerate(group):
                layer = dep.target.module
                if dep.handler not in into or layer not in norms:
                    continue
                weight = layer.weight.detach()
                if weight.shape[1] != norms[layer].numel():  # grouped conv: inputs are not the weight's columns
                    continue
                idxs.sort()  # as Torch-Pruning's own importances do, so the scores line up with root_idxs
                columns = weight.transpose(0, 1).flatten(1).norm(dim=1)
                scores.append((columns * norms[layer])[idxs])
                roots.append(group[i].root_idxs)
            if not scores:
                return super().__call__(group)
            # summed onto the root's channels: a flattened conv feeds a Linear many inputs per channel
            reduced = torch.zeros(len(group[0][1]), dtype=torch.float32)
            for score, root in zip(scores, roots, strict=True):
                if all(r is not None for r in root):
                    reduced.scatter_add_(0, torch.tensor(root, dtype=torch.long), score.float())
            return self._normalize(reduced, self.normalizer)

    return ActivationAware(p=2)


def _tensors(result) -> list:
    import torch

    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, dict) or hasattr(result, "values"):
        return [v for v in result.values() if isinstance(v, torch.Tensor)]
    return [v for v in result if isinstance(v, torch.Tensor)]


def apply(
    module,
    example: tuple,
    settings: PruningSettings,
    round_to: int,
    calibration: list[tuple],
    log,
    token_mask: int | None = None,
) -> tuple[Any, dict]:
    """Prune `module` in place by `settings` (2:4 masks aside); returns it and what was done. `token_mask`: the
    index of an input that marks real tokens (an attention mask), if the model has one."""
    try:
        import torch
        import torch_pruning as tp
    except ImportError as exc:
        raise TargetUnavailable(
            f"[pruning] needs Torch-Pruning, which does not import here ({first_line(exc)})", fix=INSTALL
        ) from None
    found = inspect(module)
    keep = protected(found, settings, module)
    names = dict(module.named_modules())
    with torch.no_grad():
        teacher_shapes = [tuple(t.shape) for t in _tensors(module(*example))]
        macs0, params0 = tp.utils.count_ops_and_params(module, example)
    kept_modules = [names[n] for n in keep]
    kept_ids = {id(m) for m in kept_modules}  # by identity: depth pruning renumbers the blocks' names
    done: list[dict] = []
    if "depth" in settings.what:  # first: the width steps then rank what is left
        before = tp.utils.count_ops_and_params(module, example)
        step = drop_blocks(module, settings.ratio, kept_ids, calibration, token_mask)
        after = tp.utils.count_ops_and_params(module, example)
        done.append(
            {
                "what": "depth",
                "ratio": settings.ratio,
                "macs_before": before[0],
                "macs_after": after[0],
                "params_before": before[1],
                "params_after": after[1],
                **step,
            }
        )
        log(f"pruned depth: removed {', '.join(step['removed'])}; MACs {before[0]:,.0f} → {after[0]:,.0f}")
        found = inspect(module)
    importance, how = _importance(tp, settings, module, calibration, token_mask)
    structural = [w for w in settings.what if w not in ("2:4", "depth")]
    for what in structural:
        if what == "channels":
            if found.transformer:
                raise BadInput(
                    '[pruning] what = "channels" on a transformer: its hidden width is shared by the '
                    "embeddings, every residual add and every norm",
                    fix='prune "heads" and "mlp" instead',
                )
            if not found.convs and not found.linears:
                raise BadInput(
                    '[pruning] what = "channels": the model has no conv or Linear layer',
                    fix='remove "channels" from [pruning] what',
                )
            prunable = [(n, m) for n, m in found.convs + found.linears if id(m) not in kept_ids]
            if not prunable:
                raise BadInput(
                    "[pruning] every conv and Linear layer is protected: nothing to prune",
                    fix="protect fewer modules in [pruning] protect",
                )
            pruner = _pruner(tp, module, example, importance, settings.ratio, kept_modules, round_to)
        elif what == "mlp":
            targets = [(n, m) for n, m in found.expansions if id(m) not in kept_ids]
            if not found.transformer or not targets:
                raise BadInput(
                    '[pruning] what = "mlp": no transformer FFN (an expanding Linear outside attention) '
                    + ("left unprotected" if found.expansions else "in this model"),
                    fix='use "channels" for CNNs and MLPs, or remove "mlp"',
                )
            others = [m for _, m in found.convs + found.linears if all(m is not t for _, t in targets)]
            pruner = _pruner(tp, module, example, importance, settings.ratio, others, round_to)
        else:  # heads
            if not found.attention:
                why = (
                    f"{len(found.headless_attention)} attention module(s) take Q/K/V but keep no head count the "
                    f"forward reads ({' / '.join(HEAD_ATTRS)}), so a pruned head count could not reach it"
                    if found.headless_attention
                    else "the model has no attention module with Q/K/V projections"
                )
                raise BadInput(
                    f'[pruning] what = "heads": {why}',
                    fix='prune "mlp" instead, or give the attention module a head-count attribute its forward uses',
                )
            heads = {proj: getattr(m, attr) for _, m, projs, attr in found.attention for proj in projs}
            others = [m for _, m in found.convs + found.linears if m not in heads]
            pruner = _pruner(
                tp,
                module,
                example,
                importance,
                settings.ratio,
                others,
                None,
                num_heads=heads,
                prune_num_heads=True,
                prune_head_dims=False,
                head_pruning_ratio=settings.ratio,
            )
        before = tp.utils.count_ops_and_params(module, example)
        try:
            pruner.step()
        except Exception as exc:  # DepGraph on a forward it cannot trace
            raise BadInput(
                f"[pruning] {what}: Torch-Pruning could not prune this model ({first_line(exc)})",
                fix=f'remove "{what}" from [pruning] what, or protect the module it names',
            ) from None
        if what == "heads":
            for _, m, projs, attr in found.attention:
                count = pruner.num_heads.get(projs[0], getattr(m, attr))
                setattr(m, attr, count)
                if isinstance(getattr(m, "all_head_size", None), int):
                    m.all_head_size = projs[0].out_features
        after = tp.utils.count_ops_and_params(module, example)
        done.append(
            {
                "what": what,
                "ratio": settings.ratio,
                "macs_before": before[0],
                "macs_after": after[0],
                "params_before": before[1],
                "params_after": after[1],
                "widths": _widths(found, what),
            }
        )
        log(f"pruned {what}: MACs {before[0]:,.0f} → {after[0]:,.0f}, parameters {before[1]:,} → {after[1]:,}")
    _check_forward(module, example, teacher_shapes)
    sparsity = two_four(module, kept_ids, found) if "2:4" in settings.what else None
    macs1, params1 = tp.utils.count_ops_and_params(module, example)
    return module, {
        "what": settings.what,
        "ratio": settings.ratio,
        "importance": settings.importance,
        "importance_how": how,
        "round_to": round_to,
        "protected": keep,
        "steps": done,
        "sparsity_2_4": sparsity,
        "transformer": found.transformer,
        "macs_before": macs0,
        "macs_after": macs1,
        "params_before": params0,
        "params_after": params1,
        "flops_reduction": 1 - macs1 / macs0 if macs0 else 0.0,
    }


def block_list(module) -> tuple[str, Any] | None:
    """(name, list) of the model's repeated blocks: the longest nn.ModuleList or nn.Sequential of two or more
    children of one class that hold weights (a transformer's layers, a stage of residual blocks)."""
    from torch import nn

    best = None
    for name, m in module.named_modules():
        if (
            isinstance(m, nn.ModuleList | nn.Sequential)
            and len(m) >= 2
            and len({type(c) for c in m}) == 1
            and next(m[0].parameters(), None) is not None
            and (best is None or len(m) > len(best[1]))
        ):
            best = (name, m)
    return best


def block_influence(module, blocks, calibration: list[tuple], token_mask: int | None) -> list[float | None]:
    """Per block, 1 − the cosine between what enters it and what leaves it, averaged over the calibration inputs
    (per token where tokens are marked, else per sample): how much the block changes its stream. None for a block
    whose output shape differs from its input's, which cannot be bypassed."""
    import torch

    seen: dict[int, list[float | None]] = {i: [] for i in range(len(blocks))}
    real: dict = {}

    def first(value):
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, tuple | list) and value and isinstance(value[0], torch.Tensor):
            return value[0]
        return None

    def hook_for(i):
        def hook(_m, args, kwargs, out):
            x = first(args) if args else kwargs.get("hidden_states", kwargs.get("x"))
            y = first(out)
            if x is None or y is None or x.shape != y.shape:
                seen[i].append(None)
                return
            x, y = x.detach().float(), y.detach().float()
            mask = real.get("now")
            if x.dim() == 3 and mask is not None and tuple(x.shape[:2]) == tuple(mask.shape):
                cos = torch.nn.functional.cosine_similarity(x, y, dim=-1)[mask > 0]
            else:
                cos = torch.nn.functional.cosine_similarity(x.flatten(1), y.flatten(1), dim=-1)
            seen[i].append(float(1 - cos.mean()))

        return hook

    hooks = [b.register_forward_hook(hook_for(i), with_kwargs=True) for i, b in enumerate(blocks)]
    _observe(module, hooks, calibration, token_mask, real)
    return [None if not v or None in v else sum(v) / len(v) for v in seen.values()]


def drop_blocks(module, ratio: float, kept_ids: set[int], calibration: list[tuple], token_mask: int | None) -> dict:
    """Depth pruning: remove round(ratio · blocks) blocks of the repeated block list, those that change their input
    least (ShortGPT's block influence) among the ones that keep its shape and hold no protected module; then the
    config's layer count and the kept blocks' `layer_idx` follow, so a forward that reads them stays consistent."""
    found = block_list(module)
    if found is None:
        raise BadInput(
            '[pruning] what = "depth": the model has no repeated block list (an nn.ModuleList or '
            "nn.Sequential of two or more blocks of one class)",
            fix='prune "channels", "heads" or "mlp" instead',
        )
    name, blocks = found
    total = len(blocks)
    count = round(ratio * total)
    if count == 0:
        raise BadInput(
            f'[pruning] ratio = {ratio:g} of {total} blocks removes no whole block (what = "depth")',
            fix=f"set [pruning] ratio to at least {0.5 / total + 1e-3:.2f}",
        )
    influence = block_influence(module, blocks, calibration[:IMPORTANCE_SAMPLES], token_mask)
    protected_blocks = {i for i, b in enumerate(blocks) if any(id(m) in kept_ids for m in b.modules())}
    free = [i for i, v in enumerate(influence) if v is not None and i not in protected_blocks]
    if count > len(free) or count >= total:
        why = (
            f"{total - len(free)} of them change their input's shape or hold a protected module"
            if count < total
            else "at least one block must stay"
        )
        raise BadInput(
            f'[pruning] what = "depth" at ratio {ratio:g} would remove {count} of the {total} blocks in '
            f"'{name}', and only {min(len(free), total - 1)} can go ({why})",
            fix="lower [pruning] ratio, or protect fewer modules",
        )
    drop = sorted(sorted(free, key=lambda i: influence[i])[:count])
    kept = [i for i in range(total) if i not in drop]
    for i in reversed(drop):
        del blocks[i]  # ModuleList and Sequential both re-index in place
    _follow_layer_count(module, blocks, total, kept)
    module._tapeout_blocks = (name, kept)  # recovery matches student block j to teacher block kept[j]
    return {
        "removed": [f"{name}.{i}" for i in drop],
        "kept": kept,
        "blocks": total,
        "influence": {f"{name}.{i}": round(v, 5) for i, v in enumerate(influence) if v is not None},
        "widths": {name: len(kept)},
    }


def _follow_layer_count(module, blocks, total: int, kept: list[int]) -> None:
    for owner in module.modules():
        for holder in (owner, getattr(owner, "config", None)):
            if holder is None:
                continue
            for attr in LAYER_COUNT_ATTRS:
                if getattr(holder, attr, None) == total:  # total >= 2: a bool flag never equals it
                    setattr(holder, attr, len(kept))
            types = getattr(holder, "layer_types", None)
            if isinstance(types, list) and len(types) == total:
                holder.layer_types = [types[i] for i in kept]
    for position, block in enumerate(blocks):  # a KV cache is indexed by layer_idx: renumber to the new positions
        for m in block.modules():
            if isinstance(getattr(m, "layer_idx", None), int) and not isinstance(m.layer_idx, bool):
                m.layer_idx = position


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
        raise BadInput(
            f"[pruning] the pruned model's forward fails ({type(exc).__name__}: {first_line(exc)}): it "
            "uses a width the pruning changed (a constant head count or hidden size in the code)",
            fix="prune a structure whose sizes the forward reads from its layers, or protect that module",
        ) from None
    if got != shapes:
        raise BadInput(
            f"[pruning] the pruned model's outputs changed shape ({shapes} → {got})",
            fix="protect the layers that produce the outputs ([pruning] protect)",
        )


def two_four(module, kept_ids: set[int], found: Structure) -> dict:
    """Magnitude 2:4 masks (two of every four consecutive input weights kept) on the eligible Linear and conv
    weights: input width a multiple of 4, not protected. Returns the masks' coverage; `masks` are kept on the
    module (as `_tapeout_masks`) so recovery can re-apply them after each optimizer step."""
    import torch

    masks, eligible, total, zeros = {}, 0, 0, 0
    for name, m in found.convs + found.linears:
        w = m.weight
        total += w.numel()
        if id(m) in kept_ids or w.shape[1] % 4:
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
    return {
        "layers": len(masks),
        "eligible_share": eligible / total if total else 0.0,
        "zeros_in_eligible": zeros / eligible if eligible else 0.0,
        "layer_names": list(masks),
    }


def reapply_masks(module) -> None:
    import torch

    names = dict(module.named_modules())
    with torch.no_grad():
        for name, mask in getattr(module, "_tapeout_masks", {}).items():
            names[name].weight.mul_(mask)
