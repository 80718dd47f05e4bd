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


def off_by_one_stop(n, rank, world_size):          # stops one short of the next rank's start
    s = -(-n // world_size)
    return min(rank * s, n), min((rank + 1) * s - 1, n)


def float_bounds(n, rank, world_size):             # true division: floats, and uneven pieces
    return rank * n / world_size, (rank + 1) * n / world_size


def overlapping(n, rank, world_size):              # ceil for the stop, floor for the start
    return rank * (n // world_size), min((rank + 1) * -(-n // world_size), n)


@pytest.mark.parametrize("wrong, message", [(floor_split, "belong to no rank"), (balanced_split, "ceil"),
                                            (uncut_split, "outside"), (lambda n, r, w: [0, n], "tuple of two ints"),
                                            (off_by_one_stop, "belong to no rank"), (float_bounds, "tuple of two ints"),
                                            (overlapping, "overlap")])
def test_wrong_shard_ranges_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_shard_range(wrong)


def test_equivalent_shard_range_passes():
    def with_chunk(n, rank, world_size):         # torch.chunk's pieces, read back as ranges
        sizes = [len(c) for c in torch.arange(n).chunk(world_size)] + [0] * world_size
        start = min(sum(sizes[:rank]), n)
        return start, start + sizes[rank]
    check_shard_range(with_chunk)


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


class GatherBeforeUpdate(ShardedSGD):
    """All-gathers first, then updates: the other ranks' copies are one step behind."""

    def step(self, grad):
        for r, (start, stop) in enumerate(self.ranges):
            for replica in self.replicas:
                replica[start:stop] = self.replicas[r][start:stop]
        for r, (start, stop) in enumerate(self.ranges):
            self.buffers[r].mul_(self.momentum).add_(grad[start:stop])
            self.replicas[r][start:stop] -= self.lr * self.buffers[r]


class MomentumOnUpdate(ShardedSGD):
    """v = m*v + lr*g, then p -= lr*v: the learning rate applied twice."""

    def step(self, grad):
        for r, (start, stop) in enumerate(self.ranges):
            self.buffers[r].mul_(self.momentum).add_(self.lr * grad[start:stop])
            self.replicas[r][start:stop] -= self.lr * self.buffers[r]
        for r, (start, stop) in enumerate(self.ranges):
            for replica in self.replicas:
                replica[start:stop] = self.replicas[r][start:stop]


class Dampened(ShardedSGD):
    """v = m*v + (1-m)*g: an exponential average, not torch's momentum (dampening=0)."""

    def step(self, grad):
        for r, (start, stop) in enumerate(self.ranges):
            self.buffers[r].mul_(self.momentum).add_((1 - self.momentum) * grad[start:stop])
            self.replicas[r][start:stop] -= self.lr * self.buffers[r]
        for r, (start, stop) in enumerate(self.ranges):
            for replica in self.replicas:
                replica[start:stop] = self.replicas[r][start:stop]


@pytest.mark.parametrize("wrong, message", [(FullStateOnEveryRank, "momentum buffers of"),
                                            (FloorShards, "no rank updated"), (NoAllGather, "all-gather"),
                                            (ForgetsMomentum, "momentum update"), (SharedReplicas, "share memory"),
                                            (GatherBeforeUpdate, "all-gather"), (MomentumOnUpdate, "momentum update"),
                                            (Dampened, "momentum update")])
def test_wrong_sharded_sgd_fails(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_sharded_sgd(wrong)


class LrFolded(ShardedSGD):
    """A different correct answer: the buffer keeps lr*v (v' = m*v' + lr*g; p -= v'), the same steps at constant lr."""

    def step(self, grad):
        for r, (start, stop) in enumerate(self.ranges):
            self.buffers[r].mul_(self.momentum).add_(grad[start:stop], alpha=self.lr)
            self.replicas[r][start:stop] -= self.buffers[r]
        for r, (start, stop) in enumerate(self.ranges):
            for replica in self.replicas:
                replica[start:stop] = self.replicas[r][start:stop]


class BalancedShards(ShardedSGD):
    """A different correct answer: tensor_split's balanced shards (sizes differ by one), still at most ceil(n/N)."""

    def __init__(self, param, world_size, lr, momentum=0.9):
        super().__init__(param, world_size, lr, momentum)
        self.ranges = [balanced_split(param.numel(), r, world_size) for r in range(world_size)]
        self.buffers = [torch.zeros(stop - start) for start, stop in self.ranges]


@pytest.mark.parametrize("correct", [LrFolded, BalancedShards])
def test_equivalent_sharded_sgd_passes(correct):
    check_sharded_sgd(correct)


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
