"""Structured pruning: remove whole neurons and channels, and build a physically smaller dense model.

Unstructured zeros leave every matrix its shape; removing output unit j of a layer (row j of a Linear's
weight, filter j of a Conv2d, and its bias) removes input j of the next layer too, so both shrink.
- `channel_norms`, `keep_channels`, `channel_mask`: the units with the largest L_n norm stay
  (`channel_mask` equals torch.nn.utils.prune.ln_structured's mask);
- `prune_structured`: a smaller copy of a model whose layers keep only those units, computing exactly
  what the original computes with the pruned units zeroed (Linear -> Linear, Conv2d -> Conv2d and a
  flattened Conv2d -> Linear).

Weight-level (unstructured) pruning, retraining and sparse storage are in `pruning`.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..validate import int_in_range, positive_number
from .pruning import _check_tensor, _set_module, n_to_prune, prunable_layers


def channel_norms(weight: torch.Tensor, n=2, dim: int = 0) -> torch.Tensor:
    """L_n norm of each slice of `weight` along `dim`: [weight.shape[dim]] (rows of a Linear for dim=0)."""
    w = _check_tensor(weight)
    if w.dim() < 2:
        raise ValueError(f"weight must have at least 2 dims to have channels; got shape {tuple(w.shape)}")
    int_in_range("dim", dim, -w.dim(), w.dim() - 1, hint=f" for a weight of shape {tuple(w.shape)}")
    positive_number("n (the norm order)", n, finite=False, hint=" or float('inf')")
    return torch.linalg.vector_norm(w, ord=n, dim=[d for d in range(w.dim()) if d != dim % w.dim()])


def keep_channels(weight: torch.Tensor, amount: float, n=2, dim: int = 0) -> torch.Tensor:
    """Sorted indices of the channels along `dim` that survive: all but the round(amount * size)
    with the smallest L_n norm (LongTensor [size - pruned])."""
    norms = channel_norms(weight, n, dim)
    keep = len(norms) - n_to_prune(amount, len(norms))
    return torch.topk(norms, keep, largest=True).indices.sort().values


def channel_mask(weight: torch.Tensor, amount: float, n=2, dim: int = 0) -> torch.Tensor:
    """0/1 mask zeroing whole channels along `dim` with the smallest L_n norm (= ln_structured's)."""
    mask = torch.zeros_like(weight, memory_format=torch.contiguous_format)
    return mask.index_fill_(dim, keep_channels(weight, amount, n, dim).to(weight.device), 1)


def _input_index(producer: nn.Module, consumer: nn.Module, keep: torch.Tensor, names) -> torch.Tensor:
    """Which inputs of `consumer` belong to the kept outputs of `producer`."""
    units, width = producer.weight.shape[0], consumer.weight.shape[1]
    if width == units and (isinstance(consumer, nn.Linear) or isinstance(producer, nn.Conv2d)):
        return keep
    if isinstance(consumer, nn.Linear) and isinstance(producer, nn.Conv2d) and width % units == 0:
        per = width // units   # a flattened [C, H, W] map: channel c owns columns c*H*W ... (c+1)*H*W - 1
        return (keep[:, None] * per + torch.arange(per)).reshape(-1)
    raise ValueError(f"layers {names[0]!r} -> {names[1]!r} do not connect: {units} outputs of a "
                     f"{type(producer).__name__} feed {width} inputs of a {type(consumer).__name__}")


def _slice_layer(layer: nn.Module, rows=None, cols=None) -> nn.Module:
    """A copy of `layer` holding only output units `rows` and input units `cols` (None: all)."""
    new = copy.deepcopy(layer)
    weight = layer.weight.detach()
    weight = weight if rows is None else weight[rows]
    new.weight = nn.Parameter((weight if cols is None else weight[:, cols]).clone())
    if layer.bias is not None and rows is not None:
        new.bias = nn.Parameter(layer.bias.detach()[rows].clone())
    if isinstance(new, nn.Linear):
        new.out_features, new.in_features = new.weight.shape
    else:
        new.out_channels, new.in_channels = new.weight.shape[:2]
    return new


def prune_structured(model: nn.Module, amount: float, layers=None, n=2) -> nn.Module:
    """A smaller copy of `model`: every layer of the chain but the last keeps the 1 - amount of its
    output units with the largest L_n norm (computed on the original weights); the next layer keeps
    only the matching input columns / channels. The original is not changed.

    layers: the chain in forward order (default: all prunable layers in registration order, which
    is forward order for Net, LeNet300, LeNet5). The last layer keeps its outputs (the logits).
    LeNet300 with amount 0.5: 784-300-100-10 -> 784-150-50-10. The result computes exactly what the
    original computes with the pruned units' weight rows and biases zeroed.
    """
    chain = prunable_layers(model, layers)
    names = list(chain)
    if len(names) < 2:
        raise ValueError(f"layers must name at least two connected layers in forward order; got {names!r}")
    if any(getattr(chain[name], "groups", 1) != 1 for name in names):
        raise ValueError("prune_structured supports ordinary convolutions only (groups=1)")
    keeps = {name: keep_channels(chain[name].weight, amount, n) for name in names[:-1]}
    for name, keep in keeps.items():
        if len(keep) == 0:
            raise ValueError(f"amount={amount!r} would remove all {chain[name].weight.shape[0]} units of {name!r}")
    small = copy.deepcopy(model)
    for i, name in enumerate(names):
        prev = names[i - 1] if i else None
        cols = _input_index(chain[prev], chain[name], keeps[prev], (prev, name)) if prev else None
        _set_module(small, name, _slice_layer(chain[name], keeps.get(name), cols))
    return small
