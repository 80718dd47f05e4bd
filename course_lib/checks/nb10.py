"""Checks for solutions/10_sharded_training_exercises.ipynb: shard ranges, a sharded optimizer, ZeRO memory.

Compared against torch.chunk (the rule FSDP2 uses to cut each parameter), torch.optim.SGD on the
whole vector, and the published figures of Rajbhandari et al. 2020 (ZeRO, Figure 1).
"""
from __future__ import annotations

import math

import torch

from . import expect, passed

RANGE_CASES = [(10, 4), (12, 4), (5, 4), (7, 2), (1, 3), (9, 1), (1000, 7)]


def check_shard_range(shard_range) -> None:
    """`shard_range(n, rank, world_size) -> (start, stop)`: ceil(n/N)-long slices, the last ones cut at n."""
    for n, world in RANGE_CASES:
        chunks = torch.arange(n).chunk(world)
        got = [shard_range(n, r, world) for r in range(world)]
        expect(all(isinstance(g, tuple) and len(g) == 2 and all(isinstance(i, int) for i in g) for g in got),
               f"n={n}, world_size={world}: return a tuple of two ints (start, stop); got {got}")
        owned = [i for start, stop in got for i in range(start, stop)]
        missing = sorted(set(range(n)) - set(owned))
        expect(not missing, f"n={n}, world_size={world}: elements {missing[:5]} belong to no rank, so nobody "
               "updates them. Hint: with n // world_size the remainder is lost; use the ceiling -(-n // world_size).")
        expect(all(0 <= start <= stop <= n for start, stop in got),
               f"n={n}, world_size={world}: ranges {got} reach outside [0, n). Hint: cut the last slices at n "
               "(the rest of the padded vector is padding, owned by nobody).")
        expect(len(owned) == len(set(owned)), f"n={n}, world_size={world}: ranges {got} overlap; each element "
               "must have exactly one owner, or two ranks would update it.")
        for r, (start, stop) in enumerate(got):
            expected = chunks[r].tolist() if r < len(chunks) else []
            expect(list(range(start, stop)) == expected,
                   f"n={n}, world_size={world}, rank={r}: got [{start}, {stop}), expected the elements {expected[:3]}"
                   f"{'...' if len(expected) > 3 else ''}. Hint: every slice is ceil(n/N) = {math.ceil(n / world)} long"
                   " (equal sizes are what all-gather needs), rank r starts at r*ceil(n/N); the last ones are shorter"
                   " or empty. A balanced split (sizes differing by one) cannot be gathered into one padded tensor.")
    passed("shard_range")


