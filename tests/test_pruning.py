"""course_lib.compression.pruning and .structured against torch.nn.utils.prune, and what pruned models compute."""
import copy
import math

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

from course_lib.compression import pruning as P
from course_lib.compression import structured as S
from course_lib.compression.measure import csr_model_bytes
from course_lib.data import TensorLoader
from course_lib.models import LeNet5, LeNet300, Net
from test_train import blobs

def holder(weight):
    m = nn.Module()
    m.weight = nn.Parameter(weight.clone())
    return m


def torch_l1(weight, amount):
    m = holder(weight)
    prune.l1_unstructured(m, "weight", amount)
    return m.weight_mask


def torch_ln(weight, amount, n, dim):
    m = holder(weight)
    prune.ln_structured(m, "weight", amount, n=n, dim=dim)
    return m.weight_mask


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def tied(*shape, seed=0):
    """Weights drawn from five values and their negatives: many ties in |w|."""
    values = torch.tensor([0.5, 1.0, 1.0, 2.0, 3.0])
    g = torch.Generator().manual_seed(seed)
    w = values[torch.randint(0, 5, shape, generator=g)]
    return w * (torch.randint(0, 2, shape, generator=g) * 2 - 1)


@pytest.mark.parametrize("shape", [(300, 784), (20, 1, 5, 5), (10,), (7, 3)])
@pytest.mark.parametrize("amount", [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99])
@pytest.mark.parametrize("make", [randn, tied])
def test_magnitude_mask_equals_l1_unstructured_ties_included(shape, amount, make):
    w = make(*shape)
    mask = P.magnitude_mask(w, amount)
    assert mask.dtype == w.dtype and mask.shape == w.shape
    assert torch.equal(mask, torch_l1(w, amount))
    assert int((mask == 0).sum()) == round(amount * w.numel())   # exactly k, even with ties


def test_a_threshold_would_prune_every_tie_the_mask_prunes_exactly_k():
    w = torch.tensor([1.0, -1.0, 1.0, 2.0, -1.0, 3.0])
    mask = P.magnitude_mask(w, 0.5)
    assert int((mask == 0).sum()) == 3
    kth = w.abs().kthvalue(3).values
    assert int((w.abs() <= kth).sum()) == 4   # the threshold rule would prune 4


@pytest.mark.parametrize("amount,numel,want", [(0.25, 10, 2), (0.75, 10, 8), (0.35, 10, 4), (0.125, 20, 2),
                                               (0.3, 7, 2), (0.5, 1, 0), (0.9, 1, 1)])
def test_rounding_rule_is_pythons_round_like_torch(amount, numel, want):
    assert P.n_to_prune(amount, numel) == want
    assert int((torch_l1(randn(numel), amount) == 0).sum()) == want


@pytest.mark.parametrize("amount", [0.2, 0.5, 0.9])
@pytest.mark.parametrize("make", [randn, tied])
def test_global_masks_equal_global_unstructured(amount, make):
    model = LeNet300()
    with torch.no_grad():
        for i, layer in enumerate((model.fc1, model.fc2, model.fc3)):
            layer.weight.copy_(make(*layer.weight.shape, seed=i) * (i + 1))
    weights = {n: getattr(model, n).weight.detach().clone() for n in ("fc1", "fc2", "fc3")}
    ours = P.global_magnitude_masks(weights, amount)
    as_list = P.global_magnitude_masks(list(weights.values()), amount)
    prune.global_unstructured([(getattr(model, n), "weight") for n in weights], prune.L1Unstructured, amount=amount)
    for i, name in enumerate(weights):
        theirs = getattr(model, name).weight_mask
        assert torch.equal(ours[name], theirs) and torch.equal(as_list[i], theirs)
    fractions = [float((m == 0).float().mean()) for m in ours.values()]
    assert fractions[0] > fractions[2]   # the layer of small weights loses more than `amount`


@pytest.mark.parametrize("n", [1, 2, math.inf])
@pytest.mark.parametrize("shape,dim", [((300, 784), 0), ((50, 20, 5, 5), 0), ((50, 20, 5, 5), 1), ((30, 12), -1)])
@pytest.mark.parametrize("make", [randn, tied])
def test_channel_mask_equals_ln_structured(n, shape, dim, make):
    w = make(*shape)
    for amount in (0.0, 0.3, 0.5, 0.75):
        assert torch.equal(S.channel_mask(w, amount, n, dim), torch_ln(w, amount, n, dim))


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan"), True, "0.5", None])
def test_bad_amount_is_refused_with_the_allowed_range(bad):
    with pytest.raises(ValueError, match=r"amount must be a fraction in \[0, 1\)"):
        P.magnitude_mask(randn(4, 4), bad)
    with pytest.raises(ValueError, match="amount"):
        P.magnitude_prune(LeNet300(), bad)
    with pytest.raises(ValueError, match="amount"):
        S.prune_structured(LeNet300(), bad)


