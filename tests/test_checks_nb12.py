"""The lecture-12 checks pass the reference solutions and fail stubs and plausible wrong answers."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from nbtools import ROOT, notebook_namespace
from torch import nn
from torch.nn.utils import prune

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


def view_of_ones_like(weight, amount):            # ones_like keeps a transposed weight's strides: view(-1) fails
    mask = torch.ones_like(weight)
    k = round(amount * weight.numel())
    if k:
        mask.view(-1)[torch.topk(weight.abs().flatten(), k, largest=False).indices] = 0
    return mask


def with_torch_prune(weight, amount):              # the library call the exercise asks to write
    holder = nn.Module()
    holder.weight = nn.Parameter(weight.contiguous())
    return prune.l1_unstructured(holder, "weight", amount).weight_mask


def strict_threshold(weight, amount):              # |w| < the (k+1)-th smallest pruned: on ties at the cut, too few
    k = round(amount * weight.numel())
    if k == weight.numel():
        return torch.zeros_like(weight)
    return (weight.abs() >= weight.abs().flatten().kthvalue(k + 1).values).to(weight.dtype)


@pytest.mark.parametrize("wrong, hint", [
    (kth_strict, "the k-th smallest .* was kept"), (kth_without_zero_case, "nothing is pruned"),
    (sorted_index_off_by_one, "\\(k\\+1\\)-th smallest .* was pruned too"), (per_row, "larger in magnitude"),
    (abs_in_place, "changed the weights"), (floors_the_count, "that is int\\(\\) of .* round\\(\\)"),
    (threshold_prunes_ties, "tie at the cut, .* all of them were pruned"),
    (rounds_half_up, "that is math.ceil\\(\\) or floor\\(x \\+ 0.5\\) of 2.5"),
    (prunes_the_largest, "larger in magnitude.*you pruned the LARGEST"),
    (uses_signed_values, "larger in magnitude.*SIGNED"), (returns_the_kept_as_zeros, "you pruned the LARGEST"),
    (lambda w, a: NS["magnitude_mask"](w, a).bool(), "the mask is torch.bool; it must have the weight's dtype"),
    (lambda w, a: NS["magnitude_mask"](w, a).float(), "the mask is torch.float32; .* dtype torch.float64"),
    (view_of_ones_like, "transposed view"), (with_torch_prune, "uses l1_unstructured"),
])
def test_magnitude_mask_messages(wrong, hint):
    with pytest.raises(AssertionError, match=f"(?s){hint}"):
        check_magnitude_mask(wrong)


def test_a_strict_threshold_is_caught_at_ties():
    """Right without ties, too few pruned where weights tie at the cut."""
    with pytest.raises(AssertionError, match="tie at the cut, .* none of them was pruned"):
        check_magnitude_mask(strict_threshold)


def test_a_sort_based_mask_also_passes():
    def by_argsort(weight, amount):                # other ties: the last of the tied go (a descending sort)
        k = round(amount * weight.numel())
        mask = torch.zeros(weight.numel(), dtype=weight.dtype)
        mask[weight.abs().flatten().argsort(descending=True, stable=True)[:weight.numel() - k]] = 1
        return mask.reshape(weight.shape)

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


def neurons_by_library(weight, amount):
    holder = nn.Module()
    holder.weight = nn.Parameter(weight.clone())
    prune.ln_structured(holder, "weight", amount, n=2, dim=0)
    return holder.weight_mask.any(dim=1).nonzero().flatten().tolist()


@pytest.mark.parametrize("wrong, hint", [
    (keep_by((1, 1)), "largest L1 norm"), (keep_by((0, 2)), "outside range"),
    (keep_by((1, 2), smallest=True), "SMALLEST L2 norm"), (keep_by((1, 2), pruned=True), "these are the rows that go"),
    (keep_by((1, 2), amount_rule=math.floor), "you remove int\\(\\) of"),
    (keep_by((1, 2), amount_rule=math.ceil), "you remove math.ceil\\(\\) or floor\\(x \\+ 0.5\\) of 2.5 rows"),
    (keep_by((1, 2), unsorted=True), "increasing order"),
    (lambda w, a: [float(i) for i in NS["neurons_to_keep"](w, a)], "list of ints"),
    (lambda w, a: torch.tensor(NS["neurons_to_keep"](w, a), dtype=torch.float32), "1-D integer tensor"),
    (lambda w, a: keep_by((1, float("inf")))(w, a), "largest entry"),
    (neurons_by_library, "uses ln_structured"),
])
def test_neurons_to_keep_messages(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_neurons_to_keep(wrong)


def test_other_right_answers_pass():
    def global_by_threshold_index(weights, amount):      # one argsort over everything, then split
        flat = torch.cat([w.flatten() for w in weights]).abs()
        mask = torch.ones_like(flat)
        mask[flat.argsort()[:round(amount * len(flat))]] = 0
        return [m.reshape(w.shape) for m, w in zip(mask.split([w.numel() for w in weights]), weights)]

    def keep_by_linalg(weight, amount):            # a 1-D integer tensor; ties: the later rows first
        norms = torch.linalg.vector_norm(weight, dim=1)
        keep = weight.shape[0] - round(amount * weight.shape[0])
        return norms.flip(0).argsort(descending=True, stable=True)[:keep].mul(-1).add(len(norms) - 1).sort().values

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


def two_four_floats(weight):                       # the right entries as 0/1 floats: the text asks for bool
    return NS["two_four_mask"](weight).float()


def two_four_library(weight):
    from course_lib.compression.semi_structured import nm_mask
    return nm_mask(weight, 2, 4)


def abs_in_place_24(weight):
    return NS["two_four_mask"](weight.abs_())


@pytest.mark.parametrize("wrong, message", [
    (keeps_the_smallest, "smallest"),
    (groups_down_columns, "down the columns"),
    (strided_groups, "consecutive"),
    (per_row_half, "unstructured pruning per row"),
    (threshold_keeps_ties, r"ties at the 2nd largest, keep \[3\] weights: every weight tied at the cut stayed"),
    (strict_threshold_drops_ties, r"ties at the 2nd largest, keep \[1\] weights: every weight tied at the cut went"),
    (signed_values, "magnitude, not signed"),
    (float_kept_as_zeros, "return a boolean tensor"), (two_four_floats, "the mask is torch.float32"),
    (lambda w: ~NS["two_four_mask"](w), "smallest"), (two_four_library, "uses nm_mask"),
    (abs_in_place_24, "changed the weights"),
])
def test_wrong_two_four_masks_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_two_four_mask(wrong)


def test_other_two_four_masks_pass():
    def by_sort(weight):                           # stable sort, ranks compared: ties to the lower index
        groups = weight.abs().reshape(weight.shape[0], -1, 4)
        order = groups.argsort(dim=-1, descending=True, stable=True)
        ranks = order.argsort(dim=-1)
        return (ranks < 2).reshape(weight.shape)

    def ties_to_the_higher_index(weight):          # another tie rule: the text allows any
        flipped = weight.abs().reshape(-1, 4).flip(1)
        keep = torch.zeros_like(flipped, dtype=torch.bool).scatter_(
            1, flipped.argsort(dim=1, descending=True, stable=True)[:, :2], True)
        return keep.flip(1).reshape(weight.shape)

    check_two_four_mask(by_sort)
    check_two_four_mask(ties_to_the_higher_index)


# --- drawn inputs ---------------------------------------------------------------------------------

from course_lib.checks.nb12 import _expect_global_masks, _expect_magnitude_mask, _expect_two_four  # noqa: E402


@st.composite
def weights(draw, shape=None):
    """A weight of drawn shape and dtype: random normal values, or few distinct magnitudes (many ties)."""
    shape = shape or draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    w = torch.randn(shape, generator=g)
    if draw(st.booleans()):                        # ties: magnitudes from {0, 0.5, 1, 2}, random signs
        w = torch.tensor([0.0, 0.5, 1.0, 2.0])[torch.randint(0, 4, shape, generator=g)] * w.sign()
    return w.to(dtype)


AMOUNTS = st.floats(0.0, 0.99)


@settings(max_examples=80)
@given(weights(), AMOUNTS)
def test_magnitude_mask_on_drawn_weights(weight, amount):
    """The solution passes the check's own rules; its count is torch's, ties or not."""
    mask = NS["magnitude_mask"](weight, amount)
    _expect_magnitude_mask(mask, weight, amount, "drawn")
    assert int((mask == 0).sum()) == int((prune_mask(weight, amount) == 0).sum())


def prune_mask(weight, amount):
    holder = nn.Module()
    holder.weight = nn.Parameter(weight.contiguous().clone())
    return prune.l1_unstructured(holder, "weight", amount).weight_mask


@settings(max_examples=60)
@given(weights(), AMOUNTS)
def test_a_threshold_fails_exactly_where_weights_tie_at_the_cut(weight, amount):
    k = round(amount * weight.numel())
    order = weight.abs().flatten().sort().values
    tie_at_cut = 0 < k < weight.numel() and order[k - 1] == order[k]
    try:
        _expect_magnitude_mask(threshold_prunes_ties(weight, amount), weight, amount, "drawn")
        caught = False
    except AssertionError as e:
        caught = "tie at the cut" in str(e)
    assert caught == tie_at_cut


@settings(max_examples=60)
@given(st.lists(weights(), min_size=1, max_size=3), AMOUNTS)
def test_global_masks_on_drawn_weights(ws, amount):
    ws = [w.float() for w in ws]                   # one dtype for all, as global_unstructured needs
    _expect_global_masks(NS["global_masks"](ws, amount), ws, amount, "drawn")


@settings(max_examples=60)
@given(st.integers(1, 12), st.integers(1, 6), st.integers(0, 2**16), AMOUNTS)
def test_neurons_to_keep_is_ln_structured(rows, cols, seed, amount):
    weight = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    assert NS["neurons_to_keep"](weight, amount) == neurons_by_library(weight, amount)


@settings(max_examples=60)
@given(st.integers(1, 5).flatmap(lambda r: st.integers(1, 4).flatmap(lambda c: weights(shape=[r, 4 * c]))))
def test_two_four_mask_on_drawn_weights(weight):
    """The solution passes the check's rules on any weight, ties included; a threshold fails where a group ties."""
    _expect_two_four(NS["two_four_mask"](weight), weight, "drawn")
    top = weight.abs().float().reshape(-1, 4).sort(dim=1, descending=True).values
    if bool((top[:, 1] == top[:, 2]).any()):
        with pytest.raises(AssertionError, match="ties at the 2nd largest"):
            _expect_two_four(threshold_keeps_ties(weight), weight, "drawn")