def check_sharded_sgd(ShardedSGD) -> None:
    """`ShardedSGD(param, world_size, lr, momentum)` simulates ZeRO-1 SGD with momentum on world_size ranks.

    It must keep `replicas` (each rank's full copy of the parameters) and `buffers` (each rank's momentum
    buffer, for its own shard only); `step(grad)` must leave every replica equal to torch.optim.SGD's result.
    Judged by the parameters and the buffers' sizes, not by what a buffer holds: a buffer kept with the learning
    rate folded in (v = m*v + lr*g; p -= v) is the same optimizer while lr is constant.
    """
    lr, momentum = 0.1, 0.9
    for n, world in [(11, 4), (5, 4), (7, 3), (8, 2), (6, 1)]:
        g = torch.Generator().manual_seed(n * 10 + world)
        start = torch.randn(n, generator=g)
        ref = start.clone().requires_grad_(True)
        sgd = torch.optim.SGD([ref], lr=lr, momentum=momentum)
        opt = ShardedSGD(start.clone(), world, lr, momentum)
        expect(len(opt.buffers) == world and len(opt.replicas) == world,
               f"world_size={world}: expected {world} replicas and {world} momentum buffers (one per rank); got "
               f"{len(opt.replicas)} and {len(opt.buffers)}")
        expect(len({r.data_ptr() for r in opt.replicas}) == world,
               "the replicas share memory: each simulated rank must hold its OWN copy (param.clone()), as separate "
               "processes would; otherwise the all-gather is never exercised.")
        for step in range(5):
            grad = torch.randn(n, generator=g)
            ref.grad = grad.clone()
            sgd.step()
            before = [replica.clone() for replica in opt.replicas]
            opt.step(grad.clone())
            for r, replica in enumerate(opt.replicas):
                wrong = (replica - ref.detach()).abs() > 1e-5
                if wrong.any():
                    idx = wrong.nonzero().flatten().tolist()
                    stale = [i for i in idx if all(q[i] == b[i] for q, b in zip(opt.replicas, before))]
                    if stale:
                        hint = (f"no rank updated elements {stale[:6]} at all: every element needs an owner (is the "
                                "remainder n % world_size lost?)")
                    elif any(_owner(n, world, i) == r for i in idx):
                        hint = ("elements this rank owns are wrong: check the momentum update v = momentum*v + g and "
                                "p -= lr*v, and that each rank's buffer persists across steps")
                    else:
                        hint = ("only elements OTHER ranks own are wrong: after every rank steps its shard, "
                                "all-gather (copy each rank's updated shard into every replica)")
                    raise AssertionError(f"n={n}, world_size={world}, step {step + 1}: rank {r}'s parameters differ "
                                         f"from torch.optim.SGD at elements {idx[:6]}; {hint}.")
        sizes = [b.numel() for b in opt.buffers]
        expect(max(sizes) <= math.ceil(n / world),
               f"n={n}, world_size={world}: momentum buffers of {sizes} elements. Under ZeRO-1 a rank keeps "
               f"optimizer state for its own shard only (at most ceil(n/N) = {math.ceil(n / world)} values); "
               "a full-size buffer on every rank is DDP's memory, not ZeRO's.")
    passed("ShardedSGD")


def _owner(n: int, world: int, i: int) -> int:
    return i // math.ceil(n / world)


# Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B parameters, N = 64 ranks, K = 12; GB per rank, as printed.
PAPER_7_5B_N64_GB = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}


def check_zero_bytes(zero_bytes) -> None:
    """`zero_bytes(num_params, world_size, stage, k=12) -> float`: bytes per rank under DDP/ZeRO-1/2/3."""
    for stage, gb in PAPER_7_5B_N64_GB.items():
        got = zero_bytes(7.5e9, 64, stage)
        expect(isinstance(got, (int, float)) and not isinstance(got, bool),
               f"zero_bytes must return a number of bytes; got {type(got).__name__}")
        expect(abs(got / 1e9 - gb) <= 0.05 + 1e-9,
               f"stage {stage}, Ψ=7.5B, N=64: the paper has {gb} GB per rank, you get {got / 1e9:.3g} GB. Hint: "
               "2Ψ fp16 parameters + 2Ψ fp16 gradients + KΨ optimizer state (K=12); stage 1 divides the "
               "optimizer state by N, stage 2 also the gradients, stage 3 also the parameters.")
    psi = 1e6
    for n in (1, 2, 8):
        expect(abs(zero_bytes(psi, n, 0) - 16 * psi) < 1e-6 * psi,
               f"stage 0 (DDP) on {n} ranks: every rank keeps everything, 16 bytes per parameter; "
               f"got {zero_bytes(psi, n, 0) / psi:.3g}.")
    for stage in range(4):
        expect(abs(zero_bytes(psi, 1, stage) - 16 * psi) < 1e-6 * psi,
               f"stage {stage} on ONE rank: there is nothing to shard with, so 16 bytes per parameter; got "
               f"{zero_bytes(psi, 1, stage) / psi:.3g}.")
        slope = (zero_bytes(psi, 4, stage, k=20) - zero_bytes(psi, 4, stage, k=12)) / (8 * psi)
        expect(abs(slope - (1 if stage == 0 else 1 / 4)) < 1e-9,
               f"stage {stage}, N=4: raising k by 8 should add 8Ψ bytes of optimizer state{' / N' if stage else ''}"
               f"; you add {slope:.3g}·8Ψ. Hint: use the k argument, K bytes per parameter, sharded from stage 1.")
    passed("zero_bytes")