def test_bad_arguments_name_the_argument_and_allowed_values():
    with pytest.raises(ValueError, match="no prunable layers.*nn.Linear and nn.Conv2d"):
        P.magnitude_prune(nn.Sequential(nn.ReLU(), nn.Flatten()), 0.5)
    with pytest.raises(ValueError, match=r"layers must name prunable layers.*\['fc1', 'fc2', 'fc3'\]"):
        P.magnitude_prune(LeNet300(), 0.5, layers=["fc1", "conv9"])
    with pytest.raises(ValueError, match=r"dim must be an int in -2\.\.1 "):
        S.channel_mask(randn(5, 4), 0.5, dim=2)
    with pytest.raises(ValueError, match=r"dim must be an int in -4\.\.3 "):
        S.channel_mask(randn(5, 4, 3, 3), 0.5, dim=-5)
    with pytest.raises(ValueError, match="at least 2 dims"):
        S.channel_mask(randn(5), 0.5)
    with pytest.raises(ValueError, match="n .* must be a number > 0"):
        S.channel_mask(randn(5, 4), 0.5, n=0)
    with pytest.raises(ValueError, match="scope must be one of"):
        P.magnitude_prune(LeNet300(), 0.5, scope="model")
    with pytest.raises(TypeError, match="weight must be a floating-point torch.Tensor"):
        P.magnitude_mask([1.0, 2.0], 0.5)
    with pytest.raises(ValueError, match="non-decreasing"):
        P.iterative_prune(LeNet300(), [0.9, 0.5], [], [])
    with pytest.raises(ValueError, match="do not connect"):
        S.prune_structured(LeNet300(), 0.5, layers=["fc1", "fc3"])
    with pytest.raises(ValueError, match="at least two connected layers"):
        S.prune_structured(LeNet300(), 0.5, layers=["fc1"])
    with pytest.raises(ValueError, match="would remove all 1 units"):
        S.prune_structured(nn.Sequential(nn.Linear(4, 1), nn.Linear(1, 2)), 0.9)


@pytest.mark.parametrize("scope", P.SCOPES)
def test_magnitude_prune_zeroes_weights_in_place_and_sparsity_counts_them(scope):
    model = LeNet300()
    biases = [m.bias.detach().clone() for m in (model.fc1, model.fc2, model.fc3)]
    masks = P.magnitude_prune(model, 0.8, scope)
    s = P.sparsity(model)
    assert s["total"] == pytest.approx(0.8, abs=1e-5)
    if scope == "layer":
        assert all(s[n] == pytest.approx(0.8, abs=1e-3) for n in ("fc1", "fc2", "fc3"))
    for name, mask in masks.items():
        assert torch.equal(getattr(model, name).weight == 0, mask == 0)
    assert all(torch.equal(b, m.bias) for b, m in zip(biases, (model.fc1, model.fc2, model.fc3)))


def loaders():
    x, y = blobs()
    return TensorLoader(x, y, batch_size=64, seed=0), TensorLoader(x, y, batch_size=256, shuffle=False)


def test_masked_fit_keeps_pruned_weights_at_zero_and_plain_fit_does_not():
    from course_lib.loop import fit

    train, val = loaders()
    torch.manual_seed(0)
    model = LeNet300()
    masks = P.magnitude_prune(model, 0.9)
    plain = copy.deepcopy(model)
    history = P.masked_fit(model, masks, train, val, epochs=2, lr=1e-2, progress=False, log=None)
    assert P.sparsity(model)["total"] == pytest.approx(0.9, abs=1e-5)
    assert history.val_accuracy[-1] > 0.5
    fit(plain, train, val, epochs=2, lr=1e-2, progress=False, log=None)
    assert P.sparsity(plain)["total"] < 0.01   # Adam moves every pruned weight off zero


def test_iterative_prune_rounds_and_nested_masks():
    train, val = loaders()
    torch.manual_seed(0)
    model = LeNet300()
    rounds, masks = P.iterative_prune(model, [0.5, 0.8, 0.9], train, val, scope="global",
                                      epochs=2, lr=1e-2, progress=False, log=None)
    assert [r["target"] for r in rounds] == [0.5, 0.8, 0.9]
    assert [r["sparsity"] for r in rounds] == pytest.approx([0.5, 0.8, 0.9], abs=1e-5)
    assert all(0 <= r["accuracy_pruned"] <= 1 and 0 <= r["accuracy"] <= 1 for r in rounds)
    assert rounds[-1]["accuracy"] > 0.5
    for name, mask in masks.items():
        assert torch.equal(getattr(model, name).weight == 0, mask == 0)


