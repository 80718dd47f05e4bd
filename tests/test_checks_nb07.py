"""The checks of exercise notebook 07 pass the reference solutions and fail stubs and wrong answers."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.checks.nb07 import check_shard_indices, check_should_checkpoint
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


def drop_last(n, rank, world_size, epoch, seed):
    order = perm(n, seed + epoch)
    return order[:n - n % world_size][rank::world_size]


def pads_with_last(n, rank, world_size, epoch, seed):
    order = perm(n, seed + epoch)
    total = -(-n // world_size) * world_size
    return (order + [order[-1]] * (total - n))[rank::world_size]


def seeded_with_epoch_only(n, rank, world_size, epoch, seed):
    return NS["shard_indices"](n, rank, world_size, epoch, 0) if seed == 0 else \
        NS["shard_indices"](n, rank, world_size, 0, seed + epoch + 1)    # off by one in the seed


def starts_at_rank_plus_one(n, rank, world_size, epoch, seed):
    order = perm(n, seed + epoch)
    total = -(-n // world_size) * world_size
    order = (order * world_size)[:total]
    return order[(rank + 1) % world_size::world_size]


def global_seed(n, rank, world_size, epoch, seed):   # right indices, but reseeds torch's global generator
    torch.manual_seed(seed + epoch)
    order = torch.randperm(n).tolist()
    total = -(-n // world_size) * world_size
    return (order * world_size)[:total][rank::world_size]


def ignores_seed(n, rank, world_size, epoch, seed):
    return NS["shard_indices"](n, rank, world_size, epoch, 0)


def pads_once(n, rank, world_size, epoch, seed):     # order + order[:k]: too short when world_size > 2n
    order = perm(n, seed + epoch)
    total = -(-n // world_size) * world_size
    return (order + order[:total - n])[rank::world_size]


def with_sampler(n, rank, world_size, epoch, seed):   # torch's own sampler: the whole exercise in one call
    from torch.utils.data.distributed import DistributedSampler
    sampler = DistributedSampler(range(n), world_size, rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


@pytest.mark.parametrize("wrong, message", [
    (no_padding, "same number"), (no_set_epoch, "epoch is ignored"), (contiguous_chunks, "the wrong ones"),
    (drop_last, "drop_last"), (pads_with_last, "FIRST indices"), (seeded_with_epoch_only, "seed \\+ epoch"),
    (starts_at_rank_plus_one, "the wrong ones"), (global_seed, "global random state"),
    (ignores_seed, "seed is ignored"), (pads_once, "n=3, world_size=8: ranks got .* repeating them"),
    (with_sampler, "uses DistributedSampler")])
def test_wrong_shard_indices_fail(wrong, message):
    with torch.random.fork_rng(), pytest.raises(AssertionError, match=message):   # global_seed reseeds torch
        check_shard_indices(wrong)


def test_equivalent_shard_indices_pass():
    def with_tensors(n, rank, world_size, epoch, seed):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
        total = -(-n // world_size) * world_size
        return order.repeat(-(-total // n))[:total][rank::world_size].tolist()

    def with_modulo(n, rank, world_size, epoch, seed):   # index i of the padded list is order[i % n]
        order = perm(n, seed + epoch)
        return [order[i % n] for i in range(rank, -(-n // world_size) * world_size, world_size)]
    check_shard_indices(with_tensors)
    check_shard_indices(with_modulo)


@settings(max_examples=25)
@given(st.integers(1, 30), st.integers(1, 9), st.integers(0, 5), st.integers(0, 2**31))
def test_shard_solution_is_distributed_sampler(n, world_size, epoch, seed):
    from torch.utils.data.distributed import DistributedSampler
    for rank in range(world_size):
        sampler = DistributedSampler(range(n), world_size, rank, shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
        assert NS["shard_indices"](n, rank, world_size, epoch, seed) == list(sampler)


@pytest.mark.parametrize("wrong, message", [
    (lambda rank, step, every: step % every == 0, "only rank 0 writes"),                 # every rank writes
    (lambda rank, step, every: rank == 0 and step % every == 0, "step 0"),               # also at step 0
    (lambda rank, step, every: rank == 0 and (step + 1) % every == 0, "expected True"),  # off by one
    (lambda rank, step, every: int(rank == 0 and step > 0 and step % every == 0), "must return a bool"),
    (lambda rank, step, every: rank == 0 and step >= every, "expected False"),           # every step after the first
    (lambda rank, step, every: rank == 0 and step > 0 and every % step == 0, "expected"),  # operands swapped
    (lambda rank, step, every: rank == 0 and step > 0 and step % every == 0 or None, "must return a bool"),
])
def test_wrong_should_checkpoint_fails(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_should_checkpoint(wrong)


@settings(max_examples=50)
@given(st.integers(0, 7), st.integers(0, 10**6), st.integers(1, 10**4))
def test_should_checkpoint_solution_writes_on_rank_0_every_every_steps(rank, step, every):
    assert NS["should_checkpoint"](rank, step, every) is (rank == 0 and step in range(every, step + 1, every))


# --- exercise 3: bucketed all-reduce hooks (ONE launch of 2 gloo processes runs every answer) -------------

def _solution_source() -> str:
    import nbformat
    nb = nbformat.read(str(NB), as_version=4)
    return next(c.source for c in nb.cells if c.cell_type == "code" and "def attach_bucket_hooks" in c.source)


def _variant(*replacements) -> str:
    source = _solution_source()
    for old, new in zip(replacements[::2], replacements[1::2]):
        assert old in source, old
        source = source.replace(old, new)
    return source


WRONG_HOOKS = {   # name: (source, the message the check must give)
    "sum_not_mean": (_variant("            flat /= dist.get_world_size()\n", ""), "differ from torch DDP"),
    "blocking": (_variant("dist.all_reduce(flat, async_op=True)", "dist.all_reduce(flat)",
                          "            work.wait()\n", ""), "async_op=True"),
    "no_reset": (_variant("        ready[:] = [0] * len(buckets)\n", ""), "second backward"),
    "per_parameter": (_variant("if ready[b] == len(buckets[b]):", "if True:",
                               "torch.cat([q.grad.reshape(-1) for q in buckets[b]])", "p.grad.reshape(-1).clone()",
                               "pending.append((buckets[b], flat,", "pending.append(([p], flat,"), "all-reduces for"),
    "first_grad_of_bucket": (_variant("if ready[b] == len(buckets[b]):", "if ready[b] == 1:"), "ALL its gradients"),
    "flat_after_backward": ("""def flat_after_backward(buckets):
    params = [p for bucket in buckets for p in bucket]

    def finish():                       # FlatDDP: right gradients, but nothing overlaps backward
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))
    return finish
