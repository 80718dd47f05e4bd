"""The checks of exercise notebook 07 pass the reference solutions and fail stubs and wrong answers."""

import pytest
import torch

import nbtools
from course_lib.checks.nb07 import check_bucket_hooks, check_shard_indices, check_should_checkpoint
from nbtools import ROOT, notebook_namespace

NB = ROOT / "solutions" / "07_ddp_exercises.ipynb"
NS = notebook_namespace(NB)


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


# --- exercise 3: bucketed all-reduce hooks (each check starts 2 gloo processes) ------------------------

def solution_module(tmp_path):
    return nbtools.solution_module(NB, tmp_path)


def stub_hooks(buckets):
    raise NotImplementedError()


def flat_after_backward(buckets):
    params = [p for bucket in buckets for p in bucket]

    def finish():                       # FlatDDP: right gradients, but nothing overlaps backward
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)  # noqa: F821 - provided by the worker's namespace
        flat /= dist.get_world_size()  # noqa: F821
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))
    return finish


def sum_not_mean(buckets):
    bucket_of = {id(p): b for b, params in enumerate(buckets) for p in params}
    ready, pending = [0] * len(buckets), []

    def hook(p):
        b = bucket_of[id(p)]
        ready[b] += 1
        if ready[b] == len(buckets[b]):
            flat = torch.cat([q.grad.reshape(-1) for q in buckets[b]])
            pending.append((buckets[b], flat, dist.all_reduce(flat, async_op=True)))  # noqa: F821

    for params in buckets:
        for p in params:
            p.register_post_accumulate_grad_hook(hook)

    def finish():                       # forgets to divide by the world size: the sum, not DDP's mean
        for params, flat, work in pending:
            work.wait()
            for q, g in zip(params, flat.split([q.numel() for q in params])):
                q.grad.copy_(g.view_as(q))
        pending.clear()
        ready[:] = [0] * len(buckets)
    return finish


@pytest.mark.timeout(120)
def test_bucket_hooks_solution_passes(tmp_path):
    check_bucket_hooks(solution_module(tmp_path).attach_bucket_hooks)


@pytest.mark.timeout(120)
def test_bucket_hooks_stub_fails():
    with pytest.raises(NotImplementedError):
        check_bucket_hooks(stub_hooks)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("wrong,message", [(flat_after_backward, "after backward"),
                                           (sum_not_mean, "differ from torch DDP")])
def test_bucket_hooks_wrong_answers_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_bucket_hooks(wrong)
