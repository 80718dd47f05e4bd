"""The lecture-12 checks pass the reference solutions and fail stubs and plausible wrong answers."""
import math

import pytest
import torch

from course_lib.checks.nb12 import check_global_masks, check_magnitude_mask, check_neurons_to_keep
from nbtools import ROOT, notebook_namespace

NS = notebook_namespace(ROOT / "solutions" / "12_pruning_exercises.ipynb")


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_magnitude_mask(NS["magnitude_mask"])
    check_global_masks(NS["global_masks"])
    check_neurons_to_keep(NS["neurons_to_keep"])


@pytest.mark.parametrize("check", [check_magnitude_mask, check_global_masks, check_neurons_to_keep])
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
