"""Checks for solutions/12_pruning_exercises.ipynb: magnitude masks, global masks, structured pruning, 2:4.

Every expected answer comes from torch.nn.utils.prune itself (l1_unstructured, global_unstructured,
ln_structured) applied to the same weights, plus two properties where ties leave torch's choice
open: exactly round(amount * numel) weights go, and no pruned |w| is larger than a kept one. The 2:4
mask is checked by behaviour: each plausible wrong grouping is recognised and named.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils import prune

from . import expect, passed

# (numel, amount) where floor, ceil and round-half-up disagree with round(): 2.5 -> 2, 7.5 -> 8, 3.5 -> 4
ROUNDING_CASES = ((10, 0.25), (10, 0.75), (10, 0.35), (12, 0.5), (7, 0.3), (20, 0.125))


def _weights(shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _call(fn, weights, amount, what: str):
    """fn(weights, amount) on copies; a crash becomes a hint, and the weights must come back unchanged."""
    copies = [w.clone() for w in weights] if isinstance(weights, list) else weights.clone()
    try:
        result = fn(copies, amount)
    except NotImplementedError:
        raise
    except Exception as exc:
        hint = (" With k = round(amount * numel) = 0 nothing is pruned: return all ones (kthvalue(0) and "
                "topk(..., 0) have nothing to pick)." if amount == 0 else "")
        raise AssertionError(f"{what} raised {type(exc).__name__}: {exc}.{hint}") from None
    same = (all(torch.equal(c, w) for c, w in zip(copies, weights)) if isinstance(weights, list)
            else torch.equal(copies, weights))
    expect(same, f"{what} changed the weights it was given: compute the mask from a copy (weight.abs(), not "
                 "weight.abs_() or in-place sorting); pruning is applied later by multiplying with the mask.")
    return result


def _as_mask(mask, weight: torch.Tensor, what: str) -> torch.Tensor:
    expect(isinstance(mask, torch.Tensor), f"{what} returned {type(mask).__name__}; expected a torch.Tensor mask")
    expect(mask.shape == weight.shape,
           f"{what}: the mask has shape {tuple(mask.shape)}; it must have the weight's shape {tuple(weight.shape)}")
    mask = mask.detach().float()
    expect(bool(((mask == 0) | (mask == 1)).all()), f"{what}: a mask holds only 0 (pruned) and 1 (kept)")
    return mask


def _torch_mask(weight: torch.Tensor, amount: float) -> torch.Tensor:
    holder = nn.Module()
    holder.weight = nn.Parameter(weight.clone())
    prune.l1_unstructured(holder, "weight", amount)
    return holder.weight_mask


def _expect_magnitude_mask(mask, weight, amount, what) -> None:
    """Compared with prune.l1_unstructured; `weight` must have no ties in |w|."""
    mask = _as_mask(mask, weight, what)
    want = _torch_mask(weight, amount)
    pruned, want_pruned = int((mask == 0).sum()), int((want == 0).sum())
    product = amount * weight.numel()
    if pruned in (int(product), math.ceil(product), math.floor(product + 0.5)) and pruned != want_pruned:
        hint = ("use Python's round() (it rounds halves to even: round(2.5) == 2), not int(), math.ceil() or "
                "floor(x + 0.5).")
    elif abs(pruned - want_pruned) == 1:
        hint = ("off by one at the threshold? kthvalue(k) is the k-th smallest counting from 1, so |w| < kthvalue(k) "
                "keeps it (k - 1 pruned); sorted(|w|)[k] is already the (k+1)-th.")
    else:
        hint = "prune exactly k = round(amount * numel) weights, the k smallest |w|."
    expect(pruned == want_pruned,
           f"{what}: pruned {pruned} of {weight.numel()} weights; torch prunes round({amount} * {weight.numel()}) "
           f"= {want_pruned}. Hint: {hint}")
    if 0 < pruned < weight.numel():
        expect(bool(weight.abs()[mask == 0].max() <= weight.abs()[mask == 1].min()),
               f"{what}: some pruned weight is larger in magnitude than a kept one. Prune the *smallest* |w| "
               "(abs first: -3.0 is a big weight, not a small one).")
    expect(torch.equal(mask, want), f"{what}: the mask differs from torch.nn.utils.prune.l1_unstructured's.")


def check_magnitude_mask(magnitude_mask) -> None:
    """`magnitude_mask(weight, amount)` -> 0/1 mask pruning the round(amount * numel) smallest |w|."""
    for i, (shape, amount) in enumerate((((30, 20), 0.5), ((300, 784), 0.9), ((20, 1, 5, 5), 0.3), ((50,), 0.0))):
        weight = _weights(shape, seed=i)
        what = f"magnitude_mask(weight of shape {shape}, amount={amount})"
        _expect_magnitude_mask(_call(magnitude_mask, weight, amount, what), weight, amount, what)
    for numel, amount in ROUNDING_CASES:
        weight = _weights((numel,), seed=numel)
        what = f"magnitude_mask(weight with {numel} values, amount={amount})"
        _expect_magnitude_mask(_call(magnitude_mask, weight, amount, what), weight, amount, what)
    signed = torch.tensor([-5.0, 0.1, -0.2, 4.0, -3.0, 0.3, 2.0, -0.05])
    what = f"magnitude_mask({signed.tolist()}, 0.5)"
    _expect_magnitude_mask(_call(magnitude_mask, signed, 0.5, what), signed, 0.5, what)
    ties = torch.tensor([1.0, -1.0, 1.0, 2.0, -1.0, 3.0, 1.0, -2.0, 0.5, 1.0])
    what = "magnitude_mask(weight with ties, 0.4)"
    mask = _as_mask(_call(magnitude_mask, ties, 0.4, what), ties, what)
    expect(int((mask == 0).sum()) == 4,
           f"magnitude_mask({ties.tolist()}, 0.4) pruned {int((mask == 0).sum())} weights; exactly 4 must go even "
           "though five weights tie at |w| = 1. A threshold (|w| <= 4th smallest) prunes every tie; take the k "
           "smallest instead (torch.topk(..., largest=False)).")
    expect(bool(mask[8] == 0) and bool(mask[[3, 5, 7]].eq(1).all()), "with ties: 0.5 must be pruned, 2, 3 and -2 kept")
    passed("magnitude_mask")


def check_global_masks(global_masks) -> None:
    """`global_masks(weights, amount)` -> a list of masks with one threshold over all weights."""
    layers = [nn.Linear(64, 48), nn.Linear(48, 32), nn.Linear(32, 10)]
    with torch.no_grad():   # different scales, as after training: global differs from per-layer
        for i, (layer, scale) in enumerate(zip(layers, (0.2, 1.0, 3.0))):
            layer.weight.copy_(_weights(layer.weight.shape, seed=100 + i, scale=scale))
    weights = [layer.weight.detach().clone() for layer in layers]
    for amount in (0.5, 0.8, 0.35):
        masks = _call(global_masks, weights, amount, f"global_masks(..., {amount})")
        expect(isinstance(masks, (list, tuple)) and len(masks) == len(weights),
               f"global_masks must return a list with one mask per weight ({len(weights)}); got {type(masks).__name__}")
        masks = [_as_mask(m, w, f"global_masks(..., {amount}) mask {i}") for i, (m, w) in enumerate(zip(masks, weights))]
        copies = [nn.Linear(l.in_features, l.out_features) for l in layers]
        for layer, w in zip(copies, weights):
            layer.weight = nn.Parameter(w.clone())
        prune.global_unstructured([(layer, "weight") for layer in copies], prune.L1Unstructured, amount=amount)
        wants = [layer.weight_mask for layer in copies]
        total = sum(w.numel() for w in weights)
        got_pruned, want_pruned = sum(int((m == 0).sum()) for m in masks), sum(int((m == 0).sum()) for m in wants)
        expect(got_pruned == want_pruned,
               f"global_masks(..., {amount}) pruned {got_pruned} weights in all; expected round({amount} * {total}) "
               f"= {want_pruned} over all layers together.")
        fractions = [round(float((m == 0).float().mean()), 3) for m in masks]
        want_fractions = [round(float((m == 0).float().mean()), 3) for m in wants]
        expect(fractions == want_fractions,
               f"global_masks(..., {amount}): layers are pruned {fractions}, torch's global_unstructured prunes "
               f"{want_fractions}. One threshold over all weights (concatenate them, then prune the smallest |w|) "
               "prunes a layer of small weights more; per-layer pruning gives every layer the same fraction.")
        for i, (m, want) in enumerate(zip(masks, wants)):
            expect(torch.equal(m, want), f"global_masks(..., {amount}): mask {i} differs from global_unstructured's.")
    passed("global_masks")


def check_neurons_to_keep(neurons_to_keep) -> None:
    """`neurons_to_keep(weight, amount)` -> sorted row indices that ln_structured(n=2, dim=0) keeps."""
    g = torch.Generator().manual_seed(12)
    spiky = torch.zeros(6, 40)
    spiky[:, 0] = torch.linspace(2.0, 3.0, 6)            # one big entry: large L2, small L1
    flat = torch.full((6, 40), 0.3) * torch.linspace(0.9, 1.1, 6)[:, None]   # many small: large L1, small L2
    mixed = torch.cat([spiky, flat, 0.5 * torch.randn(8, 40, generator=g)])[torch.randperm(20, generator=g)]
    cases = [(mixed, 0.5), (mixed, 0.3), (_weights((100, 300), seed=7), 0.5), (_weights((15, 8), seed=8), 0.25)]
    for weight, amount in cases:
        what = f"neurons_to_keep(weight of shape {tuple(weight.shape)}, amount={amount})"
        got = _call(neurons_to_keep, weight, amount, what)
        try:
            got = [int(i) for i in got]
        except (TypeError, ValueError):
            raise AssertionError(f"{what} returned {type(got).__name__}; expected a list of row indices") from None
        holder = nn.Module()
        holder.weight = nn.Parameter(weight.clone())
        prune.ln_structured(holder, "weight", amount, n=2, dim=0)
        want = holder.weight_mask.any(dim=1).nonzero().flatten().tolist()
        rows = weight.shape[0]
        expect(all(0 <= i < rows for i in got),
               f"{what} returned indices outside range({rows}): neurons are the rows (dim 0) of a Linear weight "
               "[out_features, in_features], not its columns.")
        expect(len(got) == len(want),
               f"{what} keeps {len(got)} neurons; expected {rows} - round({amount} * {rows}) = {len(want)}. "
               "Return the neurons that stay, and count with round() as torch does.")
        expect(got == sorted(got), f"{what} returned {got}: return the kept indices in increasing order")
        expect(got == want,
               f"{what} keeps {got}, torch.nn.utils.prune.ln_structured(n=2, dim=0) keeps {want}. Rank each row "
               "by its L2 norm (weight.norm(dim=1)) and keep the largest: not the weakest rows, and not the L1 norm, "
               "which ranks one big weight below many small ones.")
    passed("neurons_to_keep")


# --- the 2:4 mask --------------------------------------------------------------------------------

def _kept_per_group(mask: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """How many of each group's positions the mask keeps; groups: [G, 4] flat indices."""
    return mask.reshape(-1)[groups].sum(dim=1)


