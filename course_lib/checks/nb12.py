"""Checks for solutions/12_pruning_exercises.ipynb: magnitude masks, global masks, structured pruning, 2:4.

Every expected answer comes from torch.nn.utils.prune itself (l1_unstructured, global_unstructured,
ln_structured) applied to the same weights, plus two properties where ties leave the choice open (the
exercises allow any tie rule): exactly round(amount * numel) weights go, and no pruned |w| is larger than a
kept one. The 2:4 mask is checked by behaviour: each plausible wrong grouping is recognised and named. The
answers must not call those library functions (torch's prune, the course's own pruning modules).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils import prune

from . import expect, library_call, passed

# (numel, amount) where floor, ceil and round-half-up disagree with round(): 2.5 -> 2, 7.5 -> 8, 3.5 -> 4
ROUNDING_CASES = ((10, 0.25), (10, 0.75), (10, 0.35), (12, 0.5), (7, 0.3), (20, 0.125))
# torch.nn.utils.prune and the course's versions: each does a whole exercise in one call
PRUNE_LIBRARY = ("l1_unstructured", "L1Unstructured", "global_unstructured", "ln_structured", "LnStructured",
                 "random_unstructured", "compute_mask", "global_magnitude_masks", "keep_channels", "channel_mask",
                 "nm_mask", "semi_structured")


def _weights(shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _no_library(fn, what: str, own: str) -> None:
    used = library_call(fn, PRUNE_LIBRARY, methods=(own,))
    expect(not used, f"{what} uses {used}: that is a library doing the whole exercise. Compute it with tensor "
           "operations (abs, topk or sort, ...); the check compares with torch.nn.utils.prune.")


def _call(fn, weights, amount, what: str):
    """fn(weights, amount) on copies; a crash becomes a hint, and the weights must come back unchanged."""
    copies = [w.clone() for w in weights] if isinstance(weights, list) else weights.clone()   # clone keeps strides
    strided = any(not w.is_contiguous() for w in (weights if isinstance(weights, list) else [weights]))
    try:
        result = fn(copies, amount)
    except NotImplementedError:
        raise
    except Exception as exc:
        hint = (" With k = round(amount * numel) = 0 nothing is pruned: return all ones (kthvalue(0) and "
                "topk(..., 0) have nothing to pick)." if amount == 0 else "")
        if strided:
            hint += (" This weight is a transposed view (not contiguous): .view(-1) cannot flatten it; build the "
                     "mask with torch.ones(weight.shape, ...) or use reshape.")
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
    expect(mask.dtype == weight.dtype, f"{what}: the mask is {mask.dtype}; it must have the weight's dtype "
           f"{weight.dtype} (0 and 1, as prune's weight_mask), so that weight * mask keeps the weight's dtype.")
    mask = mask.detach().float()
    expect(bool(((mask == 0) | (mask == 1)).all()), f"{what}: a mask holds only 0 (pruned) and 1 (kept)")
    return mask


def _torch_mask(weight: torch.Tensor, amount: float) -> torch.Tensor:
    holder = nn.Module()
    holder.weight = nn.Parameter(weight.contiguous().clone())      # prune's own .view(-1) needs contiguous
    prune.l1_unstructured(holder, "weight", amount)
    return holder.weight_mask


def _count_rules(product: float) -> dict:
    """The counts that plausible rounding rules other than round() give for amount * numel."""
    return {"int()": int(product), "math.ceil()": math.ceil(product), "floor(x + 0.5)": math.floor(product + 0.5)}


def _count_hint(pruned: int, k: int, product: float, magnitudes: torch.Tensor, mask: torch.Tensor) -> str:
    """Why `pruned` weights went instead of k = round(product), read off the count and the mask."""
    if 0 < k <= len(magnitudes):
        t = magnitudes.sort().values[k - 1]                       # the k-th smallest: the cut
        tied = int((magnitudes == t).sum())
        for cut, went in ((magnitudes <= t, "all of them were pruned"), (magnitudes < t, "none of them was pruned")):
            if tied > 1 and torch.equal(mask == 0, cut):
                return (f"{tied} weights tie at the cut, |w| = {t.item():.4g}, and {went}: exactly k = {k} must go "
                        "even then; take the k smallest (torch.topk(..., largest=False)), not a threshold on |w|.")
    rules = _count_rules(product)
    used = [name for name, count in rules.items() if count == pruned]
    if used:
        return (f"that is {' or '.join(used)} of {product:g}: use Python's round() (it rounds halves to even: "
                "round(2.5) == 2), as torch does.")
    order = magnitudes.sort().values
    if pruned == k - 1 and k and bool((mask == 1).any()) and magnitudes[mask == 1].min() == order[k - 1]:
        return (f"the k-th smallest |w| ({order[k - 1].item():.4g}) was kept: a threshold |w| < kthvalue(k) keeps it "
                "(kthvalue counts from 1); prune the k smallest, it included.")
    if pruned == k + 1 and k < len(order) and magnitudes[mask == 0].max() == order[k]:
        return (f"the (k+1)-th smallest |w| ({order[k].item():.4g}) was pruned too: sorted(|w|)[k] counts from 0, "
                "so it is already the (k+1)-th.")
    return "prune exactly k = round(amount * numel) weights, the k smallest |w|."


def _expect_order(mask, weight, what: str) -> None:
    """No pruned |w| is larger than a kept one (ties may go either way)."""
    magnitudes, signed = weight.detach().abs().float(), weight.detach().float()
    pruned, kept = mask == 0, mask == 1
    if bool(pruned.any()) and bool(kept.any()) and magnitudes[pruned].max() > magnitudes[kept].min():
        if signed[pruned].max() <= signed[kept].min():
            hint = ("you pruned the smallest SIGNED values: rank by magnitude, |w| (-3.0 is a big weight, not a "
                    "small one)")
        elif magnitudes[pruned].min() >= magnitudes[kept].max():
            hint = "you pruned the LARGEST |w|: prune the smallest"
        else:
            hint = "prune the smallest |w| of the whole tensor"
        raise AssertionError(f"{what}: a pruned weight (|w| = {magnitudes[pruned].max().item():.4g}) is larger in "
                             f"magnitude than a kept one (|w| = {magnitudes[kept].min().item():.4g}): {hint}.")


def _expect_magnitude_mask(mask, weight, amount, what) -> None:
    """Exactly round(amount * numel) pruned, the smallest |w| (any tie rule); the same as prune.l1_unstructured's
    mask where |w| has no ties at the cut."""
    mask = _as_mask(mask, weight, what)
    k, pruned = round(amount * weight.numel()), int((mask == 0).sum())
    if pruned != k:
        hint = _count_hint(pruned, k, amount * weight.numel(), weight.abs().flatten(), mask.flatten())
        raise AssertionError(f"{what}: pruned {pruned} of {weight.numel()} weights; torch prunes round({amount} * "
                             f"{weight.numel()}) = {k}. Hint: {hint}")
    _expect_order(mask, weight, what)
    order = weight.abs().flatten().sort().values
    if 0 < k < weight.numel() and order[k - 1] < order[k]:          # no tie at the cut: one right answer
        expect(torch.equal(mask, _torch_mask(weight, amount).float()),
               f"{what}: the mask differs from torch.nn.utils.prune.l1_unstructured's.")


def check_magnitude_mask(magnitude_mask) -> None:
    """`magnitude_mask(weight, amount)` -> 0/1 mask (weight's shape and dtype) pruning the round(amount * numel)
    smallest |w|; tried on shapes of 1 to 4 dims, float32/float64/bfloat16, a transposed (not contiguous) weight,
    k = 0 and k = numel, halves that round(), and ties at the cut (any k of the tied weights may go)."""
    _no_library(magnitude_mask, "magnitude_mask", "magnitude_mask")
    cases = [(_weights((30, 20), 0), 0.5), (_weights((300, 784), 1), 0.9), (_weights((20, 1, 5, 5), 2), 0.3),
             (_weights((50,), 3), 0.0), (_weights((10,), 4), 0.96), (_weights((1,), 5), 0.6)]
    cases += [(_weights((numel,), numel), amount) for numel, amount in ROUNDING_CASES]
    cases += [(torch.tensor([-5.0, 0.1, -0.2, 4.0, -3.0, 0.3, 2.0, -0.05]), 0.5),
              (torch.tensor([1.0, -1.0, 1.0, 2.0, -1.0, 3.0, 1.0, -2.0, 0.5, 1.0]), 0.4),   # five tie at the cut
              (torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, -1.0]]), 0.5),                    # zeros tie too
              (_weights((16, 8), 7).double(), 0.3), (_weights((16, 8), 8).bfloat16(), 0.45),
              (_weights((20, 30), 6).t(), 0.4)]
    for weight, amount in cases:
        short = weight.numel() <= 10 and torch.equal(weight, (weight * 100).round() / 100)
        what = (f"magnitude_mask({weight.tolist()}, {amount})" if short else
                f"magnitude_mask(weight of shape {tuple(weight.shape)}, {weight.dtype}"
                f"{'' if weight.is_contiguous() else ', transposed'}, amount={amount})")
        _expect_magnitude_mask(_call(magnitude_mask, weight, amount, what), weight, amount, what)
    passed("magnitude_mask")


def _global_cases():
    layers = [_weights((48, 64), 100, 0.2), _weights((32, 48), 101, 1.0), _weights((10, 32), 102, 3.0)]
    ties = [torch.tensor([0.5, -0.5, 0.5, 2.0, 0.1]), torch.tensor([[0.5, 3.0], [-0.5, 0.5]]),
            torch.full((2, 1, 2, 2), -0.5)]                          # twelve tie at 0.5 across three layers
    conv = [_weights((6, 1, 5, 5), 103, 0.3), _weights((6,), 104, 0.1), _weights((10, 24), 105).t()]
    return [(layers, 0.5), (layers, 0.8), (layers, 0.35), (layers, 0.0), (ties, 0.4), (ties, 0.7), (conv, 0.55),
            ([_weights((7, 3), 106)], 0.5), ([t.double() for t in conv[:2]], 0.25)]


def check_global_masks(global_masks) -> None:
    """`global_masks(weights, amount)` -> a list of masks (the weights' shapes and dtypes) with one threshold over
    all weights: round(amount * total) pruned, no pruned |w| above a kept one in ANY layer (ties at the cut may go
    either way), equal to global_unstructured's masks where nothing ties at the cut."""
    _no_library(global_masks, "global_masks", "global_masks")
    for weights, amount in _global_cases():
        what = f"global_masks(weights of shapes {[tuple(w.shape) for w in weights]}, {amount})"
        masks = _call(global_masks, weights, amount, what)
        _expect_global_masks(masks, weights, amount, what)
    passed("global_masks")


def _expect_global_masks(masks, weights, amount, what) -> None:
    """One threshold over all weights: round(amount * total) pruned, no pruned |w| above a kept one in any layer,
    global_unstructured's masks where nothing ties at the cut."""
    expect(isinstance(masks, (list, tuple)) and len(masks) == len(weights),
           f"{what} must return a list with one mask per weight ({len(weights)}); got {type(masks).__name__}")
    masks = [_as_mask(m, w, f"{what}: mask {i}") for i, (m, w) in enumerate(zip(masks, weights))]
    flat_w = torch.cat([w.detach().flatten().float() for w in weights])
    flat_m = torch.cat([m.flatten() for m in masks])
    total, k = len(flat_w), round(amount * len(flat_w))
    pruned = [int((m == 0).sum()) for m in masks]
    per_layer = [round(amount * w.numel()) for w in weights]
    if sum(pruned) != k:
        hint = (f"each layer lost its own round(amount * numel) {per_layer}: that is per-layer pruning"
                if pruned == per_layer else _count_hint(sum(pruned), k, amount * total, flat_w.abs(), flat_m))
        raise AssertionError(f"{what} pruned {sum(pruned)} weights in all; expected round({amount} * {total}) = "
                             f"{k} over all layers together. Hint: {hint}")
    if bool((flat_m == 0).any()) and bool((flat_m == 1).any()):
        small, big = flat_w.abs()[flat_m == 1].min(), flat_w.abs()[flat_m == 0].max()
        if big > small:
            layer = lambda value, kept: next(i for i, (w, m) in enumerate(zip(weights, masks))  # noqa: E731
                                             if bool(((w.abs().float() == value) & (m == kept)).any()))
            hint = ("each layer lost the same fraction: that is per-layer pruning. Concatenate the flattened "
                    "weights and prune the smallest |w| of all of them together" if pruned == per_layer else
                    "rank all weights of all layers together by |w|")
            raise AssertionError(f"{what}: a pruned weight of layer {layer(big, 0)} (|w| = {big.item():.4g}) is "
                                 f"larger than a kept one of layer {layer(small, 1)} (|w| = {small.item():.4g}): "
                                 f"{hint}.")
    order = flat_w.abs().sort().values
    if 0 < k < total and order[k - 1] < order[k]:
        copies = [nn.Module() for _ in weights]
        for holder, w in zip(copies, weights):
            holder.weight = nn.Parameter(w.contiguous().clone())
        prune.global_unstructured([(h, "weight") for h in copies], prune.L1Unstructured, amount=amount)
        for i, (m, holder) in enumerate(zip(masks, copies)):
            expect(torch.equal(m, holder.weight_mask.float()),
                   f"{what}: mask {i} differs from global_unstructured's.")


def _neuron_cases():
    g = torch.Generator().manual_seed(12)
    spiky = torch.zeros(6, 40)
    spiky[:, 0] = torch.linspace(2.0, 3.0, 6)            # one big entry: large L2, small L1
    flat = torch.full((6, 40), 0.3) * torch.linspace(0.9, 1.1, 6)[:, None]   # many small: large L1, small L2
    mixed = torch.cat([spiky, flat, 0.5 * torch.randn(8, 40, generator=g)])[torch.randperm(20, generator=g)]
    tied = torch.tensor([[3.0, 4.0], [5.0, 0.0], [0.0, -5.0], [1.0, 1.0], [-4.0, 3.0], [6.0, 0.0]])   # norms 5 tie
    return [(mixed, 0.3), (mixed, 0.5), (_weights((100, 300), seed=7), 0.5), (_weights((15, 8), seed=8), 0.25),
            (_weights((10, 6), seed=9), 0.25), (_weights((6, 6), seed=10), 0.75), (_weights((5, 3), seed=11), 0.0),
            (_weights((1, 4), seed=13), 0.4), (tied, 0.5), (tied, 0.2), (_weights((12, 5), seed=14).double(), 0.5)]


def _neurons(got, what: str) -> list:
    """The answer's kept rows as a list of ints: a list/tuple of ints or a 1-D integer tensor."""
    if isinstance(got, torch.Tensor):
        expect(got.dim() == 1 and not got.is_floating_point() and got.dtype != torch.bool,
               f"{what} returned a tensor of shape {tuple(got.shape)} and dtype {got.dtype}; return a list of ints "
               "(or a 1-D integer tensor) of row indices")
        return got.tolist()
    expect(isinstance(got, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in got),
           f"{what} returned {got!r:.80}; expected a list of ints (row indices), e.g. indices.tolist()")
    return list(got)


def _norm_ranked(weight, keep: int, score) -> list:
    """The `keep` rows with the largest score (any tie rule), as a sorted list, or None where ties leave a choice."""
    s = score(weight.double())
    order = s.sort(descending=True).values
    if 0 < keep < len(s) and order[keep - 1] == order[keep]:
        return None
    return sorted(s.topk(keep).indices.tolist())


def check_neurons_to_keep(neurons_to_keep) -> None:
    """`neurons_to_keep(weight, amount)` -> sorted row indices that ln_structured(n=2, dim=0) keeps; where L2 norms
    tie at the cut any of the tied rows may stay (the count and the order by norm are what count)."""
    _no_library(neurons_to_keep, "neurons_to_keep", "neurons_to_keep")
    for weight, amount in _neuron_cases():
        what = f"neurons_to_keep(weight of shape {tuple(weight.shape)}, {weight.dtype}, amount={amount})"
        rows = weight.shape[0]
        got = _neurons(_call(neurons_to_keep, weight, amount, what), what)
        holder = nn.Module()
        holder.weight = nn.Parameter(weight.clone())
        prune.ln_structured(holder, "weight", amount, n=2, dim=0)
        want = holder.weight_mask.any(dim=1).nonzero().flatten().tolist()
        expect(all(0 <= i < rows for i in got),
               f"{what} returned indices {got[:8]} outside range({rows}): neurons are the rows (dim 0) of a Linear "
               "weight [out_features, in_features], not its columns.")
        expect(len(set(got)) == len(got), f"{what} returned {got}: each kept row once")
        if len(got) != len(want):
            removed, product = rows - len(want), amount * rows
            rules = _count_rules(product)
            rule = " or ".join(name for name, count in rules.items() if rows - count == len(got))
            if len(got) == removed and _norm_ranked(weight, removed, lambda w: -w.norm(dim=1)) == sorted(got):
                hint = "these are the rows that go (the smallest L2 norms): return the rows that stay"
            elif rule:
                hint = f"you remove {rule} of {product:g} rows; count with round() as torch does (halves to even)"
            else:
                hint = f"keep {rows} - round({amount} * {rows}) rows"
            raise AssertionError(f"{what} keeps {len(got)} neurons; expected {len(want)}: {hint}.")
        expect(got == sorted(got), f"{what} returned {got}: return the kept indices in increasing order")
        norms = weight.double().norm(dim=1)
        if got != want:
            kept = torch.zeros(rows, dtype=torch.bool)
            kept[got] = True
            if not kept.all() and norms[kept].min() >= norms[~kept].max():
                continue                                          # a tie at the cut went the other way: allowed
            named = [why for why, rule in (
                ("the rows of largest L1 norm (it ranks one big weight below many small ones): rank by the L2 norm, "
                 "weight.norm(dim=1)", lambda w: w.abs().sum(1)),
                ("the rows of SMALLEST L2 norm, the ones ln_structured removes: keep those of largest norm",
                 lambda w: -w.norm(dim=1)),
                ("the rows of largest entry (the L-inf norm), not of largest L2 norm", lambda w: w.abs().amax(1)),
                ("the rows of largest signed sum, not of largest L2 norm", lambda w: w.sum(1)))
                if _norm_ranked(weight, len(got), rule) == got]
            raise AssertionError(f"{what} keeps {got}, torch.nn.utils.prune.ln_structured(n=2, dim=0) keeps {want}"
                                 + (f": you kept {named[0]}." if named else
                                    ": keep the rows with the largest L2 norm, weight.norm(dim=1)."))
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
    """The 2 largest scores of every 4 consecutive along the last dim, flattened to [G, 4] (topk's tie rule)."""
    groups = scores.reshape(-1, 4)
    return torch.zeros_like(groups, dtype=torch.bool).scatter_(1, groups.topk(2, dim=1).indices, True)


def _as_bool_mask(mask, weight: torch.Tensor, what: str) -> torch.Tensor:
    expect(isinstance(mask, torch.Tensor), f"{what} returned {type(mask).__name__}; expected a torch.Tensor mask")
    expect(mask.shape == weight.shape,
           f"{what}: the mask has shape {tuple(mask.shape)}; it must have the weight's shape {tuple(weight.shape)}")
    expect(mask.dtype == torch.bool, f"{what}: the mask is {mask.dtype}; return a boolean tensor (True = kept, "
           "False = pruned), e.g. torch.zeros(..., dtype=torch.bool) filled with scatter_, or a comparison.")
    return mask.detach()


def _expect_two_four(mask: torch.Tensor, weight: torch.Tensor, what: str) -> None:
    """Diagnose the grouping first (each wrong grouping names itself), then the choice inside groups; where |w|
    ties at the cut of a group (2nd largest == 3rd largest) either tied entry may stay."""
    rows, cols = weight.shape
    groups = weight.detach().abs().float().reshape(-1, 4)
    top = groups.sort(dim=1, descending=True).values
    clear = top[:, 1] > top[:, 2]                      # no tie at the cut: one right choice
    counts = _kept_per_group(mask, _groups(rows, cols, "row"))
    if not bool(counts.eq(2).all()):
        wrong = ~counts.eq(2)
        per_row = mask.sum(dim=1)
        if not bool((wrong & clear).any()):
            bad, kept = wrong.nonzero().flatten().tolist(), mask.reshape(-1, 4)[wrong]
            cut = top[wrong][:, 1:2]
            how = ("every weight tied at the cut stayed (a threshold |w| >= t keeps every tie)"
                   if torch.equal(kept, groups[wrong] >= cut) else
                   "every weight tied at the cut went (a strict threshold |w| > t drops every tie)"
                   if torch.equal(kept, groups[wrong] > cut) else
                   "exactly 2 of every 4 must stay even then")
            expect(False, f"{what}: groups {bad[:6]}, where |w| ties at the 2nd largest, keep "
                          f"{counts[wrong][:6].tolist()} weights: {how}. Keep exactly 2 of every 4, tied or not: take "
                          "the top 2 by position, with topk or a sort.")
        if bool(_kept_per_group(mask, _groups(rows, cols, "column")).eq(2).all()):
            hint = ("your groups of 4 run down the columns (the output dim, dim 0). A Linear weight is [out, in]: "
                    "the groups run along the input dim, the last one (4 consecutive entries of a row).")
        elif cols >= 16 and bool(_kept_per_group(mask, _groups(rows, cols, "strided")).eq(2).all()):
            hint = ("your groups are entries cols/4 apart (reshape(rows, 4, -1) groups j, j + cols/4, ...). A group "
                    "is 4 *consecutive* entries of a row: reshape(rows, -1, 4), or reshape(-1, 4).")
        elif bool(per_row.eq(cols // 2).all()):
            hint = ("each row keeps half its weights, but not 2 in every group of 4: that is unstructured pruning "
                    "per row, which the hardware cannot use. Rank the 4 weights of each group among themselves.")
        else:
            hint = "split every row into groups of 4 consecutive weights and keep exactly 2 of each."
        bad = int((wrong & clear).nonzero()[0])
        expect(False, f"{what}: group {bad} (row {bad // (cols // 4)}, columns {4 * (bad % (cols // 4))}.."
                      f"{4 * (bad % (cols // 4)) + 3}) keeps {int(counts[bad])} of 4; Hint: {hint}")
    kept, want = mask.reshape(-1, 4), _top2_of_4(groups)
    if not torch.equal(kept[clear], want[clear]):
        if torch.equal(kept[clear], ~want[clear]):
            hint = "you kept the 2 *smallest* of every 4: keep the 2 largest |w| (topk(2), largest=True)."
        elif torch.equal(kept[clear], _top2_of_4(weight.detach().float())[clear]):
            hint = "rank by magnitude, not signed value: -3.0 is a large weight, keep it (weight.abs() first)."
        else:
            hint = "in each group of 4 keep the 2 entries of largest |w|."
        expect(False, f"{what}: {int((kept[clear] != want[clear]).sum())} positions differ from the 2 largest |w| "
                      f"of every 4. Hint: {hint}")
    expect(bool((groups.masked_fill(~kept, float("inf")).min(1).values
                 >= groups.masked_fill(kept, -1.0).max(1).values).all()),
           f"{what}: some group keeps a smaller |w| than one it drops (ties may go either way, sizes may not).")


def check_two_four_mask(two_four_mask) -> None:
    """`two_four_mask(weight [out, in])` -> bool mask keeping the 2 largest |w| of every 4 consecutive along `in`;
    tried on float32/float64/bfloat16, a transposed weight, one group, and ties (either tied entry may stay)."""
    _no_library(two_four_mask, "two_four_mask", "two_four_mask")
    cases = [_weights(shape, seed=40 + seed) for seed, shape in enumerate(((8, 16), (6, 32), (12, 8), (300, 784)))]
    cases += [_weights((1, 4), 50), _weights((16, 8), 51).t(), _weights((4, 12), 52).double(),
              _weights((8, 64), 53).bfloat16(),
              torch.tensor([[1.0, 1.0, 1.0, 1.0, 2.0, -1.0, 1.0, 0.5],
                            [-0.5, 2.0, -2.0, 2.0, 0.0, 0.0, 0.0, 0.0],
                            [3.0, -1.0, 1.0, -1.0, 1.0, 1.0, -4.0, 1.0]])]
    for weight in cases:
        what = (f"two_four_mask({weight.tolist()})" if weight.numel() <= 24 else
                f"two_four_mask(weight of shape {tuple(weight.shape)}, {weight.dtype}"
                f"{'' if weight.is_contiguous() else ', transposed'})")
        _expect_two_four(_as_bool_mask(_call(lambda w, _: two_four_mask(w), weight, None, what), weight, what),
                         weight, what)
    passed("two_four_mask")
