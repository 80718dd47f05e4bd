"""Each rank's share of the training data: DistributedSampler's split, batched from tensors in memory.

    loader = ShardedTensorLoader(x, y, batch_size=64, rank=strategy.info.rank,
                                 world_size=strategy.info.world_size, seed=0)

Under data parallelism every rank trains on its own slice of each epoch: one shuffled permutation
per epoch (the same on every rank: same seed, same epoch), padded with its own first indices to a
multiple of world_size, and rank r takes every world_size-th index from r. Padding gives every rank
the same number of batches: a rank with one batch fewer would wait forever in an all-reduce.
With world_size 1 this is `course_lib.data.TensorLoader`'s order exactly, so the training script
uses one loader for every strategy. Lecture 07 teaches `shard_indices` (as `distributed.ddp`'s).

Evaluation is split too (`EvalShardLoader`): each data rank scores a contiguous 1/world_size of the test set and
the sums (loss, correct, seen) are added over the ranks, so N ranks evaluate N times faster than each scoring all
of it. Every rank runs the same number of forward passes (DDP's and FSDP's forwards are collectives): the short
last block is padded with copies of its first sample that carry weight 0.
"""
from __future__ import annotations

import torch
from torch.utils.data.distributed import DistributedSampler

from .validate import int_in_range, non_negative_int, positive_int


def _check_rank(rank, world_size):
    positive_int("world_size", world_size)
    int_in_range("rank", rank, 0, world_size - 1, hint=f" (world_size={world_size})")


def shard_indices(n: int, rank: int, world_size: int, epoch: int = 0, seed: int = 0, shuffle: bool = True,
                  drop_last: bool = False) -> list[int]:
    """The sample indices rank `rank` visits in `epoch`: DistributedSampler's, without a process group.

    Without drop_last the permutation is padded with its own first indices up to a multiple of
    world_size, so all ranks get ceil(n / world_size) samples (a few repeated).
    """
    positive_int("n", n)
    _check_rank(rank, world_size)
    non_negative_int("epoch", epoch)
    sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed,
                                 drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


class ShardedTensorLoader:
    """A TensorLoader for one rank: batches of this rank's `shard_indices`, tensors in memory.

    Same interface as course_lib.data.TensorLoader (len = batches, set_epoch, dataset_size =
    size of the whole data). With `seed` the global order matches TensorLoader(seed=seed): the
    union of all ranks' k-th batches of size B is TensorLoader's k-th batch of size world_size*B
    (with world_size 1, the same batches in the same order).
    """

    def __init__(self, *tensors: torch.Tensor, batch_size: int = 64, rank: int = 0, world_size: int = 1,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, device=None):
        if not tensors or any(len(t) != len(tensors[0]) for t in tensors):
            raise ValueError("ShardedTensorLoader needs one or more tensors of the same length")
        positive_int("batch_size", batch_size)
        _check_rank(rank, world_size)
        self.tensors = tuple(t.to(device) for t in tensors) if device is not None else tensors
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0
        self.dataset_size = len(tensors[0])
        self.num_samples = len(shard_indices(self.dataset_size, rank, world_size, 0, 0, False, drop_last))

    def __len__(self) -> int:
        return -(-self.num_samples // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        # TensorLoader's generator seed, so that one process with batch N*B sees the same batches.
        order = torch.tensor(shard_indices(self.dataset_size, self.rank, self.world_size, self.epoch,
                                           self.seed * 1_000_003, self.shuffle, self.drop_last))
        order = order.to(self.tensors[0].device)
        self.epoch += 1
        for b in range(len(self)):
            idx = order[b * self.batch_size:(b + 1) * self.batch_size]
            yield tuple(t[idx] for t in self.tensors)


class EvalShardLoader:
    """This data rank's contiguous block of a test set, in order, as (x, y, weight) batches; weight is 1.0 for
    the rank's own samples and 0.0 for padding. Every rank yields len() batches of `batch_size` rows or fewer,
    the same count on every rank; the blocks of all ranks together hold each sample exactly once with weight 1.

    `dataset_size` is the whole test set's size; `course_lib.loop.evaluate` sums the weighted loss and hits.
    """

    def __init__(self, *tensors: torch.Tensor, batch_size: int = 1000, rank: int = 0, world_size: int = 1):
        if not tensors or any(len(t) != len(tensors[0]) for t in tensors):
            raise ValueError("EvalShardLoader needs one or more tensors of the same length")
        positive_int("batch_size", batch_size)
        _check_rank(rank, world_size)
        self.tensors, self.batch_size, self.rank, self.world_size = tensors, batch_size, rank, world_size
        self.dataset_size = len(tensors[0])
        self.per_rank = -(-self.dataset_size // world_size)
        self.start = min(rank * self.per_rank, self.dataset_size)
        self.own = min(self.per_rank, self.dataset_size - self.start)     # 0 where n < world_size

    def __len__(self) -> int:
        return -(-self.per_rank // self.batch_size)

    def __iter__(self):
        device = self.tensors[0].device
        for b in range(len(self)):
            lo, hi = b * self.batch_size, min((b + 1) * self.batch_size, self.per_rank)
            idx = torch.arange(lo, hi, device=device)
            weight = (idx < self.own).to(torch.float32)
            idx = torch.where(idx < self.own, self.start + idx, torch.zeros_like(idx)).clamp_(max=self.dataset_size - 1)
            yield (*(t[idx] for t in self.tensors), weight)
