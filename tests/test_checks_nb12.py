"""The lecture-12 checks pass the reference solutions and fail stubs and plausible wrong answers."""
import math

import pytest
import torch
from nbtools import ROOT, notebook_namespace

from course_lib.checks.nb12 import (
    check_global_masks,
    check_magnitude_mask,
    check_neurons_to_keep,
    check_two_four_mask,
)

NS = notebook_namespace(ROOT / "solutions" / "12_pruning_exercises.ipynb")


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_magnitude_mask(NS["magnitude_mask"])
    check_global_masks(NS["global_masks"])
    check_neurons_to_keep(NS["neurons_to_keep"])
    check_two_four_mask(NS["two_four_mask"])


@pytest.mark.parametrize("check", [check_magnitude_mask, check_global_masks, check_neurons_to_keep,
                                   check_two_four_mask])
def test_stubs_fail(check):
    with pytest.raises(NotImplementedError):
        check(stub)


# --- magnitude_mask ------------------------------------------------------------------------------

def mask_from(weight, scores, k, largest=False):
    mask = torch.ones_like(weight)
    if k:
        mask.view(-1)[torch.topk(scores.flatten(), k, largest=largest).indices] = 0
    return mask


def prunes_the_largest(weight, amount):
    return mask_from(weight, weight.abs(), round(amount * weight.numel()), largest=True)


def uses_signed_values(weight, amount):
    return mask_from(weight, weight, round(amount * weight.numel()))


def floors_the_count(weight, amount):
    return mask_from(weight, weight.abs(), int(amount * weight.numel()))


def rounds_half_up(weight, amount):
    return mask_from(weight, weight.abs(), math.floor(amount * weight.numel() + 0.5))


def threshold_prunes_ties(weight, amount):
    k = round(amount * weight.numel())
    if k == 0:
        return torch.ones_like(weight)
    cut = weight.abs().flatten().kthvalue(k).values
    return (weight.abs() > cut).to(weight.dtype)


def returns_the_kept_as_zeros(weight, amount):
    return 1 - NS["magnitude_mask"](weight, amount)


@pytest.mark.parametrize("wrong", [prunes_the_largest, uses_signed_values, floors_the_count, rounds_half_up,
                                   threshold_prunes_ties, returns_the_kept_as_zeros])
def test_wrong_magnitude_masks_fail(wrong):
    with pytest.raises(AssertionError):
        check_magnitude_mask(wrong)


def kth_strict(weight, amount):                   # |w| < k-th smallest: keeps the k-th (k - 1 pruned)
    k = round(amount * weight.numel())
    if k == 0:
        return torch.ones_like(weight)
    return (weight.abs() >= weight.abs().flatten().kthvalue(k).values).to(weight.dtype)


def kth_without_zero_case(weight, amount):        # kthvalue(0) raises
    cut = weight.abs().flatten().kthvalue(round(amount * weight.numel())).values
    return (weight.abs() > cut).to(weight.dtype)


def sorted_index_off_by_one(weight, amount):      # sorted[k] is the (k+1)-th smallest: one too many
    k = round(amount * weight.numel())
    values = weight.abs().flatten().sort().values
    if k == 0:
        return torch.ones_like(weight)
    return (weight.abs() > values[min(k, len(values) - 1)]).to(weight.dtype)


def per_row(weight, amount):                      # per channel: each row loses the same fraction
    if weight.dim() < 2:
        return NS["magnitude_mask"](weight, amount)
    rows = weight.reshape(weight.shape[0], -1)
    return torch.stack([NS["magnitude_mask"](r, amount) for r in rows]).view_as(weight)


def abs_in_place(weight, amount):                 # destroys the signs of the model's weights
    return NS["magnitude_mask"](weight.abs_(), amount)