def _groups(rows: int, cols: int, how: str) -> torch.Tensor:
    """[G, 4] flat indices of a [rows, cols] matrix: 4 consecutive in a row ("row"), 4 consecutive rows of a
    column ("column"), or a row's elements j, j + cols/4, j + 2 cols/4, j + 3 cols/4 ("strided")."""
    index = torch.arange(rows * cols).reshape(rows, cols)
    if how == "row":
        return index.reshape(-1, 4)
    if how == "column":
        return index.t().reshape(-1, 4)
    return index.reshape(rows, 4, cols // 4).transpose(1, 2).reshape(-1, 4)


def _top2_of_4(scores: torch.Tensor) -> torch.Tensor:
    """The 2 largest scores of every 4 consecutive along the last dim (the weights here have no ties)."""
    groups = scores.reshape(-1, 4)
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, groups.topk(2, dim=1).indices, True)
    return mask.reshape(scores.shape)


def _as_bool_mask(mask, weight: torch.Tensor, what: str) -> torch.Tensor:
    expect(isinstance(mask, torch.Tensor), f"{what} returned {type(mask).__name__}; expected a torch.Tensor mask")
    expect(mask.shape == weight.shape,
           f"{what}: the mask has shape {tuple(mask.shape)}; it must have the weight's shape {tuple(weight.shape)}")
    expect(mask.dtype == torch.bool or bool(((mask == 0) | (mask == 1)).all()),
           f"{what}: a mask holds only True/1 (kept) and False/0 (pruned)")
    return mask.detach().bool()


