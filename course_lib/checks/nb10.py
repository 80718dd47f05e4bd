"""Checks for solutions/10_sharded_training_exercises.ipynb: shard ranges, a sharded optimizer, ZeRO memory.

Compared against torch.chunk (the rule FSDP2 uses to cut each parameter), torch.optim.SGD on the
whole vector, and the published figures of Rajbhandari et al. 2020 (ZeRO, Figure 1).
"""
from __future__ import annotations

import math

import torch

from . import expect, passed

RANGE_CASES = [(10, 4), (12, 4), (5, 4), (7, 2), (1, 3), (9, 1), (1000, 7), (1, 1), (3, 8), (10, 8), (17, 5)]


def check_shard_range(shard_range) -> None:
    """`shard_range(n, rank, world_size) -> (start, stop)`: ceil(n/N)-long slices, the last ones cut at n."""
    for n, world in RANGE_CASES:
        where, s = f"n={n}, world_size={world}", -(-n // world)
        got = [shard_range(n, r, world) for r in range(world)]
        expect(all(isinstance(g, tuple) and len(g) == 2 and all(type(i) is int for i in g) for g in got),
               f"{where}: return a tuple of two ints (start, stop); got {got}")
        for r, (start, stop) in enumerate(got):
            expect(start <= stop, f"{where}: rank {r} got ({start}, {stop}), which starts after it stops. Cut both "
                   f"ends at n: (min(r*s, n), min((r+1)*s, n)) with s = ceil(n/N) = {s}; the ranks past the end own "
                   "the empty range (n, n).")
            expect(0 <= start and stop <= n, f"{where}: rank {r}'s range ({start}, {stop}) reaches outside [0, {n}]. "
                   "Hint: cut the last slices at n (the rest of the padded vector is padding, owned by nobody).")
        owned = [i for start, stop in got for i in range(start, stop)]
        missing = sorted(set(range(n)) - set(owned))
        expect(not missing, f"{where}: elements {missing[:5]} belong to no rank, so nobody updates them. "
               f"{_missing_hint(got, n, world)}")
        twice = sorted({i for i in owned if owned.count(i) > 1})
        expect(not twice, f"{where}: ranges {got} overlap at elements {twice[:5]}; each element must have exactly "
               "one owner, or two ranks would update it.")
        expect([start for start, _ in got] == sorted(start for start, _ in got),
               f"{where}: ranges {got}: rank r owns the r-th slice, in order (rank r starts at r*s).")
        sizes, want = [stop - start for start, stop in got], [len(c) for c in torch.arange(n).chunk(world)]
        want += [0] * (world - len(want))
        hint = (f"Your slices have sizes {sizes}, a balanced split (sizes differ by one): it cannot be gathered "
                "into one padded tensor, which needs equal pieces." if max(sizes) - min(sizes) == 1 else
                "Rank r starts at r*s.")
        expect(sizes == want, f"{where}: slices of sizes {sizes}, expected {want}: every slice is ceil(n/N) = {s} "
               f"long (equal sizes are what all-gather needs), the last ones shorter or empty. {hint}")
    passed("shard_range")


def _missing_hint(got: list, n: int, world: int) -> str:
    """What the ranges the answer returned do, where they leave elements without an owner."""
    ordered = sorted(got)
    for (_, stop), (start, _) in zip(ordered, ordered[1:]):
        if start > stop:
            return (f"One range stops at {stop} and the next starts at {start}: stop is exclusive, so the next "
                    "range must start exactly where this one stops.")
    sizes = {stop - start for start, stop in got}
    short = " = n // world_size: the remainder is lost" if sizes == {n // world} else ""
    return (f"The slices are {max(sizes)} long{short}; they must be s = ceil(n/N) = {-(-n // world)} "
            "(-(-n // world_size)) to cover all n.")


# (n, world_size, lr, momentum): sizes not divisible, more ranks than elements, one rank, and other
# hyperparameters than the defaults (an answer must use its arguments).
# lr is never 1 - momentum, where v = m*v + lr*g and v = m*v + (1-m)*g coincide.
SGD_CASES = [(11, 4, 0.05, 0.9), (5, 4, 0.2, 0.9), (7, 3, 0.3, 0.5), (8, 2, 0.1, 0.8), (6, 1, 0.05, 0.9),
             (3, 5, 0.05, 0.9), (1, 2, 0.05, 0.0)]
STEPS = 5


def _trajectory(start, grads, lr, momentum, mistake: str = "") -> list:
    """The parameters after each step of SGD with momentum on the whole vector, or with one `mistake`."""
    p, v, out = start.double().clone(), torch.zeros_like(start, dtype=torch.float64), []
    for step, g in enumerate(grads):
        g = g.double()
        if mistake == "aliased" and step == 1:
            v = g.clone()                      # the buffer was the caller's tensor, refilled with this gradient
        old = v
        v = {"no momentum": g, "dampened": momentum * v + (1 - momentum) * g,
             "lr twice": momentum * v + lr * g}.get(mistake, momentum * v + g)
        p = p + lr * v if mistake == "sign" else p - lr * (old if mistake == "stale buffer" else v)
        out.append(p.clone())
    return out


MISTAKES = {
    "no momentum": "these are the steps of plain SGD without momentum: the momentum update v = momentum*v + g "
                   "needs each rank's buffer to persist across steps (keep it in self.buffers, do not recreate it)",
    "dampened": "these are the steps of v = momentum*v + (1 - momentum)*g, an average; torch's momentum update "
                "is v = momentum*v + g (dampening=0)",
    "lr twice": "these are the steps of v = momentum*v + lr*g followed by p -= lr*v: the learning rate is applied "
                "twice; the momentum update is v = momentum*v + g, then p -= lr*v",
    "stale buffer": "these are the steps of p -= lr*v with the buffer from the step before: update the buffer "
                    "first (momentum update v = momentum*v + g), then p -= lr*v",
    "sign": "the parameters move WITH the gradient: p -= lr*v (descent), not +=",
    "aliased": "the momentum buffer is the gradient tensor itself: at the first step it was set to grad[start:stop], "
               "a view of the caller's tensor, not a copy, and when the caller refilled that tensor with the next "
               "gradient the buffer changed with it. Start from zeros, or copy: grad[start:stop].clone() "
               "(torch.optim.SGD clones)",
}


def check_sharded_sgd(ShardedSGD) -> None:
    """`ShardedSGD(param, world_size, lr, momentum)` simulates ZeRO-1 SGD with momentum on world_size ranks.

    It must keep `replicas` (each rank's full copy of the parameters) and `buffers` (each rank's momentum
    buffer, for its own shard only); `step(grad)` must leave every replica equal to torch.optim.SGD's result,
    and change neither the parameter it was built from nor `grad`, which the caller refills in place for the
    next step, as a training loop refills p.grad. Judged by the parameters and the buffers' sizes, not by
    what a buffer holds: a buffer kept with the learning rate folded in (v = m*v + lr*g; p -= v) is the same
    optimizer while lr is constant.
    """
    for n, world, lr, momentum in SGD_CASES:
        where = f"n={n}, world_size={world}, lr={lr}, momentum={momentum}"
        g = torch.Generator().manual_seed(n * 10 + world)
        start = torch.randn(n, generator=g)
        grads = [torch.randn(n, generator=g) for _ in range(STEPS)]
        refs = _torch_sgd(start, grads, lr, momentum)
        param = start.clone()
        opt = ShardedSGD(param, world, lr, momentum)
        expect(len(opt.buffers) == world and len(opt.replicas) == world,
               f"world_size={world}: expected {world} replicas and {world} momentum buffers (one per rank); got "
               f"{len(opt.replicas)} and {len(opt.buffers)}")
        expect(len({r.data_ptr() for r in opt.replicas}) == world,
               "the replicas share memory: each simulated rank must hold its OWN copy (param.clone()), as separate "
               "processes would; otherwise the all-gather is never exercised.")
        grad, history, first = torch.empty(n), [[r.clone() for r in opt.replicas]], None
        for step, new in enumerate(grads):
            grad.copy_(new)                    # one tensor, refilled in place every step, as p.grad is
            try:
                opt.step(grad)
            except Exception:
                if first is None:
                    raise
                break                          # already wrong: diagnose from the steps it made
            expect(torch.equal(grad, new), f"{where}, step {step + 1}: step() changed the grad it was given"
                   f"{_aliased(opt.buffers, grad)}; the caller reuses that tensor (as p.grad is refilled in place), "
                   "so step must only read it.")
            history.append([r.clone() for r in opt.replicas])
            if first is None and any(not torch.allclose(r, refs[step], atol=1e-5, rtol=0) for r in opt.replicas):
                first = step
        if first is not None:                  # the later steps tell mistakes apart that look alike in one step
            raise AssertionError(f"{where}, step {first + 1}: "
                                 + _sgd_mistake(history, first, start, grads, lr, momentum, refs) + ".")
        expect(torch.equal(param, start), f"{where}: ShardedSGD changed the param tensor it was built from: the "
               "replicas must be copies (param.detach().clone()), not the caller's tensor.")
        sizes = [b.numel() for b in opt.buffers]
        expect(max(sizes) <= math.ceil(n / world),
               f"{where}: momentum buffers of {sizes} elements. Under ZeRO-1 a rank keeps optimizer state for its "
               f"own shard only (at most ceil(n/N) = {math.ceil(n / world)} values); a full-size buffer on every "
               "rank is DDP's memory, not ZeRO's.")
    passed("ShardedSGD")


def _aliased(buffers, grad) -> str:
    """Why grad changed, where a buffer now holds exactly a slice of it: the buffer is a view of grad."""
    for r, b in enumerate(buffers):
        b = torch.as_tensor(b).detach().flatten()
        if b.numel() and any(torch.equal(b, grad[o:o + b.numel()]) for o in range(grad.numel() - b.numel() + 1)):
            return (f": rank {r}'s momentum buffer is the gradient tensor itself (a view such as grad[start:stop], "
                    "not a copy), so updating the buffer in place (mul_, add_) wrote into the caller's gradient. "
                    "Start the buffer from zeros or copy the slice: grad[start:stop].clone() (torch.optim.SGD clones)")
    return ""


def _torch_sgd(start, grads, lr, momentum) -> list:
    """torch.optim.SGD's parameters after each step."""
    ref = start.clone().requires_grad_(True)
    sgd, out = torch.optim.SGD([ref], lr=lr, momentum=momentum), []
    for g in grads:
        ref.grad = g.clone()
        sgd.step()
        out.append(ref.detach().clone())
    return out


def _sgd_mistake(history, first, start, grads, lr, momentum, refs) -> str:
    """Name what the replicas show: a known wrong update over all the steps made, an element without an owner,
    a missing all-gather. history[j]: the replicas before step j + 1 (history[0]: as built)."""
    known = [(f"every replica differs from torch.optim.SGD: {why}", _trajectory(start, grads, lr, momentum, mistake))
             for mistake, why in MISTAKES.items()]
    if (lr, momentum) != (0.1, 0.9):
        known.append(("the replicas follow SGD with lr=0.1, momentum=0.9 (the defaults), not the arguments given: "
                      "use self.lr and self.momentum", _trajectory(start, grads, 0.1, 0.9)))
    matches = [why for why, traj in known
               if all(torch.allclose(r.double(), traj[j], atol=1e-5, rtol=0)
                      for j, replicas in enumerate(history[1:]) for r in replicas)]
    if len(matches) == 1:                      # two that coincide on this case would be a guess
        return matches[0]
    replicas, before, want = history[first + 1], history[first], refs[first]
    if all(torch.equal(q, p) for q, p in zip(replicas, before)):
        return "step() changed no replica at all: each rank must update its slice of its own replica in place"
    for r, replica in enumerate(replicas):
        wrong = ((replica - want).abs() > 1e-5).nonzero().flatten().tolist()
        if not wrong:
            continue
        stale = [i for i in wrong if all(q[i] == p[i] for q, p in zip(replicas, before))]
        if stale:
            return (f"no rank updated elements {stale[:6]} in this step: every element needs an owner (the ranks' "
                    "ranges must cover all n elements)")
        if all(replica[i] == before[r][i] for i in wrong):
            return (f"rank {r}'s copy of elements {wrong[:6]} did not change in this step, though another rank "
                    "updated them: after every rank steps its shard, all-gather (copy each rank's updated shard "
                    "into every replica)")
        if first and torch.allclose(replica[wrong], refs[first - 1][wrong], atol=1e-5, rtol=0):
            return (f"rank {r}'s copy of elements {wrong[:6]} holds the values of the step before: all-gather "
                    "AFTER every rank has updated its shard")
        return (f"rank {r}'s parameters differ from torch.optim.SGD at elements {wrong[:6]}: each rank updates "
                "its slice with v = momentum*v + grad[start:stop], then replica[start:stop] -= lr*v, with a buffer "
                "that persists across steps")
    return "the replicas differ from torch.optim.SGD"


# Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B parameters, N = 64 ranks, K = 12; GB per rank, as printed.
PAPER_7_5B_N64_GB = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}


# Bytes per parameter per stage, K = 12: (kept whole on every rank, divided by N), and what each part holds.
SPLIT = {0: (16, 0, "everything", "nothing"), 1: (4, 12, "fp16 parameters and gradients", "the optimizer state"),
         2: (2, 14, "fp16 parameters", "gradients and optimizer state"), 3: (0, 16, "nothing", "everything")}


def check_zero_bytes(zero_bytes) -> None:
    """`zero_bytes(num_params, world_size, stage, k=12) -> float`: bytes per rank under DDP/ZeRO-1/2/3.

    Read off the answer: the bytes per parameter it keeps whole and those it divides by N (from N = 1 and 2),
    checked to hold for other N, then how k enters; last the paper's own figures."""
    psi = 1e6

    def per_param(n, stage, k=12):
        got = zero_bytes(psi, n, stage, k=k)
        expect(isinstance(got, (int, float)) and not isinstance(got, bool),
               f"zero_bytes must return a number of bytes; got {type(got).__name__}")
        return got / psi

    for stage, (whole, split, kept, sharded) in SPLIT.items():
        name = "DDP" if stage == 0 else f"ZeRO-{stage}"
        at = {n: per_param(n, stage) for n in (1, 2, 3, 5, 64)}
        a, b = 2 * at[2] - at[1], 2 * (at[1] - at[2])          # at[n] = a + b / n
        if any(abs(at[n] - (a + b / n)) > 1e-6 * at[1] for n in (3, 5, 64)):
            c = 2 * (at[2] - at[3])                             # at[n] = a' + c / (n - 1), from n = 2 and 3
            minus_one = all(abs(at[n] - (at[2] - c + c / (n - 1))) <= 1e-6 * at[2] for n in (5, 64))
            raise AssertionError(f"stage {stage} ({name}): bytes per parameter {[round(at[n], 4) for n in at]} on "
                                 f"N = {list(at)} ranks do not fall as a + b/N" + (
                                     ": you divide by N - 1; every one of the N ranks holds 1/N of a sharded part"
                                     if minus_one else ": every rank holds 1/N of each sharded part") + ".")
        expect(abs(a - whole) < 1e-6 and abs(b - split) < 1e-6,
               f"stage {stage} ({name}), K=12: you keep {a:.4g} bytes per parameter whole on every rank and divide "
               f"{b:.4g} by N; {name} keeps {whole} whole ({kept}) and divides {split} by N ({sharded}). Hint: 2Ψ "
               "fp16 parameters + 2Ψ fp16 gradients + KΨ optimizer state; stage 1 shards the optimizer state, "
               "stage 2 also the gradients, stage 3 also the parameters.")
        for n in (1, 4):
            slope = (per_param(n, stage, k=20) - per_param(n, stage, k=12)) / 8
            want = 1 if stage == 0 else 1 / n
            expect(abs(slope - want) < 1e-9,
                   f"stage {stage} ({name}), N={n}: raising k from 12 to 20 adds {slope:.3g}·8 bytes per parameter; "
                   f"the optimizer state is KΨ{'' if stage == 0 else ' / N'}, so it must add {want:.3g}·8. Hint: "
                   "use the k argument, K bytes per parameter, sharded from stage 1.")
    for stage, gb in PAPER_7_5B_N64_GB.items():
        got = zero_bytes(7.5e9, 64, stage)
        expect(abs(got / 1e9 - gb) <= 0.05 + 1e-9,
               f"stage {stage}, Ψ=7.5B, N=64: the paper has {gb} GB per rank, you get {got / 1e9:.3g} GB. The bytes "
               "must be proportional to num_params (use the argument; 1 GB = 10⁹ bytes).")
    passed("zero_bytes")
