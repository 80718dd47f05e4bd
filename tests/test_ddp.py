"""DDP from scratch (flat and bucketed) against torch's DDP; sharding against DistributedSampler."""
import pytest
import torch
from torch import nn
from torch.utils.data.distributed import DistributedSampler

import json

from course_lib import trace
from course_lib.data import TensorLoader
from course_lib.distributed.ddp import (assign_buckets, batchnorm_breaks_equivalence, compare_with_torch_ddp,
                                       split_batch_gradients)
from course_lib.distributed.ddp_hooks import HOOKS, compare_comm_hooks, register_hook, uneven_inputs_with_join
from course_lib.distributed.ddp_overlap import bucket_sweep, mlp, overlap_summary, overlap_timeline
from course_lib.distributed.launch import launch
from course_lib.models import max_diff
from course_lib.rank_data import ShardedTensorLoader, shard_indices


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 3])
def test_flat_and_bucketed_match_torch_ddp(world_size):
    for out in launch(compare_with_torch_ddp, world_size, timeout=100):
        assert out["broadcast"] == 0.0 and out["buckets"] >= 3
        assert out["flat"] < 1e-6 and out["bucketed"] < 1e-6 and out["no_sync"] < 1e-6
        assert out["one_big_batch"] < 1e-5


@pytest.mark.parametrize("world_size, batch, seed", [(2, 16, 0), (4, 8, 1), (3, 5, 2)])
def test_per_rank_batchnorm_statistics_break_the_big_batch_equivalence(world_size, batch, seed):
    gaps = batchnorm_breaks_equivalence(world_size, batch, seed)
    assert gaps["no BatchNorm"] < 1e-6 and gaps["BatchNorm1d"] > 1e-3
    assert batchnorm_breaks_equivalence(1, batch, seed)["BatchNorm1d"] < 1e-6      # one rank: the same batch


@pytest.mark.timeout(120)
def test_split_batch_gradients_is_what_torch_ddp_computes_with_batchnorm():
    """The one-process mean over slices equals torch DDP's all-reduced gradient (BatchNorm1d, not synced)."""
    import launch_workers

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 5))
    x, y = torch.randn(2 * 8, 20), torch.randint(0, 5, (2 * 8,))                # as the worker draws them
    big, averaged = split_batch_gradients(model, x, y, 2)
    for arrays in launch(launch_workers.ddp_batchnorm_gradients, 2, 8, 0, timeout=100):
        grads = [torch.from_numpy(a) for a in arrays]
        assert max_diff(grads, averaged) < 1e-6 and max_diff(grads, big) > 1e-3