""", "after backward"),
    # async launch in the right order, then waiting for it inside the hook: backward stands still meanwhile
    "waits_in_hook": (_variant("pending.append((buckets[b], flat, dist.all_reduce(flat, async_op=True)))",
                               "work = dist.all_reduce(flat, async_op=True)\n"
                               "            work.wait()\n"
                               "            pending.append((buckets[b], flat, work))"), "bucket 0's all-reduce had "
                      "already completed when backward went on.*the hook waited"),
    "future_wait_in_hook": (_variant("pending.append((buckets[b], flat, dist.all_reduce(flat, async_op=True)))",
                                     "work = dist.all_reduce(flat, async_op=True)\n"
                                     "            work.get_future().wait()\n"
                                     "            pending.append((buckets[b], flat, work))"), "the hook waited"),
    "no_wait_in_finish": (_variant("            work.wait()\n", ""), "still in flight when finish\\(\\) returned"),
    # sleeping instead of waiting: the bucket would have arrived meanwhile, were rank 1 not held until a wait
    "sleeps_in_finish": (_variant("            work.wait()\n", "            __import__('time').sleep(0.5)\n"),
                         "still in flight when finish\\(\\) returned"),
    "no_copy_back": (_variant("            for q, g in zip(params, flat.split([q.numel() for q in params])):\n"
                              "                q.grad.copy_(g.view_as(q))\n", ""), "never reached p.grad"),
    "slices_in_wrong_order": (_variant("zip(params, flat.split([q.numel() for q in params]))",
                                       "zip(params[::-1], flat.flip(0).split([q.numel() for q in params[::-1]]))"),
                              "neither the mean nor the sum"),
}

# a different correct answer: one hook per bucket's parameter set, counting with a set, waiting in order
SET_COUNTING = """def attach_bucket_hooks(buckets):
    state = {"seen": [set() for _ in buckets], "works": []}
    for b, params in enumerate(buckets):
        def hook(p, b=b, params=params):
            state["seen"][b].add(id(p))
            if len(state["seen"][b]) == len(params):
                flat = torch.cat([q.grad.flatten() for q in params]).div_(dist.get_world_size())
                state["works"].append((params, flat, dist.all_reduce(flat, async_op=True)))
        for p in params:
            p.register_post_accumulate_grad_hook(hook)

    def finish():
        for params, flat, work in state["works"]:
            work.wait()
            offset = 0
            for q in params:
                q.grad.copy_(flat[offset:offset + q.numel()].view_as(q))
                offset += q.numel()
        state["works"].clear()
        for seen in state["seen"]:
            seen.clear()
    return finish
