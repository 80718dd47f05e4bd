"""The checks of exercise notebook 10 pass the reference solutions and fail stubs and wrong answers."""
import pytest
import torch

from course_lib.checks.nb10 import check_shard_range, check_sharded_sgd, check_zero_bytes
from nbtools import ROOT, notebook_namespace

NS = notebook_namespace(ROOT / "solutions" / "10_sharded_training_exercises.ipynb")
shard_range, ShardedSGD, zero_bytes = NS["shard_range"], NS["ShardedSGD"], NS["zero_bytes"]


def stub(*args, **kwargs):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_shard_range(shard_range)
    check_sharded_sgd(ShardedSGD)
    check_zero_bytes(zero_bytes)


def test_stubs_fail():
    for check in (check_shard_range, check_sharded_sgd, check_zero_bytes):
        with pytest.raises(NotImplementedError):
            check(stub)


# --- wrong shard ranges -------------------------------------------------------------------------

def floor_split(n, rank, world_size):              # loses the remainder
    s = n // world_size
    return rank * s, (rank + 1) * s


def balanced_split(n, rank, world_size):           # tensor_split sizes: covers all, but not equal padded pieces
    sizes = [len(c) for c in torch.arange(n).tensor_split(world_size)]
    return sum(sizes[:rank]), sum(sizes[:rank + 1])


def uncut_split(n, rank, world_size):              # runs past n on the last rank
    s = -(-n // world_size)
    return rank * s, (rank + 1) * s


@pytest.mark.parametrize("wrong", [floor_split, balanced_split, uncut_split, lambda n, r, w: [0, n]])
def test_wrong_shard_ranges_fail(wrong):
    with pytest.raises(AssertionError):
        check_shard_range(wrong)


# --- wrong sharded optimizers -------------------------------------------------------------------

class FullStateOnEveryRank(ShardedSGD):
    """Shards the update, but every rank keeps a momentum buffer for ALL parameters (DDP's memory)."""

    def __init__(self, param, world_size, lr, momentum=0.9):
        super().__init__(param, world_size, lr, momentum)
        self.buffers = [torch.zeros(param.numel()) for _ in range(world_size)]

    def step(self, grad):
        for r, replica in enumerate(self.replicas):
            self.buffers[r].mul_(self.momentum).add_(grad)
            replica -= self.lr * self.buffers[r]


class FloorShards(ShardedSGD):
    """Uneven split losing the remainder: the last n % world_size elements are never updated."""

    def __init__(self, param, world_size, lr, momentum=0.9):
        super().__init__(param, world_size, lr, momentum)
        self.ranges = [floor_split(param.numel(), r, world_size) for r in range(world_size)]
        self.buffers = [torch.zeros(stop - start) for start, stop in self.ranges]


class NoAllGather(ShardedSGD):
    """Each rank updates its own slice and never receives the others'."""

    def step(self, grad):
        for r, (start, stop) in enumerate(self.ranges):
            self.buffers[r].mul_(self.momentum).add_(grad[start:stop])
            self.replicas[r][start:stop] -= self.lr * self.buffers[r]


class ForgetsMomentum(ShardedSGD):
    """A fresh buffer every step: plain SGD, which matches torch only on the first step."""

    def step(self, grad):
        self.buffers = [torch.zeros_like(b) for b in self.buffers]
        super().step(grad)


class SharedReplicas(ShardedSGD):
    """All 'ranks' share one tensor, so nothing is ever gathered."""

    def __init__(self, param, world_size, lr, momentum=0.9):
        super().__init__(param, world_size, lr, momentum)
        self.replicas = [self.replicas[0]] * world_size


@pytest.mark.parametrize("wrong", [FullStateOnEveryRank, FloorShards, NoAllGather, ForgetsMomentum, SharedReplicas])
def test_wrong_sharded_sgd_fails(wrong):
    with pytest.raises(AssertionError):
        check_sharded_sgd(wrong)


# --- wrong memory formulas ----------------------------------------------------------------------

def forgets_k(psi, n, stage, k=12):                  # parameters and gradients only
    return 2 * psi / (n if stage >= 3 else 1) + 2 * psi / (n if stage >= 2 else 1)


def shards_everything_from_stage_1(psi, n, stage, k=12):
    return (4 + k) * psi / (n if stage >= 1 else 1)


def fp32_everything(psi, n, stage, k=12):           # 4-byte parameters and gradients
    return 4 * psi / (n if stage >= 3 else 1) + 4 * psi / (n if stage >= 2 else 1) + k * psi / (n if stage >= 1 else 1)


def ignores_k_argument(psi, n, stage, k=12):
    return zero_bytes(psi, n, stage)


def n_minus_one(psi, n, stage, k=12):                # "the other ranks" instead of all of them
    return zero_bytes(psi, max(n - 1, 1), stage, k)


@pytest.mark.parametrize("wrong", [forgets_k, shards_everything_from_stage_1, fp32_everything, ignores_k_argument,
                                   n_minus_one, lambda psi, n, stage, k=12: f"{zero_bytes(psi, n, stage, k)}"])
def test_wrong_zero_bytes_fail(wrong):
    with pytest.raises(AssertionError):
        check_zero_bytes(wrong)
