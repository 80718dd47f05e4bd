"""Checks for solutions/07_ddp_exercises.ipynb: which samples a rank sees; who writes checkpoints;
bucketed all-reduce hooks that overlap backward.

Compared against torch's DistributedSampler (no process group needed: num_replicas and rank
are passed explicitly), against the rules of rank-0-only checkpointing, and against torch's
DistributedDataParallel on 2 gloo ranks. Overlap is judged by ORDER, not by time: the check logs
each gradient as autograd produces it and each dist.all_reduce call, and asks that every bucket's
all-reduce is launched (async) once its gradients are ready, while later gradients are still to come.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data.distributed import DistributedSampler

from . import expect, passed, run_on_ranks
from ..grading.student import compile_source
from ..models import max_diff

CASES = [(10, 3), (12, 4), (5, 2), (2, 3), (9, 1)]


def _sampler(n: int, world: int, rank: int, epoch: int, drop_last: bool = False) -> list:
    sampler = DistributedSampler(range(n), world, rank, shuffle=True, seed=42, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


def check_shard_indices(shard_indices) -> None:
    """`shard_indices(n, rank, world_size, epoch, seed) -> list[int]` equals DistributedSampler's."""
    for n, world in CASES:
        for epoch in (0, 1, 7):
            shards = [list(shard_indices(n, r, world, epoch, 42)) for r in range(world)]
            lengths = [len(s) for s in shards]
            expect(len(set(lengths)) == 1,
                   f"n={n}, world_size={world}: ranks got {lengths} samples. Every rank must get the same "
                   "number, or the rank with fewer batches leaves while the others wait in all-reduce forever. "
                   "Hint: pad the permutation with its own first indices up to a multiple of world_size.")
            wanted = [_sampler(n, world, r, epoch) for r in range(world)]
            for r, (shard, expected) in enumerate(zip(shards, wanted)):
                if shard == expected:
                    continue
                where = f"n={n}, world_size={world}, rank={r}, epoch={epoch}"
                expect(epoch == 0 or shard != _sampler(n, world, r, 0),
                       f"{where}: the same indices as in epoch 0: the epoch is ignored (the sampler's set_epoch). "
                       "Seed the permutation with seed + epoch, or every epoch repeats the same batches.")
                expect(n % world == 0 or shard != _sampler(n, world, r, epoch, drop_last=True),
                       f"{where}: you dropped the last n % world_size indices (drop_last=True); DistributedSampler's "
                       "default pads with the permutation's own first indices instead, so no sample is lost.")
                expect(sorted(sum(shards, [])) != sorted(sum(wanted, [])),
                       f"{where}: the ranks together get the right samples, but this rank the wrong ones. Hint: rank r "
                       "takes every world_size-th index of the padded permutation, starting at r "
                       "(indices[r::world_size]), not a contiguous chunk.")
                raise AssertionError(
                    f"{where}: expected {expected}, got {shard}. Hint: torch.randperm(n, generator=g) with "
                    "g.manual_seed(seed + epoch); pad with the permutation's FIRST indices (repeating them if "
                    "needed); rank r takes indices[r::world_size].")
    passed("shard_indices")


def check_should_checkpoint(should_checkpoint) -> None:
    """`should_checkpoint(rank, step, every) -> bool`: rank 0 only, after every `every`-th step."""
    for rank, step, every, want in [(0, 10, 5, True), (0, 5, 5, True), (0, 7, 5, False), (0, 0, 5, False),
                                    (1, 10, 5, False), (3, 5, 5, False), (0, 1, 1, True), (0, 4, 3, False)]:
        got = should_checkpoint(rank, step, every)
        expect(isinstance(got, bool), f"should_checkpoint must return a bool; got {type(got).__name__}")
        if rank != 0:
            expect(got == want, f"rank {rank} wants to write a checkpoint at step {step}: only rank 0 writes. "
                   "Every rank holds the same weights after all-reduce, so N writers would race on one file.")
        elif step == 0:
            expect(got == want, "step 0 (before any training) should not write a checkpoint")
        else:
            expect(got == want, f"rank 0, step {step}, every {every}: expected {want}, got {got}. "
                   f"Hint: write after steps every, 2*every, ... (step % every == 0).")
    passed("should_checkpoint")


# --- exercise 3: bucketed all-reduce hooks ------------------------------------------------------------

WIDTHS = (20, 24, 32, 16, 5)     # 4 Linear layers, one bucket each; every bucket has a different size
STEPS = 2                        # the second step shows that the hooks reset after the first


def _model() -> nn.Sequential:
    torch.manual_seed(0)         # the same weights on every rank
    layers = [m for a, b in zip(WIDTHS, WIDTHS[1:]) for m in (nn.Linear(a, b), nn.Tanh())]
    return nn.Sequential(*layers[:-1])