"""


# correct answers with futures: a callback copies the mean back as soon as the bucket arrives; finish waits for all
WITH_FUTURES = """def attach_bucket_hooks(buckets):
    left, futures = [len(b) for b in buckets], []

    def arrived(params, flat):
        def copy_back(fut):
            flat.div_(dist.get_world_size())
            for q, g in zip(params, flat.split([q.numel() for q in params])):
                q.grad.copy_(g.view_as(q))
        return copy_back

    for b, params in enumerate(buckets):
        def hook(p, b=b, params=params):
            left[b] -= 1
            if left[b] == 0:
                flat = torch.cat([q.grad.view(-1) for q in params])
                fut = dist.all_reduce(flat, async_op=True).get_future()
                futures.append(fut.then(arrived(params, flat)))
        for p in params:
            p.register_post_accumulate_grad_hook(hook)

    def finish():
        torch.futures.wait_all(futures)
        futures.clear()
        left[:] = [len(b) for b in buckets]
    return finish
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bucket_hooks_check_passes_correct_answers_and_rejects_wrong_ones():
    from course_lib.checks.nb07 import bucket_hook_cases, judge_bucket_hooks
    from course_lib.distributed.launch import launch
    from many_answers import cases_many, function_name, judge_or_raise

    answers = {"solution": _solution_source(), "set_counting": SET_COUNTING, "with_futures": WITH_FUTURES,
               "polls": _variant("            work.wait()\n", "            while not work.is_completed():\n"
                                 "                pass\n"),
               # another collective before the wait (dist.barrier waits through Work.wait): nothing hangs
               "barrier_first": _variant("            work.wait()\n",
                                         "            dist.barrier()\n            work.wait()\n"),
               "stub": "def stub_hooks(buckets):\n    raise NotImplementedError()\n",
               **{k: src for k, (src, _) in WRONG_HOOKS.items()}}
    runs = launch(cases_many, 2, bucket_hook_cases, [(src, function_name(src)) for src in answers.values()],
                  timeout=100)
    for i, key in enumerate(answers):
        per_rank = [rank_runs[i] for rank_runs in runs]
        if key == "stub":         # run_on_ranks turns this into NotImplementedError("... is still the stub")
            assert all(r.startswith("NotImplementedError") for r in per_rank), per_rank
        elif key in WRONG_HOOKS:
            with pytest.raises(AssertionError, match=WRONG_HOOKS[key][1]):
                judge_or_raise(judge_bucket_hooks, 2, per_rank)
        else:
            judge_or_raise(judge_bucket_hooks, 2, per_rank)
