"""The checks of exercise notebook 10 pass the reference solutions and fail stubs and wrong answers."""
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

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


def uncut_start(n, rank, world_size):             # only the stop is cut at n: the last ranks start past n
    s = -(-n // world_size)
    return rank * s, min((rank + 1) * s, n)


def rounded_size(n, rank, world_size):             # round(n / N): too short whenever it rounds down
    s = round(n / world_size)
    return min(rank * s, n), min((rank + 1) * s, n)


def start_and_length(n, rank, world_size):         # (start, size) instead of (start, stop)
    s = -(-n // world_size)
    return min(rank * s, n), min(s, n - min(rank * s, n))


def reversed_ranks(n, rank, world_size):           # covers everything, but rank 0 owns the last slice
    return shard_range(n, world_size - 1 - rank, world_size)


@pytest.mark.parametrize("wrong, message", [
    (floor_split, "belong to no rank.*n // world_size: the remainder is lost"), (balanced_split, "balanced split"),
    (uncut_split, "outside"), (lambda n, r, w: [0, n], "tuple of two ints"),
    (off_by_one_stop, "belong to no rank.*stop is exclusive"), (float_bounds, "tuple of two ints"),
    (overlapping, "overlap"), (uncut_start, "starts after it stops"),
    (rounded_size, "belong to no rank.*slices are 2 long"),
    (start_and_length, "starts after it stops"), (reversed_ranks, "in order"),
    (lambda n, r, w: tuple(torch.tensor(shard_range(n, r, w))), "tuple of two ints"),
    (lambda n, r, w: tuple(np.int64(i) for i in shard_range(n, r, w)), "tuple of two ints"),
])
def test_wrong_shard_ranges_fail(wrong, message):
    with pytest.raises(AssertionError, match=f"(?s){message}"):
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


class LazyBuffers(ShardedSGD):
    """Buffers made at the first step; `make` says how from the gradient slice, `update` how later steps go."""

    make, in_place = staticmethod(lambda g: g), True

    def __init__(self, param, world_size, lr, momentum=0.9):
        super().__init__(param, world_size, lr, momentum)
        self.buffers = [None] * world_size

    def step(self, grad):
        for r, (start, stop) in enumerate(self.ranges):
            if self.buffers[r] is None:
                self.buffers[r] = self.make(grad[start:stop])
            elif self.in_place:
                self.buffers[r].mul_(self.momentum).add_(grad[start:stop])
            else:
                self.buffers[r] = self.momentum * self.buffers[r] + grad[start:stop]
            self.replicas[r][start:stop] -= self.lr * self.buffers[r]
        for r, (start, stop) in enumerate(self.ranges):
            for replica in self.replicas:
                replica[start:stop] = self.replicas[r][start:stop]


class AliasedInPlace(LazyBuffers):
    """buf = grad[start:stop] at the first step, then buf.mul_().add_(): writes into the caller's gradient."""


class AliasedOutOfPlace(LazyBuffers):
    """buf = grad[start:stop] at the first step, then buf = m*buf + g: the caller's refill changes the buffer."""

    in_place = False


class ClonedLazily(LazyBuffers):
    """A different correct answer: torch.optim.SGD's own way, the first buffer a clone of the gradient."""

    make = staticmethod(lambda g: g.clone())


class ScalesTheGrad(ShardedSGD):
    """Folds lr into the gradient in place: grad.mul_(lr) changes the caller's tensor."""

    def step(self, grad):
        grad.mul_(self.lr)
        for r, (start, stop) in enumerate(self.ranges):
            self.buffers[r].mul_(self.momentum).add_(grad[start:stop])
            self.replicas[r][start:stop] -= self.buffers[r]
        for r, (start, stop) in enumerate(self.ranges):
            for replica in self.replicas:
                replica[start:stop] = self.replicas[r][start:stop]


class ParamIsReplicaZero(ShardedSGD):
    """Rank 0's replica is the caller's tensor itself: every step changes the param it was built from."""

    def __init__(self, param, world_size, lr, momentum=0.9):
        super().__init__(param, world_size, lr, momentum)
        self.replicas[0] = param


class HardCoded(ShardedSGD):
    """lr=0.1 and momentum=0.9 written into step, whatever the arguments."""

    def step(self, grad):
        self.lr, self.momentum = 0.1, 0.9
        super().step(grad)


class StepBeforeMomentum(ShardedSGD):
    """p -= lr*v with the previous step's buffer, then the buffer update."""

    def step(self, grad):
        for r, (start, stop) in enumerate(self.ranges):
            self.replicas[r][start:stop] -= self.lr * self.buffers[r]
            self.buffers[r].mul_(self.momentum).add_(grad[start:stop])
        for r, (start, stop) in enumerate(self.ranges):
            for replica in self.replicas:
                replica[start:stop] = self.replicas[r][start:stop]


class Ascent(ShardedSGD):
    """p += lr*v."""

    def step(self, grad):
        super().step(-grad)


class WrongOwnUpdate(ShardedSGD):
    """v = m*v + g + 0.01: no known mistake, so the message says what the owner's update must be."""

    def step(self, grad):
        super().step(grad + 0.01)


class NeverSteps(ShardedSGD):
    """Does nothing (at step 1 that is also p -= lr*v with the zero buffer of the step before)."""

    def step(self, grad):
        pass


@pytest.mark.parametrize("wrong, message", [
    (FullStateOnEveryRank, "momentum buffers of"), (FloorShards, "no rank updated"), (NoAllGather, "did not change"),
    (ForgetsMomentum, "plain SGD without momentum.*momentum update"), (SharedReplicas, "share memory"),
    (GatherBeforeUpdate, "all-gather"), (MomentumOnUpdate, "learning rate is applied twice"),
    (Dampened, "an average"), (AliasedInPlace, "changed the grad .*buffer is the gradient tensor itself"),
    (AliasedOutOfPlace, "buffer is the gradient tensor itself.*refilled"), (ScalesTheGrad, "changed the grad it was"),
    (ParamIsReplicaZero, "changed the param tensor"), (HardCoded, "lr=0.1, momentum=0.9 .*use self.lr"),
    (StepBeforeMomentum, "buffer from the step before"), (Ascent, "WITH the gradient"),
    (WrongOwnUpdate, "parameters differ from torch.optim.SGD at elements"),
    (NeverSteps, "changed no replica at all"),
])
def test_wrong_sharded_sgd_fails(wrong, message):
    with pytest.raises(AssertionError, match=f"(?s){message}"):
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


@pytest.mark.parametrize("correct", [LrFolded, BalancedShards, ClonedLazily])
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


def in_gigabytes(psi, n, stage, k=12):              # GB, not bytes
    return zero_bytes(psi, n, stage, k) / 1e9


@pytest.mark.parametrize("wrong, message", [
    (forgets_k, "stage 0 \\(DDP\\), K=12: you keep 4 bytes per parameter whole"),
    (shards_everything_from_stage_1, "stage 1 \\(ZeRO-1\\), K=12: you keep 0 bytes .* divide 16 by N; ZeRO-1 keeps 4"),
    (fp32_everything, "stage 0 \\(DDP\\), K=12: you keep 20 bytes"),
    (ignores_k_argument, "raising k from 12 to 20 adds 0"), (n_minus_one, "you divide by N - 1"),
    (lambda psi, n, stage, k=12: f"{zero_bytes(psi, n, stage, k)}", "must return a number"),
    (in_gigabytes, "you keep 1.6e-08 bytes"),
    (lambda psi, n, stage, k=12: zero_bytes(7.5e9, n, stage, k), "you keep 1.2e\\+05 bytes"),   # num_params ignored
    (lambda psi, n, stage, k=12: zero_bytes(psi, n, min(stage + 1, 3), k), "stage 0 \\(DDP\\), K=12: you keep 4 "),
    (lambda psi, n, stage, k=12: zero_bytes(psi, n, stage, k) + (stage == 3) * psi / n, "stage 3 .*divide 17 by N"),
])
def test_wrong_zero_bytes_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_zero_bytes(wrong)


# --- drawn inputs ---------------------------------------------------------------------------------

@settings(max_examples=200)
@given(st.integers(1, 300), st.integers(1, 40))
def test_shard_range_is_torch_chunk(n, world):
    """The solution's ranges are torch.chunk's pieces (FSDP2's rule), empty past the last piece."""
    pieces = [len(c) for c in torch.arange(n).chunk(world)] + [0] * world
    got = [shard_range(n, r, world) for r in range(world)]
    assert [b - a for a, b in got] == pieces[:world]
    assert got[0][0] == 0 and all(b == c for (_, b), (c, _) in zip(got, got[1:])) and got[-1][1] == n


@settings(max_examples=25)
@given(st.integers(1, 12), st.integers(1, 6), st.sampled_from([0.01, 0.1, 0.5, 1.0]),
       st.sampled_from([0.0, 0.5, 0.9, 0.99]), st.integers(1, 4), st.integers(0, 2**16))
def test_sharded_sgd_is_torch_sgd(n, world, lr, momentum, steps, seed):
    """The solution's replicas equal torch.optim.SGD on the whole vector, the grad tensor reused in place."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randn(n, generator=g)
    ref = start.clone().requires_grad_(True)
    sgd = torch.optim.SGD([ref], lr=lr, momentum=momentum)
    opt, grad = ShardedSGD(start.clone(), world, lr, momentum), torch.empty(n)
    for _ in range(steps):
        grad.copy_(torch.randn(n, generator=g))
        ref.grad = grad.clone()
        sgd.step()
        opt.step(grad)
        assert all(torch.allclose(r, ref.detach(), atol=1e-5) for r in opt.replicas)
    assert sum(b.numel() for b in opt.buffers) == n


@settings(max_examples=20)
@given(st.integers(2, 12), st.integers(1, 6), st.sampled_from([0.5, 0.9]), st.integers(0, 2**16))
def test_an_aliased_buffer_goes_wrong_on_drawn_inputs(n, world, momentum, seed):
    """Where the caller reuses its gradient tensor, a buffer that is a view of it leaves torch's SGD at step 2."""
    g = torch.Generator().manual_seed(seed)
    start, grads = torch.randn(n, generator=g), [torch.randn(n, generator=g) for _ in range(2)]
    ref = start.clone().requires_grad_(True)
    sgd = torch.optim.SGD([ref], lr=0.1, momentum=momentum)
    opt, grad = AliasedOutOfPlace(start.clone(), world, 0.1, momentum), torch.empty(n)
    for new in grads:
        grad.copy_(new)
        ref.grad = new.clone()
        sgd.step()
        opt.step(grad)
    assert not torch.allclose(opt.replicas[0], ref.detach(), atol=1e-5)


@settings(max_examples=100)
@given(st.floats(1e3, 1e12), st.integers(1, 4096), st.integers(0, 3), st.sampled_from([4, 8, 12, 16, 20]))
def test_zero_bytes_is_the_lectures_zero_memory(psi, n, stage, k):
    from course_lib.distributed.sharding import zero_memory
    assert zero_bytes(psi, n, stage, k) == pytest.approx(zero_memory(psi, n, stage, k)["total"], rel=1e-12)