@pytest.mark.parametrize("wrong, hint", [
    (kth_strict, "off by one"), (kth_without_zero_case, "nothing is pruned"),
    (sorted_index_off_by_one, "off by one"), (per_row, "larger in magnitude"), (abs_in_place, "changed the weights"),
    (floors_the_count, "round\\(\\)"), (threshold_prunes_ties, "tie at"),
])
def test_magnitude_mask_messages(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_magnitude_mask(wrong)


def test_a_sort_based_mask_also_passes():
    def by_argsort(weight, amount):
        k = round(amount * weight.numel())
        mask = torch.ones(weight.numel())
        mask[weight.abs().flatten().argsort(stable=True)[:k]] = 0
        return mask.view_as(weight)

    check_magnitude_mask(by_argsort)


# --- global_masks -------------------------------------------------------------------------------

def per_layer(weights, amount):
    return [NS["magnitude_mask"](w, amount) for w in weights]


def global_signed(weights, amount):
    flat = torch.cat([w.flatten() for w in weights])
    mask = uses_signed_values(flat, amount)
    return [m.view_as(w) for m, w in zip(mask.split([w.numel() for w in weights]), weights)]


def global_floor(weights, amount):
    flat = torch.cat([w.flatten() for w in weights])
    mask = floors_the_count(flat, amount)
    return [m.view_as(w) for m, w in zip(mask.split([w.numel() for w in weights]), weights)]


def one_flat_mask(weights, amount):
    flat = torch.cat([w.flatten() for w in weights])
    return NS["magnitude_mask"](flat, amount)


@pytest.mark.parametrize("wrong", [per_layer, global_signed, global_floor, one_flat_mask])
def test_wrong_global_masks_fail(wrong):
    with pytest.raises(AssertionError):
        check_global_masks(wrong)


# --- neurons_to_keep ----------------------------------------------------------------------------

def keep_by(norm_dim_p, amount_rule=round, smallest=False, unsorted=False, pruned=False):
    def neurons(weight, amount):
        dim, p = norm_dim_p
        norms = weight.norm(p=p, dim=dim)
        n = len(norms)
        keep = n - amount_rule(amount * n)
        order = torch.topk(norms, n, largest=not smallest).indices.tolist()
        chosen = order[keep:] if pruned else order[:keep]
        return chosen if unsorted else sorted(chosen)
    return neurons


@pytest.mark.parametrize("wrong", [
    keep_by((1, 1)),                          # L1 norm
    keep_by((0, 2)),                          # columns instead of rows
    keep_by((1, 2), smallest=True),           # keeps the weakest
    keep_by((1, 2), pruned=True),             # returns the removed neurons
    keep_by((1, 2), amount_rule=math.floor),  # floor instead of round
    keep_by((1, 2), unsorted=True),           # topk order, not increasing
])
def test_wrong_neurons_to_keep_fail(wrong):
    with pytest.raises(AssertionError):
        check_neurons_to_keep(wrong)


def global_in_place(weights, amount):
    for w in weights:
        w.abs_()
    return NS["global_masks"](weights, amount)


def global_kth_strict(weights, amount):
    flat = torch.cat([w.flatten() for w in weights])
    mask = kth_strict(flat, amount)
    return [m.view_as(w) for m, w in zip(mask.split([w.numel() for w in weights]), weights)]


@pytest.mark.parametrize("wrong, hint", [(global_in_place, "changed the weights"), (global_kth_strict, "pruned")])
def test_global_masks_messages(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_global_masks(wrong)


def test_other_right_answers_pass():
    def global_by_threshold_index(weights, amount):      # one argsort over everything, then split
        flat = torch.cat([w.flatten() for w in weights]).abs()
        mask = torch.ones_like(flat)
        mask[flat.argsort()[:round(amount * len(flat))]] = 0
        return [m.reshape(w.shape) for m, w in zip(mask.split([w.numel() for w in weights]), weights)]

    def keep_by_linalg(weight, amount):
        norms = torch.linalg.vector_norm(weight, dim=1)
        keep = weight.shape[0] - round(amount * weight.shape[0])
        return norms.argsort(descending=True)[:keep].sort().values

    check_global_masks(global_by_threshold_index)
    check_neurons_to_keep(keep_by_linalg)


# --- two_four_mask -----------------------------------------------------------------------------

def top2(scores, largest=True):
    """2 of every 4 consecutive along the last dim, by topk of `scores`."""
    groups = scores.reshape(-1, 4)
    keep = groups.topk(2, dim=1, largest=largest).indices
    return torch.zeros_like(groups, dtype=torch.bool).scatter_(1, keep, True).reshape(scores.shape)


def keeps_the_smallest(weight):
    return top2(weight.abs(), largest=False)


def signed_values(weight):
    return top2(weight)


def groups_down_columns(weight):                  # groups of 4 consecutive rows: the output dim
    return top2(weight.abs().t().contiguous()).t()


def strided_groups(weight):                        # reshape(rows, 4, -1): entries j, j + in/4, ...
    rows, cols = weight.shape
    scores = weight.abs().reshape(rows, 4, cols // 4).transpose(1, 2)
    return top2(scores.contiguous()).transpose(1, 2).reshape(rows, cols)


def per_row_half(weight):                          # unstructured within each row
    keep = weight.abs().topk(weight.shape[1] // 2, dim=1).indices
    return torch.zeros_like(weight, dtype=torch.bool).scatter_(1, keep, True)


def threshold_keeps_ties(weight):                  # |w| >= 2nd largest of the group: 3 or 4 on ties
    groups = weight.abs().reshape(-1, 4)
    second = groups.sort(dim=1, descending=True).values[:, 1:2]
    return (groups >= second).reshape(weight.shape)


def strict_threshold_drops_ties(weight):           # |w| > 3rd largest: 1 (or 0) on ties
    groups = weight.abs().reshape(-1, 4)
    third = groups.sort(dim=1, descending=True).values[:, 2:3]
    return (groups > third).reshape(weight.shape)


def float_kept_as_zeros(weight):
    return (~NS["two_four_mask"](weight)).float()


def abs_in_place_24(weight):
    return NS["two_four_mask"](weight.abs_())


@pytest.mark.parametrize("wrong, message", [
    (keeps_the_smallest, "smallest"),
    (groups_down_columns, "down the columns"),
    (strided_groups, "consecutive"),
    (per_row_half, "unstructured pruning per row"),
    (threshold_keeps_ties, r"tied magnitudes, groups .* keep \[4, 3, "),
    (strict_threshold_drops_ties, r"tied magnitudes, groups .* keep \[0, 1, "),
    (signed_values, "magnitude, not signed"),
    (float_kept_as_zeros, "smallest"),
    (abs_in_place_24, "changed the weights"),
])
def test_wrong_two_four_masks_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_two_four_mask(wrong)


def test_other_two_four_masks_pass():
    def by_sort(weight):                           # stable sort, ranks compared, 0/1 floats
        groups = weight.abs().reshape(weight.shape[0], -1, 4)
        order = groups.argsort(dim=-1, descending=True, stable=True)
        ranks = order.argsort(dim=-1)
        return (ranks < 2).float().reshape(weight.shape)

    def by_library(weight):
        from course_lib.compression.semi_structured import nm_mask
        return nm_mask(weight, 2, 4)

    check_two_four_mask(by_sort)
    check_two_four_mask(by_library)
