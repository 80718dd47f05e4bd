"""Pruning: remove the weights that matter least (whole neurons and channels: `structured`).

- Unstructured magnitude pruning: a 0/1 mask that zeroes the `round(amount * numel)` smallest |w|,
  per layer (`magnitude_mask`) or with one threshold over all layers (`global_magnitude_masks`).
  The masks equal torch.nn.utils.prune's l1_unstructured / global_unstructured: same count, same
  `torch.topk`, so even ties go the same way.
- Iterative prune-retrain (Han et al., 2015): prune, retrain with the masks re-applied after every
  optimizer step (`masked_fit`; Adam's momentum would revive pruned weights), prune more
  (`iterative_prune`).
- `sensitivity_scan`: prune one layer at a time, measure accuracy.
- `csr_linear_model` runs Linear layers with torch's sparse matmul (storage: `measure.csr_bytes`).

Structured pruning (whole neurons and channels, a physically smaller model) is in `structured`.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..loop import evaluate, fit
from ..validate import number_in_range, one_of
from .measure import csr

PRUNABLE = (nn.Linear, nn.Conv2d)
SCOPES = ("layer", "global")


def check_amount(amount, name: str = "amount") -> float:
    """`amount` as a float in [0, 1) (the share of weights to prune); else ValueError naming `name`."""
    return float(number_in_range(name, amount, 0, 1, hi_open=True, noun="fraction",
                                 hint=" (the share of weights to prune)"))


def n_to_prune(amount, numel: int) -> int:
    """How many of `numel` entries `amount` prunes: Python's round(), as torch's prune counts.

    round() sends halves to the even neighbour: 0.25 of 10 -> 2, 0.75 of 10 -> 8 (not floor, not ceil).
    """
    return round(check_amount(amount) * numel)


def _check_tensor(weight, name: str = "weight") -> torch.Tensor:
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        raise TypeError(f"{name} must be a floating-point torch.Tensor; got {type(weight).__name__}")
    return weight.detach()


def magnitude_mask(weight: torch.Tensor, amount: float) -> torch.Tensor:
    """0/1 mask (shape and dtype of `weight`) that prunes the round(amount * numel) smallest |w|.

    Exactly `n_to_prune` zeros even with ties (a threshold `|w| <= t` would prune every tie).
    """
    w = _check_tensor(weight)
    k = n_to_prune(amount, w.numel())
    mask = torch.ones(w.shape, dtype=w.dtype, device=w.device)
    if k:
        mask.view(-1)[torch.topk(w.abs().reshape(-1), k, largest=False).indices] = 0
    return mask


def global_magnitude_masks(weights, amount: float):
    """One threshold over all tensors: masks pruning round(amount * total) smallest |w| overall.

    weights: a list of tensors or a dict name -> tensor; returns masks in the same container.
    Layers with many small weights lose more than `amount`, small sensitive layers less.
    """
    named = dict(weights) if isinstance(weights, dict) else dict(enumerate(weights))
    if not named:
        raise ValueError("weights must hold at least one tensor")
    tensors = [_check_tensor(w, f"weights[{key!r}]") for key, w in named.items()]
    flat = magnitude_mask(torch.cat([w.reshape(-1) for w in tensors]), amount)
    pieces = flat.split([w.numel() for w in tensors])
    masks = {key: piece.view_as(w) for key, piece, w in zip(named, pieces, tensors)}
    return masks if isinstance(weights, dict) else list(masks.values())


# --- whole models --------------------------------------------------------------------------------

def prunable_layers(model: nn.Module, layers=None) -> dict:
    """name -> module for the Linear/Conv2d layers of `model` (all, or those named in `layers`)."""
    found = {name: m for name, m in model.named_modules() if isinstance(m, PRUNABLE)}
    if not found:
        raise ValueError(f"model ({type(model).__name__}) has no prunable layers: pruning works on the "
                         "weights of nn.Linear and nn.Conv2d")
    if layers is None:
        return found
    names = [layers] if isinstance(layers, str) else list(layers)
    unknown = [n for n in names if n not in found]
    if unknown or not names:
        raise ValueError(f"layers must name prunable layers of this model, one of {list(found)}; got {names!r}")
    return {n: found[n] for n in names}


@torch.no_grad()
def apply_masks(model: nn.Module, masks: dict) -> None:
    """weight *= mask in place for every `layer name -> mask` (after each optimizer step)."""
    layers = prunable_layers(model, list(masks))
    for name, mask in masks.items():
        w = layers[name].weight
        if mask.shape != w.shape:
            raise ValueError(f"mask for {name!r} has shape {tuple(mask.shape)}, weight {tuple(w.shape)}")
        w.mul_(mask.to(w.device))


def magnitude_prune(model: nn.Module, amount: float, scope: str = "layer", layers=None) -> dict:
    """Zero the smallest |w| of the chosen layers' weights in place (biases kept); return the masks.

    scope "layer": every layer loses `amount` of its own weights; "global": one threshold for all.
    """
    one_of("scope", scope, SCOPES)
    weights = {name: m.weight for name, m in prunable_layers(model, layers).items()}
    if scope == "layer":
        masks = {name: magnitude_mask(w, amount) for name, w in weights.items()}
    else:
        masks = global_magnitude_masks(weights, amount)
    apply_masks(model, masks)
    return masks


def sparsity(model: nn.Module, layers=None) -> dict:
    """Fraction of exactly-zero weights per prunable layer, and "total" over all of them."""
    chosen = prunable_layers(model, layers)
    zeros = {name: int((m.weight == 0).sum()) for name, m in chosen.items()}
    sizes = {name: m.weight.numel() for name, m in chosen.items()}
    out = {name: zeros[name] / sizes[name] for name in chosen}
    out["total"] = sum(zeros.values()) / sum(sizes.values())
    return out


def masked_fit(model: nn.Module, masks: dict, train_loader, val_loader=None, **fit_kwargs):
    """`course_lib.loop.fit` with the masks re-applied after every optimizer step; returns its History.

    Without that, the gradient (and Adam's momentum) moves pruned weights away from zero at once.
    """
    device = torch.device(fit_kwargs.get("device") or next(model.parameters()).device)
    model.to(device)
    layers = prunable_layers(model, list(masks))
    pairs = [(layers[name].weight, mask.to(device)) for name, mask in masks.items()]

    @torch.no_grad()
    def reapply(epoch, step):
        for w, mask in pairs:
            w.mul_(mask)

    reapply(0, 0)
    return fit(model, train_loader, val_loader, on_step_end=reapply, **fit_kwargs)


def iterative_prune(model: nn.Module, sparsities, train_loader, val_loader, scope: str = "layer",
                    layers=None, **fit_kwargs) -> tuple[list, dict]:
    """Prune to each target sparsity in turn, retraining (masked) after each; returns (rounds, masks).

    rounds: one dict per target with "target", "sparsity" (measured), "accuracy_pruned" (before
    retraining) and "accuracy" (after). Already pruned weights are 0, the smallest |w|, so each
    round's mask contains the previous one.
    """
    targets = [check_amount(s, "sparsities[i]") for s in sparsities]
    if not targets or targets != sorted(targets):
        raise ValueError(f"sparsities must be a non-empty, non-decreasing list in [0, 1); got {list(sparsities)!r}")
    rounds, masks = [], {}
    for target in targets:
        masks = magnitude_prune(model, target, scope, layers)
        pruned_accuracy = evaluate(model, val_loader)[1]
        history = masked_fit(model, masks, train_loader, val_loader, **fit_kwargs)
        rounds.append({"target": target, "sparsity": sparsity(model, layers)["total"],
                       "accuracy_pruned": pruned_accuracy,
                       "accuracy": history.val_accuracy[-1] if history.val_accuracy else pruned_accuracy})
    return rounds, masks


@torch.no_grad()
def sensitivity_scan(model: nn.Module, loader, amounts, layers=None) -> dict:
    """Accuracy with one layer magnitude-pruned at a time: layer name -> [accuracy per amount].

    The model is restored after every point. Layers whose accuracy falls early deserve a lower
    sparsity (Han et al. prune conv1 and the last layer less).
    """
    amounts = [check_amount(a, "amounts[i]") for a in amounts]
    scan = {}
    for name, layer in prunable_layers(model, layers).items():
        original = layer.weight.detach().clone()
        scan[name] = []
        for amount in amounts:
            layer.weight.mul_(magnitude_mask(original, amount))
            scan[name].append(evaluate(model, loader)[1])
            layer.weight.copy_(original)
    return scan


def plot_sensitivity(amounts, scan: dict, baseline: float | None = None, ax=None):
    """Accuracy (%) vs sparsity (%), one line per layer; returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for name, accuracies in scan.items():
        ax.plot([100 * a for a in amounts], [100 * a for a in accuracies], "o-", label=name)
    if baseline is not None:
        ax.axhline(100 * baseline, color="gray", ls="--", label="unpruned")
    ax.set_xlabel("sparsity of this layer only (%)")
    ax.set_ylabel("test accuracy (%)")
    ax.legend()
    return ax


# --- running a pruned model with sparse kernels -------------------------------------------------

def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    """Put `module` in place of `model`'s submodule `name` (dotted: "features.0"); `structured` uses it too."""
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


class CSRLinear(nn.Module):
    """A Linear layer whose weight [out, in] is kept in CSR and multiplied with torch.sparse.mm."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.register_buffer("weight", csr(linear.weight))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # [N, in] -> [N, out]
        y = torch.sparse.mm(self.weight, x.t()).t()
        return y if self.bias is None else y + self.bias


def csr_linear_model(model: nn.Module) -> nn.Module:
    """A copy of `model` (for inference) with every nn.Linear replaced by a CSRLinear."""
    sparse = copy.deepcopy(model)
    linears = [name for name, m in sparse.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(f"model ({type(model).__name__}) has no nn.Linear layers to store in CSR")
    for name in linears:
        _set_module(sparse, name, CSRLinear(sparse.get_submodule(name)))
    return sparse.eval()