def test_sensitivity_scan_restores_the_model():
    _, val = loaders()
    torch.manual_seed(0)
    model = LeNet300()
    before = copy.deepcopy(model.state_dict())
    scan = P.sensitivity_scan(model, val, [0.0, 0.5, 0.99], layers=["fc1", "fc3"])
    assert list(scan) == ["fc1", "fc3"] and all(len(v) == 3 for v in scan.values())
    assert scan["fc1"][0] == scan["fc3"][0]                  # amount 0 is the unpruned model
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def masked_copy(model, amount, names):
    """The original with the pruned units' weight rows and biases zeroed (ln_structured, dim 0)."""
    masked = copy.deepcopy(model)
    with torch.no_grad():
        for name in names:
            layer = masked.get_submodule(name)
            mask = torch_ln(layer.weight.detach(), amount, 2, 0)
            layer.weight.mul_(mask)
            layer.bias.mul_(mask.flatten(1)[:, 0])
    return masked


@pytest.mark.parametrize("make,chain,shapes", [
    (LeNet300, None, {"fc1": (150, 784), "fc2": (50, 150), "fc3": (10, 50)}),
    (LeNet5, None, {"conv1": (10, 1, 5, 5), "conv2": (25, 10, 5, 5), "fc1": (250, 400), "fc2": (10, 250)}),
    (Net, None, {"conv1": (5, 1, 5, 5), "conv2": (10, 5, 5, 5), "fc1": (25, 160), "fc2": (10, 25)}),
    (LeNet5, ["conv1", "conv2"], {"conv1": (10, 1, 5, 5), "conv2": (50, 10, 5, 5), "fc1": (500, 800)}),
])
def test_prune_structured_shrinks_layers_and_equals_the_masked_model(make, chain, shapes):
    torch.manual_seed(0)
    model = make().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))   # biases not all tiny
    original = copy.deepcopy(model.state_dict())
    small = S.prune_structured(model, 0.5, layers=chain).eval()
    for name, shape in shapes.items():
        assert tuple(small.get_submodule(name).weight.shape) == shape
    names = list(P.prunable_layers(model, chain))[:-1]
    x = randn(8, 1, 28, 28, seed=3)
    torch.testing.assert_close(small(x), masked_copy(model, 0.5, names)(x), atol=1e-5, rtol=1e-4)
    assert all(torch.equal(original[k], v) for k, v in model.state_dict().items())   # original untouched
    kept = S.keep_channels(model.get_submodule(names[0]).weight, 0.5)
    assert kept.tolist() == torch_ln(model.get_submodule(names[0]).weight.detach(), 0.5, 2, 0).flatten(1)[:, 0] \
        .nonzero().flatten().tolist()


def test_csr_model_computes_the_same_and_stores_less_when_sparse():
    torch.manual_seed(0)
    model = LeNet300().eval()
    P.magnitude_prune(model, 0.9)
    sparse = P.csr_linear_model(model)
    assert isinstance(sparse.fc1, P.CSRLinear) and sparse.fc1.weight.layout == torch.sparse_csr
    x = randn(16, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(sparse(x), model(x), atol=1e-5, rtol=1e-4)
    dense_bytes = sum(p.nbytes for p in model.parameters())
    assert csr_model_bytes(model) < 0.25 * dense_bytes
    with pytest.raises(ValueError, match="no nn.Linear"):
        P.csr_linear_model(nn.Sequential(nn.Conv2d(1, 2, 3)))


@pytest.mark.parametrize("amount", [0.25, 0.35, 0.4, 0.75])
def test_lecture_12_tied_example_matches_torch_at_every_amount(amount):
    tiny = torch.tensor([0.3, -1.0, 1.0, 2.0, -1.0, 3.0, 1.0, -0.2, 1.0, 4.0])
    mask = P.magnitude_mask(tiny, amount)
    assert int((mask == 0).sum()) == round(amount * 10) and torch.equal(mask, torch_l1(tiny, amount))
    fourth_smallest = tiny.abs().kthvalue(4).values
    assert int((tiny.abs() <= fourth_smallest).sum()) == 7   # a threshold at amount 0.4 would prune 7, not 4


def test_structured_lenet5_half_has_the_expected_channel_counts():
    from course_lib.models import LeNet5
    half = S.prune_structured(LeNet5().eval(), 0.5)
    assert half.conv2.in_channels == half.conv1.out_channels == 10
    assert half.fc1.in_features == 25 * 4 * 4              # 25 channels of 4x4 after conv2 + pool
