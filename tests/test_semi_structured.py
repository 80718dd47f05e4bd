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


def reference_conv_mask(weight):
    """ASP's 2:4 grouping for a conv, written out: at each (o, kh, kw), input channels 4g..4g+3 keep their 2 largest."""
    out, c_in, kh, kw = weight.shape
    mask = torch.zeros(weight.shape, dtype=torch.bool)
    for o in range(out):
        for i in range(kh):
            for j in range(kw):
                for g in range(0, c_in, 4):
                    group = weight[o, g:g + 4, i, j].abs().tolist()
                    for k in sorted(range(4), key=lambda k: (-group[k], k))[:2]:
                        mask[o, g + k, i, j] = True
    return mask


def test_conv_groups_run_along_input_channels_at_each_tap():
    conv = nn.Conv2d(8, 6, 3)                               # c_in = 8: two groups of 4 channels per (o, kh, kw)
    mask = nm_mask(conv.weight)
    assert mask.shape == conv.weight.shape and torch.equal(mask, reference_conv_mask(conv.weight.detach()))
    assert mask.reshape(6, 2, 4, 3, 3).sum(2).eq(2).all()   # every group of 4 channels at every tap keeps 2
    flat = conv.weight.detach().flatten(1)                  # grouping PyTorch's memory order instead: not this
    assert not torch.equal(mask, nm_mask(flat).reshape(mask.shape))
    assert is_nm_sparse(conv.weight * mask) and not is_nm_sparse(conv.weight)
    w1d = torch.randn(5, 8, 3)                              # Conv1d [out, c_in, k]: groups along c_in too
    assert torch.equal(nm_mask(w1d), nm_mask(w1d.unsqueeze(-1)).squeeze(-1))
    with pytest.raises(ValueError, match="in_channels for a conv"):
        nm_mask(nn.Conv2d(6, 4, 2).weight)                  # 6 channels: not whole groups of 4 (24 inputs would be)


def test_eligible_layers_and_model_masks_hold():
    assert list(eligible_layers(LeNet5())) == [n for n, mod in LeNet5().named_modules()
                                               if isinstance(mod, (nn.Linear, nn.Conv2d))
                                               and mod.weight.shape[1] % 4 == 0]
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
