"""Checks for solutions/07_ddp_exercises.ipynb: which samples a rank sees; who writes checkpoints.

Compared against torch's DistributedSampler (no process group needed: num_replicas and rank
are passed explicitly), and against the rules of rank-0-only checkpointing.
"""
from __future__ import annotations

from torch.utils.data.distributed import DistributedSampler

from . import expect, passed

CASES = [(10, 3), (12, 4), (5, 2), (2, 3), (9, 1)]


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
            for r, shard in enumerate(shards):
                sampler = DistributedSampler(range(n), world, r, shuffle=True, seed=42)
                sampler.set_epoch(epoch)
                expected = list(sampler)
                expect(sorted(shard) == sorted(expected) or len(shard) != len(expected),
                       f"n={n}, world_size={world}, rank={r}, epoch={epoch}: this rank gets the wrong samples. "
                       "Hint: rank r takes every world_size-th index of the padded permutation, starting at r "
                       "(indices[r::world_size]), not a contiguous chunk.")
                expect(shard == expected,
                       f"n={n}, world_size={world}, rank={r}, epoch={epoch}: expected {expected}, got {shard}. "
                       "Hint: torch.randperm(n, generator=g) with g.manual_seed(seed + epoch); the epoch must "
                       "change the order, or every epoch repeats the same batches.")
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