def test_split_batch_gradients_refuses_bad_input():
    model = nn.Linear(4, 3)
    with pytest.raises(ValueError, match="world_size"):
        split_batch_gradients(model, torch.randn(6, 4), torch.zeros(6, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="multiple of world_size"):
        split_batch_gradients(model, torch.randn(5, 4), torch.zeros(5, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="batch"):
        batchnorm_breaks_equivalence(2, 0)


@pytest.mark.parametrize("n,world_size", [(10, 3), (12, 4), (5, 2), (2, 3), (7, 1)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_shard_indices_matches_distributed_sampler(n, world_size, drop_last):
    if drop_last and n < world_size:
        pytest.skip("DistributedSampler gives every rank nothing")
    for epoch in (0, 3):
        shards = [shard_indices(n, r, world_size, epoch, seed=5, drop_last=drop_last) for r in range(world_size)]
        for r, shard in enumerate(shards):
            sampler = DistributedSampler(range(n), world_size, r, shuffle=True, seed=5, drop_last=drop_last)
            sampler.set_epoch(epoch)
            assert shard == list(sampler)
        assert len({len(s) for s in shards}) == 1          # equal length: no rank waits forever
        if not drop_last:
            assert set().union(*shards) == set(range(n))   # everything seen, a few padded repeats
    assert shard_indices(10, 0, 2, 0) != shard_indices(10, 0, 2, 1)     # set_epoch reshuffles


def test_sharded_loader_batches_add_up_to_tensorloader_batches():
    x, y = torch.arange(64.0).view(64, 1), torch.arange(64)
    ranks = [ShardedTensorLoader(x, y, batch_size=4, rank=r, world_size=2, seed=3) for r in range(2)]
    whole = TensorLoader(x, y, batch_size=8, seed=3)
    for epoch in (0, 1):
        for loader in (*ranks, whole):
            loader.set_epoch(epoch)
        for (x0, _), (x1, _), (xw, _) in zip(*ranks, whole):
            assert sorted(torch.cat([x0, x1]).flatten().tolist()) == sorted(xw.flatten().tolist())
    assert len(ranks[0]) == 8 and ranks[0].dataset_size == 64 and ranks[0].num_samples == 32


@pytest.mark.parametrize("n,batch_size", [(64, 8), (70, 16)])
def test_one_rank_loader_is_tensorloader_batch_for_batch(n, batch_size):
    """The training script feeds every strategy through ShardedTensorLoader: one process must see TensorLoader's batches."""
    x, y = torch.arange(float(n)).view(n, 1), torch.arange(n)
    one, whole = ShardedTensorLoader(x, y, batch_size=batch_size, seed=7), TensorLoader(x, y, batch_size=batch_size, seed=7)
    assert len(one) == len(whole)
    for _ in range(3):                       # each iteration is the next epoch in both
        for (xa, ya), (xb, yb) in zip(one, whole, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    other = ShardedTensorLoader(x, y, batch_size=batch_size, seed=8)
    assert not torch.equal(next(iter(other))[1], next(iter(ShardedTensorLoader(x, y, batch_size=batch_size, seed=7)))[1])


def test_assign_buckets_reverse_order_and_size():
    params = [nn.Parameter(torch.zeros(n)) for n in (1000, 10, 300_000, 5)]   # 4 bytes each
    assert assign_buckets(params, bucket_mb=1.0) == [[3, 2], [1, 0]]
    assert assign_buckets(params, bucket_mb=100.0) == [[3, 2, 1, 0]]
    assert sum(assign_buckets(params, bucket_mb=1e-6), []) == [3, 2, 1, 0]


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="rank"):
        shard_indices(10, 2, 2)
    with pytest.raises(ValueError, match="world_size"):
        shard_indices(10, 0, 0)
    with pytest.raises(ValueError, match="epoch"):
        shard_indices(10, 0, 2, epoch=-1)
    with pytest.raises(ValueError, match="n must"):
        shard_indices(0, 0, 2)
    with pytest.raises(ValueError, match="bucket_mb"):
        assign_buckets([], bucket_mb=0)
    with pytest.raises(ValueError, match="batch_size"):
        ShardedTensorLoader(torch.zeros(4), batch_size=0)
    with pytest.raises(ValueError, match="same length"):
        ShardedTensorLoader(torch.zeros(4), torch.zeros(5))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_overlap_trace_has_an_all_reduce_that_starts_during_backward(tmp_path):
    """BucketedDDP launches bucket 0 from a gradient hook, inside backward: deterministic, not a timing."""
    timeline = trace.merge(launch(overlap_timeline, 2, "bucketed", 0.05, 128, 6, 16, 2, timeout=100))
    path = timeline.save_chrome(tmp_path / "07_ddp_overlap.json")
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    backward = [e for e in events if e["cat"] == "backward"]
    reduces = [e for e in events if e["cat"] == "comm" and ("allreduce" in e["name"] or "all_reduce" in e["name"])]
    assert backward and reduces
    assert any(b["pid"] == r["pid"] and b["ts"] <= r["ts"] < b["ts"] + b["dur"] for b in backward for r in reduces)
    assert overlap_summary(timeline)["during_backward_ms"] > 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bucket_sweep_counts_one_all_reduce_per_bucket():
    rows = launch(bucket_sweep, 2, [0.01, 100.0], 64, 1, timeout=100)[0]
    assert [r["bucket_mb"] for r in rows] == [None, 0.01, 100.0]
    assert rows[0]["all_reduces"] == 1 and rows[2]["all_reduces"] == 1
    # the benchmark's MLP is mlp(width, 5): 784 -> 5 hidden layers -> 10
    assert rows[1]["all_reduces"] == len(assign_buckets(list(mlp(64, 5).parameters()), 0.01)) > 3
    assert all(r["step_ms"] > 0 for r in rows)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_comm_hooks_bytes_and_training(tmp_path):
    out = launch(compare_comm_hooks, 2, HOOKS, 5, 16, 256, timeout=140)
    for rank_rows in out:
        fp32, fp16, psgd = rank_rows
        assert [r["hook"] for r in rank_rows] == list(HOOKS)
        assert fp32["bytes_per_step"] == 4 * 21_840      # Net's parameters, float32
        assert fp16["bytes_per_step"] * 2 == fp32["bytes_per_step"]
        assert psgd["bytes_per_step"] < fp16["bytes_per_step"] / 4
        assert all(len(r["losses"]) == 5 and 0 <= r["test_accuracy"] <= 1 for r in rank_rows)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_join_lets_uneven_ranks_finish_with_the_same_weights():
    out = launch(uneven_inputs_with_join, 2, 2, 3, timeout=100)
    assert [o["batches"] for o in out] == [2, 5]
    assert out[0]["weight_checksum"] == out[1]["weight_checksum"]


def test_ddp_extras_refuse_bad_arguments_by_name():
    with pytest.raises(ValueError, match="variant"):
        overlap_timeline(0, 1, "ring")
    with pytest.raises(ValueError, match="hook"):
        register_hook(None, "int8")
    with pytest.raises(ValueError, match="width"):
        mlp(0)
    with pytest.raises(ValueError, match="steps"):
        compare_comm_hooks(0, 1, steps=2)
