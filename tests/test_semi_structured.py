"""2:4 (N:M) semi-structured masks: the pattern, ties, torch.ao's 2:4 sparsifier, storage, bad input."""
import copy

import pytest
import torch
from torch import nn

from course_lib.compression import pruning
from course_lib.compression.semi_structured import (
    eligible_layers,
    is_nm_sparse,
    nm_mask,
    semi_structured_prune,
    storage_bytes,
)
from course_lib.models import LeNet5, LeNet300


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("n, m", [(2, 4), (1, 4), (1, 2), (4, 8), (3, 4)])
def test_keeps_exactly_n_of_every_m_and_the_largest(n, m):
    w = _randn(12, 8 * m)
    mask = nm_mask(w, n, m)
    assert mask.dtype == torch.bool and mask.shape == w.shape
    groups, kept = w.abs().reshape(-1, m), mask.reshape(-1, m)
    assert kept.sum(dim=1).eq(n).all()
    smallest_kept = groups.masked_fill(~kept, float("inf")).min(dim=1).values
    largest_dropped = groups.masked_fill(kept, -1.0).max(dim=1).values
    assert (smallest_kept > largest_dropped).all()
    assert is_nm_sparse(w * mask, n, m) and not is_nm_sparse(w, n, m)


def test_agrees_with_torch_ao_2_4_sparsifier():
    from torch.ao.pruning import WeightNormSparsifier

    model = nn.Sequential(nn.Linear(64, 24), nn.ReLU(), nn.Linear(24, 8))
    ours = {name: nm_mask(model[int(name)].weight) for name in ("0", "2")}
    sparsifier = WeightNormSparsifier(sparsity_level=1.0, sparse_block_shape=(1, 4), zeros_per_block=2)
    sparsifier.prepare(model, [{"tensor_fqn": "0.weight"}, {"tensor_fqn": "2.weight"}])
    sparsifier.step()
    for name, mask in ours.items():
        assert torch.equal(model[int(name)].parametrizations.weight[0].mask, mask)


def test_ties_go_to_the_lower_index():
    assert nm_mask(torch.ones(3, 16)).reshape(-1, 4).eq(torch.tensor([True, True, False, False])).all()
    w = torch.tensor([[1.0, -2.0, 2.0, 2.0, -3.0, 3.0, 3.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
    assert nm_mask(w).tolist() == [[False, True, True, False, True, True, False, False, True, True, False, False]]
    assert nm_mask(w.half()).tolist() == nm_mask(w).tolist()


def test_conv_groups_run_over_flattened_inputs_and_model_masks_hold():
    conv = nn.Conv2d(4, 6, 3)                               # 4 * 3 * 3 = 36 inputs per filter
    mask = nm_mask(conv.weight)
    assert mask.shape == conv.weight.shape and mask.reshape(6, -1).reshape(-1, 4).sum(1).eq(2).all()
    assert list(eligible_layers(LeNet5())) == [n for n, mod in LeNet5().named_modules()
                                               if isinstance(mod, (nn.Linear, nn.Conv2d))
                                               and mod.weight[0].numel() % 4 == 0]
    model = LeNet300()
    masks = semi_structured_prune(model)
    assert set(masks) == {"fc1", "fc2", "fc3"} and masks["fc1"].dtype == torch.float32
    assert all(is_nm_sparse(model.get_submodule(n).weight) for n in masks)
    assert abs(pruning.sparsity(model)["total"] - 0.5) < 1e-9
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    loader = [(x, y)] * 3
    pruning.masked_fit(model, masks, loader, epochs=1, lr=1e-2, log=None, progress=False)
    assert all(is_nm_sparse(model.get_submodule(n).weight) for n in masks)


def test_storage_is_counted_exactly():
    w = _randn(300, 784)
    s = storage_bytes(w)                                    # fp16 values
    kept = w.numel() // 2
    assert s["dense"] == 2 * w.numel()
    assert s["nm_values"] == 2 * kept and s["nm_metadata"] == kept * 2 // 8 and s["nm"] == s["nm_values"] + s["nm_metadata"]
    assert s["csr"] == kept * (2 + 4) + (300 + 1) * 4
    assert s["bitmask"] == 2 * kept + w.numel() // 8
    assert s["nm"] / s["dense"] == 0.5625                   # 36 bits per 4 weights instead of 64
    s32 = storage_bytes(w, value_bits=32)
    assert s32["dense"] == 4 * w.numel() and s32["nm_values"] == 4 * kept
    assert storage_bytes(_randn(4, 8), n=1, m=8)["nm_metadata"] == 4 * 3 // 8 + 1   # 4 kept x 3 bits, rounded up


@pytest.mark.parametrize("call, error, words", [
    (lambda: nm_mask(torch.randn(4, 10)), ValueError, "multiple of m=4"),
    (lambda: nm_mask(torch.randn(4, 8), n=4, m=4), ValueError, "n must be smaller than m"),
    (lambda: nm_mask(torch.randn(4, 8), n=0), ValueError, "n"),
    (lambda: nm_mask(torch.ones(4, 8, dtype=torch.int64)), TypeError, "floating-point"),
    (lambda: nm_mask([[1.0] * 4]), TypeError, "floating-point"),
    (lambda: nm_mask(torch.tensor([[1.0, float("nan"), 0.0, 2.0]])), ValueError, "finite"),
    (lambda: storage_bytes(torch.randn(4, 8), value_bits=8), ValueError, "value_bits must be one of"),
    (lambda: semi_structured_prune(LeNet5(), layers=["conv1"]), ValueError, "multiple of m=4"),
])
def test_bad_input_names_the_argument(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_pruning_a_copy_leaves_the_original():
    model = LeNet300()
    before = copy.deepcopy(model.state_dict())
    masks = semi_structured_prune(copy.deepcopy(model))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and masks
