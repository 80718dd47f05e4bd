"""The checks of exercise notebook 07 pass the reference solutions and fail stubs and wrong answers."""
import pytest
import torch

from course_lib.checks.nb07 import check_shard_indices, check_should_checkpoint
from nbtools import ROOT, notebook_namespace

NS = notebook_namespace(ROOT / "solutions" / "07_ddp_exercises.ipynb")


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_shard_indices(NS["shard_indices"])
    check_should_checkpoint(NS["should_checkpoint"])


def test_stubs_fail():
    for check in (check_shard_indices, check_should_checkpoint):
        with pytest.raises(NotImplementedError):
            check(stub)


def perm(n, seed):
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()


def no_padding(n, rank, world_size, epoch, seed):
    return perm(n, seed + epoch)[rank::world_size]


def no_set_epoch(n, rank, world_size, epoch, seed):
    return NS["shard_indices"](n, rank, world_size, 0, seed)


def contiguous_chunks(n, rank, world_size, epoch, seed):
    order = perm(n, seed + epoch)
    per = -(-n // world_size)
    order = (order * world_size)[:per * world_size]
    return order[rank * per:(rank + 1) * per]


@pytest.mark.parametrize("wrong", [no_padding, no_set_epoch, contiguous_chunks])
def test_wrong_shard_indices_fail(wrong):
    with pytest.raises(AssertionError):
        check_shard_indices(wrong)


@pytest.mark.parametrize("wrong", [
    lambda rank, step, every: step % every == 0,                              # every rank writes
    lambda rank, step, every: rank == 0 and step % every == 0,                # also at step 0
    lambda rank, step, every: rank == 0 and (step + 1) % every == 0,          # off by one
    lambda rank, step, every: int(rank == 0 and step > 0 and step % every == 0),  # not a bool
])
def test_wrong_should_checkpoint_fails(wrong):
    with pytest.raises(AssertionError):
        check_should_checkpoint(wrong)