def _expect_two_four(mask: torch.Tensor, weight: torch.Tensor, what: str) -> None:
    """Diagnose the grouping first (each wrong grouping names itself), then the choice inside groups."""
    rows, cols = weight.shape
    counts = _kept_per_group(mask, _groups(rows, cols, "row"))
    if not bool(counts.eq(2).all()):
        per_row = mask.sum(dim=1)
        if bool(_kept_per_group(mask, _groups(rows, cols, "column")).eq(2).all()):
            hint = ("your groups of 4 run down the columns (the output dim, dim 0). A Linear weight is [out, in]: "
                    "the groups run along the input dim, the last one (4 consecutive entries of a row).")
        elif bool(_kept_per_group(mask, _groups(rows, cols, "strided")).eq(2).all()):
            hint = ("your groups are entries cols/4 apart (reshape(rows, 4, -1) groups j, j + cols/4, ...). A group "
                    "is 4 *consecutive* entries of a row: reshape(rows, -1, 4), or reshape(-1, 4).")
        elif bool(per_row.eq(cols // 2).all()):
            hint = ("each row keeps half its weights, but not 2 in every group of 4: that is unstructured pruning "
                    "per row, which the hardware cannot use. Rank the 4 weights of each group among themselves.")
        else:
            hint = "split every row into groups of 4 consecutive weights and keep exactly 2 of each."
        bad = int((~counts.eq(2)).nonzero()[0])
        expect(False, f"{what}: group {bad} (row {bad // (cols // 4)}, columns {4 * (bad % (cols // 4))}.."
                      f"{4 * (bad % (cols // 4)) + 3}) keeps {int(counts[bad])} of 4; Hint: {hint}")
    want = _top2_of_4(weight.abs())
    if not torch.equal(mask, want):
        if torch.equal(mask, ~want):
            hint = "you kept the 2 *smallest* of every 4: keep the 2 largest |w| (topk(2), largest=True)."
        elif torch.equal(mask, _top2_of_4(weight)):
            hint = "rank by magnitude, not signed value: -3.0 is a large weight, keep it (weight.abs() first)."
        else:
            hint = "in each group of 4 keep the 2 entries of largest |w|."
        expect(False, f"{what}: {int((mask != want).sum())} positions differ from the 2 largest |w| of every 4. "
                      f"Hint: {hint}")


def check_two_four_mask(two_four_mask) -> None:
    """`two_four_mask(weight [out, in])` -> bool mask keeping the 2 largest |w| of every 4 consecutive along `in`."""
    for seed, shape in enumerate(((8, 16), (6, 32), (12, 8), (300, 784))):
        weight = _weights(shape, seed=40 + seed)
        what = f"two_four_mask(weight of shape {shape})"
        mask = _as_bool_mask(_call(lambda w, _: two_four_mask(w), weight, None, what), weight, what)
        _expect_two_four(mask, weight, what)
    ties = torch.tensor([[1.0, 1.0, 1.0, 1.0, 2.0, -1.0, 1.0, 0.5],
                         [-0.5, 2.0, -2.0, 2.0, 0.0, 0.0, 0.0, 0.0],
                         [3.0, -1.0, 1.0, -1.0, 1.0, 1.0, -4.0, 1.0]])
    what = f"two_four_mask({ties.tolist()})"
    mask = _as_bool_mask(_call(lambda w, _: two_four_mask(w), ties, None, what), ties, what)
    counts = mask.reshape(-1, 4).sum(dim=1)
    bad = [i for i, c in enumerate(counts.tolist()) if c != 2]
    expect(not bad, f"{what}: with tied magnitudes, groups {bad} keep {[int(counts[i]) for i in bad]} weights; "
                    "exactly 2 of every 4 must stay even when |w| ties (a threshold |w| >= 2nd largest keeps every "
                    "tie; take the top 2 by index: topk or a sort).")
    groups, kept = ties.abs().reshape(-1, 4), mask.reshape(-1, 4)
    expect(bool((groups.masked_fill(~kept, float("inf")).min(1).values
                 >= groups.masked_fill(kept, -1.0).max(1).values).all()),
           f"{what}: some group keeps a smaller |w| than one it drops (ties may go either way, sizes may not).")
    passed("two_four_mask")