def bucket_hook_cases(rank: int, world_size: int, source: str, name: str) -> list:
    """Worker: attach the learner's hooks, run STEPS backward passes; per step the event log and the gradient error
    against torch DDP. Log entries: ("grad", param index), ("all_reduce", numel, async_op), ("backward returned",)."""
    fn = compile_source(source, name)
    model = _model()
    reference = nn.parallel.DistributedDataParallel(copy.deepcopy(model))
    params = list(model.parameters())
    buckets = [params[i:i + 2] for i in range(len(params) - 2, -1, -2)]     # last layer first
    log = []
    for i, p in enumerate(params):      # registered before the learner's: each "grad" precedes its hooks
        p.register_post_accumulate_grad_hook(lambda p, i=i: log.append(("grad", i)))
    original = dist.all_reduce

    def recording(tensor, *args, **kwargs):
        log.append(("all_reduce", tensor.numel(), bool(kwargs.get("async_op", args[2] if len(args) > 2 else False))))
        return original(tensor, *args, **kwargs)
    dist.all_reduce = recording
    out = []
    try:
        finish = fn(buckets)
        for step in range(STEPS):
            g = torch.Generator().manual_seed(10 * rank + step)
            x, y = torch.randn(8, WIDTHS[0], generator=g), torch.randint(0, WIDTHS[-1], (8,), generator=g)
            model.zero_grad()
            log.clear()
            try:
                nn.functional.cross_entropy(model(x), y).backward()
            except AttributeError as exc:
                if "NoneType" not in str(exc):
                    raise
                raise RuntimeError(f"step {step + 1}: {exc}: a hook read a gradient that backward has not produced "
                                   "yet (p.grad is None); launch a bucket only when ALL its gradients are "
                                   "ready") from None
            log.append(("backward returned",))
            if callable(finish):
                finish()
            events = list(log)
            reference.zero_grad()
            nn.functional.cross_entropy(reference(x), y).backward()
            grads = [p.grad if p.grad is not None else torch.full_like(p, float("nan")) for p in params]
            out.append({"log": events, "error": max_diff(grads, [p.grad for p in reference.parameters()]),
                        "finish_callable": callable(finish)})
    finally:
        dist.all_reduce = original
    return out


def _bucket_numels() -> list:
    params = list(_model().parameters())
    return [params[i].numel() + params[i + 1].numel() for i in range(len(params) - 2, -1, -2)]


def _run_bucket_hooks(fn, world_size: int = 2) -> list:
    return run_on_ranks(bucket_hook_cases, world_size, fn, "every rank must launch the same all-reduces in the "
                        "same order (bucket 0 first), and finish() must wait for each one")


def check_bucket_hooks(fn) -> None:
    """fn(buckets) registers hooks that all-reduce each bucket asynchronously as soon as its gradients are
    ready, and returns finish(): wait for them and leave the mean over ranks in every p.grad."""
    judge_bucket_hooks(2, _run_bucket_hooks(fn))
    passed("check_bucket_hooks")


def judge_bucket_hooks(world_size: int, results: list) -> None:
    """AssertionError naming the first mistake in `bucket_hook_cases`' results (one list per rank)."""
    numels = _bucket_numels()
    for rank, steps in enumerate(results):
        for step, case in enumerate(steps):
            where, log = f"rank {rank}, step {step + 1}", case["log"]
            expect(case["finish_callable"], "return a function finish() that waits for the all-reduces")
            launches = [i for i, e in enumerate(log) if e[0] == "all_reduce"]
            end = log.index(("backward returned",))
            grad_at = {e[1]: i for i, e in enumerate(log) if e[0] == "grad"}
            expect(launches or step == 0, f"{where}: no dist.all_reduce at all in the second backward pass. "
                   "Reset your counters (in finish) so that the next step launches its buckets again.")
            expect(launches, f"{where}: no dist.all_reduce was called at all")
            expect(all(i < end for i in launches),
                   f"{where}: {sum(i > end for i in launches)} all-reduce(s) were launched after backward had "
                   "returned: that is a flat all-reduce after backward, with no overlap. Launch each bucket from a "
                   "gradient hook (p.register_post_accumulate_grad_hook) as soon as its last gradient is ready.")
            expect(len(launches) == len(numels),
                   f"{where}: {len(launches)} all-reduces for {len(numels)} buckets. One all-reduce per bucket: "
                   "torch.cat the bucket's gradients (flattened) and all-reduce that one tensor.")
            sizes = [log[i][1] for i in launches]
            expect(sizes == numels, f"{where}: all-reduced tensors of {sizes} elements; the buckets, in the order "
                   f"backward fills them, hold {numels}. Launch bucket 0 first, each with all its gradients.")
            last_grad = max(grad_at.values())
            for b, i in enumerate(launches):
                mine = [grad_at[j] for j in range(2 * (len(numels) - 1 - b), 2 * (len(numels) - b))]
                expect(all(g < i for g in mine), f"{where}: bucket {b} was all-reduced before all its gradients "
                       "were ready; count the ready gradients per bucket and launch when the count is complete.")
                expect(b == len(numels) - 1 or i < last_grad,
                       f"{where}: bucket {b}'s all-reduce was launched only when backward had produced its last "
                       "gradient: no overlap. Launch a bucket as soon as ITS gradients are all ready.")
            expect(all(log[i][2] for i in launches),
                   f"{where}: dist.all_reduce without async_op=True blocks backward until the bucket has "
                   "travelled; launch it with async_op=True and wait for the work objects in finish().")
            expect(case["error"] < 1e-5,
                   f"{where}: the gradients differ from torch DDP's by {case['error']:.3g}. After waiting, divide "
                   "by dist.get_world_size() (DDP averages) and copy each slice back into its p.grad.")
