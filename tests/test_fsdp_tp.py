"""2-D parallelism (course_lib.distributed.fsdp_tp): TP inside the ViT's blocks, FSDP over dp, against one process.

The reference is the same ViT trained whole in one process on the dp batches concatenated; bytes per rank
against the formula computed from the plain model's shapes; collectives counted by torch's CommDebugMode.
"""
import pytest
import torch

from course_lib.distributed import fsdp_tp
from course_lib.distributed.sharding import shard_units
from course_lib.models import Net
from course_lib.vit import ViT


@pytest.fixture(scope="module")
def four_ranks():
    return fsdp_tp.compare_fsdp_tp(world_size=4, tp=2, steps=2, timeout=240)


@pytest.mark.slow     # 4 gloo ranks (or a training run): tens of CPU-seconds
def test_two_d_training_equals_one_process_on_the_concatenated_batches(four_ranks):
    out = four_ranks
    assert (out["world_size"], out["dp"], out["tp"], out["steps"]) == (4, 2, 2, 2)
    assert out["loss_diff"] < 1e-5 and out["grad_diff"] < 1e-5
    # Adam divides by sqrt(v): the k bias's gradient, 0 but for rounding (softmax ignores it), moves by up to lr
    assert out["weight_diff"] < 1e-3


@pytest.mark.slow     # 4 gloo ranks (or a training run): tens of CPU-seconds
def test_every_rank_holds_what_the_formula_says(four_ranks):
    out = four_ranks
    assert out["parameter_bytes"] == out["formula_exact"]               # per rank, torch.chunk's pieces
    assert sum(out["parameter_bytes"]) / 4 == out["formula_even"]       # 4·P_split/(dp·tp) + 4·P_rep/dp, the mean
    assert out["formula_even"] == 4 * (198_400 / 4 + 6_538 / 2)
    assert out["grad_bytes"] == out["parameter_bytes"]
    # Adam: exp_avg and exp_avg_sq shaped like the shards, plus a 4-byte step per parameter tensor
    assert out["optimizer_bytes"] == [2 * p + 4 * out["parameter_tensors"] for p in out["parameter_bytes"]]
    # the ranks of one tp group hold the same amount; dp rank 0 also holds the [1,16,64] position embedding
    p = out["parameter_bytes"]
    assert p[0] == p[1] and p[2] == p[3] and p[0] - p[2] == 16 * 64 * 4


@pytest.mark.slow     # 4 gloo ranks (or a training run): tens of CPU-seconds
def test_collectives_per_step_fsdp_over_dp_and_tp_inside_blocks(four_ranks):
    units = len(shard_units(ViT())) + 1                  # embed, 4 blocks, norm, head + the root (position)
    assert units == 8
    calls = four_ranks["collectives"]
    assert calls["all_reduce"] == 4 * 4                  # per block 2 in forward (proj, fc2), 2 in backward
    assert calls["reduce_scatter"] == units              # one gradient reduce-scatter per fully_shard
    assert calls["all_gather"] == 2 * units - 1          # forward, then again in backward but the root's


def test_the_split_parameters_are_the_plan_s_column_and_row_weights():
    vit = ViT()
    names = fsdp_tp.tp_split_names(vit)
    assert "blocks.0.attn.q.bias" in names and "blocks.3.mlp.fc2.weight" in names
    assert "blocks.0.attn.proj.bias" not in names and "blocks.0.norm1.weight" not in names and "pos" not in names
    # per block: q, k, v 64x64 + 64 each, proj 64x64, fc1 256x64 + 256, fc2 64x256 (hand count)
    assert sum(p.numel() for n, p in vit.named_parameters() if n in names) == 4 * (3 * 4160 + 4096 + 16640 + 16384)
    one = fsdp_tp.expected_parameter_bytes(vit, 0, 1, 1)
    assert one["exact"] == one["even"] == 4 * 204_938            # one rank holds everything


def test_bad_tp_is_refused_by_name():
    with pytest.raises(ValueError, match="--tp 3 must divide the world size 4"):
        fsdp_tp.check_tp(3, 4)
    with pytest.raises(ValueError, match="--tp: only --model vit has a tensor-parallel plan; got Net"):
        fsdp_tp.check_tp(2, 4, Net())
    with pytest.raises(ValueError, match="--tp 4 must divide the ViT's 2 heads"):
        fsdp_tp.check_tp(4, 4, ViT(heads=2))
    with pytest.raises(ValueError, match="--tp must be a positive int; got 0"):
        fsdp_tp.check_tp(0, 4)
    assert fsdp_tp.check_tp(2, 4, ViT()) == 2
    with pytest.raises(ValueError, match="--tp 3 must divide"):
        fsdp_tp.compare_fsdp_tp(world_size=4, tp=3)       # refused before any process starts


def test_chunk_is_torch_chunk():
    for n in (1, 5, 10, 64):
        for parts in (1, 2, 3, 4):
            sizes = [len(c) for c in torch.arange(n).chunk(parts)]
            sizes += [0] * (parts - len(sizes))
            assert [fsdp_tp._chunk(n, i, parts) for i in range(parts)] == sizes
