"""Checks for solutions/07_ddp_exercises.ipynb: which samples a rank sees; who writes checkpoints;
bucketed all-reduce hooks that overlap backward.

Compared against torch's DistributedSampler (no process group needed: num_replicas and rank
are passed explicitly), against the rules of rank-0-only checkpointing, and against torch's
DistributedDataParallel on 2 gloo ranks. Overlap is judged by ORDER and by WAITING, not by time: the
check logs each gradient as autograd produces it and each dist.all_reduce call, and asks that every
bucket's all-reduce is launched (async) once its gradients are ready, while later gradients are still to
come. In the first step rank 1 is held back until rank 0 first waits for an all-reduce (any work's or
future's wait, or a poll of one) or its finish() has returned, so none of rank 0's all-reduces can complete
unless rank 0 waited for it: one completed when backward moved on means a hook waited; one still in flight
when finish() returned means finish() never waited for it. Both are then certain, not a race.
"""
from __future__ import annotations

import copy
import datetime
import io
import tokenize

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data.distributed import DistributedSampler

from . import answer_source, expect, passed, run_on_ranks
from ..grading.student import compile_source
from ..models import max_diff

CASES = [(10, 3), (12, 4), (5, 2), (2, 3), (9, 1), (3, 8), (1, 4)]   # (n, world_size): n < world_size repeats
SEEDS = {0: 42, 1: 0, 7: 5}                                             # epoch: seed


def _sampler(n: int, world: int, rank: int, epoch: int, seed: int, drop_last: bool = False) -> list:
    sampler = DistributedSampler(range(n), world, rank, shuffle=True, seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


def _names(source: str) -> set:
    """The names `source` uses (not those in comments or strings)."""
    try:
        return {t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.NAME}
    except (tokenize.TokenError, SyntaxError):
        return set()


def _shard_mistake(shards: list, wanted: list, n: int, world: int, r: int, epoch: int, seed: int) -> str:
    """What rank r's wrong shard is, where it equals what a known mistake gives."""
    shard = shards[r]
    if epoch and shard == _sampler(n, world, r, 0, seed):
        return ("the same indices as in epoch 0: the epoch is ignored (the sampler's set_epoch). Seed the "
                "permutation with seed + epoch, or every epoch repeats the same batches.")
    if seed and shard == _sampler(n, world, r, epoch, 0):
        return "the seed is ignored: seed the generator with seed + epoch (every run of a job picks its own seed)."
    if n % world and shard == _sampler(n, world, r, epoch, seed, drop_last=True):
        return ("you dropped the last n % world_size indices (drop_last=True); DistributedSampler's default pads "
                "with the permutation's own first indices instead, so no sample is lost.")
    if sorted(sum(shards, [])) == sorted(sum(wanted, [])):
        return ("the ranks together get the right samples, but this rank the wrong ones. Hint: rank r takes every "
                "world_size-th index of the padded permutation, starting at r (indices[r::world_size]), not a "
                "contiguous chunk.")
    return (f"expected {wanted[r]}, got {shard}. Hint: torch.randperm(n, generator=g) with g.manual_seed(seed + "
            "epoch); pad with the permutation's FIRST indices (repeating them if needed); rank r takes "
            "indices[r::world_size].")


def check_shard_indices(shard_indices) -> None:
    """`shard_indices(n, rank, world_size, epoch, seed) -> list[int]` equals DistributedSampler's."""
    expect("DistributedSampler" not in _names(answer_source(shard_indices)), "shard_indices uses "
           "DistributedSampler: the exercise is to write what it does (permute, pad, take every world_size-th)")
    for n, world in CASES:
        for epoch, seed in SEEDS.items():
            rng = torch.get_rng_state()
            shards = [list(shard_indices(n, r, world, epoch, seed)) for r in range(world)]
            expect(torch.equal(rng, torch.get_rng_state()), "shard_indices changed torch's global random state "
                   "(torch.manual_seed, or torch.randperm without a generator): the training's own randomness "
                   "(initialisation, dropout) would then restart from the same seed every epoch. Draw from a "
                   "torch.Generator of your own.")
            lengths = [len(s) for s in shards]
            expect(len(set(lengths)) == 1,
                   f"n={n}, world_size={world}: ranks got {lengths} samples. Every rank must get the same "
                   "number, or the rank with fewer batches leaves while the others wait in all-reduce forever. "
                   "Hint: pad the permutation with its own first indices up to a multiple of world_size "
                   f"({-(-n // world) * world} here), repeating them if needed.")
            wanted = [_sampler(n, world, r, epoch, seed) for r in range(world)]
            for r, (shard, expected) in enumerate(zip(shards, wanted)):
                expect(shard == expected, f"n={n}, world_size={world}, rank={r}, epoch={epoch}, seed={seed}: "
                       + _shard_mistake(shards, wanted, n, world, r, epoch, seed))
    passed("shard_indices")


def check_should_checkpoint(should_checkpoint) -> None:
    """`should_checkpoint(rank, step, every) -> bool`: rank 0 only, after every `every`-th step."""
    for rank, step, every, want in [(1, 10, 5, False), (3, 5, 5, False), (0, 10, 5, True), (0, 5, 5, True),
                                    (0, 7, 5, False), (0, 0, 5, False), (0, 1, 1, True), (0, 4, 3, False),
                                    (0, 3, 5, False), (0, 0, 1, False), (0, 1000, 250, True), (7, 0, 5, False),
                                    (1, 1, 1, False), (0, 2, 1, True)]:
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

WIDTHS = (20, 24, 32, 16, 5)     # 4 Linear layers; the second has no bias
BUCKET_LAYERS = ((3,), (2, 1), (0,))   # last layer first; buckets of 2, 3 and 2 parameters, each of another size
STEPS = 2                        # the second step shows that the hooks reset after the first
HOLD_S = 3.0   # step 1: rank 1 starts backward once rank 0 waits, or after this long (a safety net for a wait
               # not watched here: a right answer that never waits as watched pays it once)
STARTS, RELEASED = "nb07/rank 0 starts backward", "nb07/rank 0 waits, or is done"   # store keys, for the hold
# What rank 0 may wait with (torch.futures.wait_all and then-chains go through Future.wait), and the originals:
# the hold watches these; the recorder looks through the originals, so its own look releases nothing.
WATCHED = {(cls, name): getattr(cls, name) for cls in (dist.Work, torch._C.Future)
           for name in ("wait", "is_completed" if cls is dist.Work else "done")}


def _model() -> nn.Sequential:
    torch.manual_seed(0)         # the same weights on every rank
    layers = [m for i, (a, b) in enumerate(zip(WIDTHS, WIDTHS[1:])) for m in (nn.Linear(a, b, bias=i != 1), nn.Tanh())]
    return nn.Sequential(*layers[:-1])


def _bucket_indices() -> list:
    """Per bucket, the indices (in model.parameters()) of its parameters."""
    model = _model()
    index = {id(p): i for i, p in enumerate(model.parameters())}
    linears = [m for m in model if isinstance(m, nn.Linear)]
    return [[index[id(p)] for layer in group for p in linears[layer].parameters()] for group in BUCKET_LAYERS]


class _Recorder:
    """The event log of one backward pass: ("grad", param index), ("all_reduce", numel, async_op) and
    ("backward returned",); for each all-reduce, whether its work had completed at the next event (the next
    gradient, or backward's return: backward moved on) and after finish()."""

    def __init__(self):
        self.log, self.works, self.done_at_next_event = [], [], []

    def event(self, entry: tuple) -> None:
        self.done_at_next_event += [self.done(w) for w in self.works[len(self.done_at_next_event):]]
        self.log.append(entry)

    @staticmethod
    def done(work) -> bool:
        # A blocking all_reduce returns None: done. gloo completes a work's future before the work itself
        # (ProcessGroupGloo's finishWorkGloo: the future's result, then finish()), so an answer that waited on the
        # future (get_future().wait(), torch.futures.wait_all) can see is_completed() False for a moment.
        return (work is None or WATCHED[dist.Work, "is_completed"](work)
                or WATCHED[torch._C.Future, "done"](work.get_future()))


class _Hold:
    """Step 1's hold: rank 1 starts its backward only once rank 0 has started waiting for an all-reduce, or has
    returned from finish() (HOLD_S at most). No all-reduce of rank 0 can complete before rank 1 launches it."""

    def __init__(self, rank: int):
        self.rank, self.armed = rank, False
        self.store = dist.distributed_c10d._get_default_store()

    def __enter__(self):
        def watched(original):
            def call(obj, *args, **kwargs):
                self.release()            # rank 0 starts to wait: now rank 1 may launch
                return original(obj, *args, **kwargs)
            return call
        for (cls, name), original in WATCHED.items():
            setattr(cls, name, watched(original))
        return self

    def __exit__(self, *exc) -> None:
        for (cls, name), original in WATCHED.items():
            setattr(cls, name, original)

    def start(self, step: int) -> None:
        """Before a backward: in step 1, rank 0 says it starts and arms; rank 1 waits to be released."""
        if step != 0:
            return
        if self.rank == 0:
            self.store.set(STARTS, "1")
            self.armed = True
        elif self.rank == 1:
            for key, seconds in ((STARTS, 60), (RELEASED, HOLD_S)):
                try:
                    self.store.wait([key], datetime.timedelta(seconds=seconds))
                except dist.DistStoreError:
                    pass

    def release(self) -> None:
        if self.armed:
            self.armed = False
            self.store.set(RELEASED, "1")


def bucket_hook_cases(rank: int, world_size: int, source: str, name: str) -> list:
    """Worker: attach the learner's hooks, run STEPS backward passes; per step the event log, which all-reduces were
    still in flight when backward moved on and when finish() returned, and the gradients' distance to torch DDP's
    (the mean over ranks), to the sum over ranks and to this rank's own gradient."""
    fn = compile_source(source, name)
    model, plain = _model(), _model()
    reference = nn.parallel.DistributedDataParallel(copy.deepcopy(model))
    params = list(model.parameters())
    buckets = [[params[i] for i in bucket] for bucket in _bucket_indices()]
    now = {"rec": _Recorder()}
    for i, p in enumerate(params):      # registered before the learner's: each "grad" precedes its hooks
        p.register_post_accumulate_grad_hook(lambda p, i=i: now["rec"].event(("grad", i)))
    original = dist.all_reduce

    def recording(tensor, *args, **kwargs):
        async_op = bool(kwargs.get("async_op", args[2] if len(args) > 2 else False))
        now["rec"].log.append(("all_reduce", tensor.numel(), async_op))
        work = original(tensor, *args, **kwargs)
        now["rec"].works.append(work if async_op else None)
        return work
    dist.all_reduce = recording
    out = []
    try:
        finish = fn(buckets)
        with _Hold(rank) as hold:
            out = [_step(rank, world_size, step, model, plain, reference, finish, now, hold) for step in range(STEPS)]
    finally:
        dist.all_reduce = original
    return out


def _step(rank: int, world_size: int, step: int, model, plain, reference, finish, now: dict, hold: _Hold) -> dict:
    """One backward pass with the learner's hooks, then finish(); what the worker's docstring lists."""
    params = list(model.parameters())
    g = torch.Generator().manual_seed(10 * rank + step)
    x, y = torch.randn(8, WIDTHS[0], generator=g), torch.randint(0, WIDTHS[-1], (8,), generator=g)
    model.zero_grad()
    rec = now["rec"] = _Recorder()
    loss = nn.functional.cross_entropy(model(x), y)
    hold.start(step)
    try:
        try:
            loss.backward()
        except AttributeError as exc:
            if "NoneType" not in str(exc):
                raise
            raise RuntimeError(f"step {step + 1}: {exc}: a hook read a gradient that backward has not produced "
                               "yet (p.grad is None); launch a bucket only when ALL its gradients are ready") from None
        finally:
            rec.event(("backward returned",))
        if callable(finish):
            finish()
        done_after_finish = [rec.done(w) for w in rec.works]   # now: DDP's all-reduces below wait for all
    finally:
        hold.release()     # also when backward or finish() failed
    reference.zero_grad()
    nn.functional.cross_entropy(reference(x), y).backward()
    plain.zero_grad()
    nn.functional.cross_entropy(plain(x), y).backward()
    grads = [p.grad if p.grad is not None else torch.full_like(p, float("nan")) for p in params]
    mean = [p.grad for p in reference.parameters()]
    own = [p.grad for p in plain.parameters()]
    return {"log": list(rec.log), "finish_callable": callable(finish), "done_at_next_event": rec.done_at_next_event,
            "done_after_finish": done_after_finish,
            "error": max_diff(grads, mean), "error_vs_sum": max_diff(grads, [world_size * m for m in mean]),
            "error_vs_own": min(max_diff(grads, own), max_diff(grads, [o / world_size for o in own]))}


def _bucket_numels() -> list:
    params = list(_model().parameters())
    return [sum(params[i].numel() for i in bucket) for bucket in _bucket_indices()]


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
    for rank, steps in enumerate(results):
        for step, case in enumerate(steps):
            where = f"rank {rank}, step {step + 1}"
            expect(case["finish_callable"], "return a function finish() that waits for the all-reduces")
            _judge_launches(where, case["log"], step)
            _judge_overlap(where, case, rank == 0 and step == 0)
            _judge_gradients(where, case)


def _judge_launches(where: str, log: list, step: int) -> None:
    """One async all-reduce per bucket, in bucket order, each launched once its own gradients are all ready."""
    numels, buckets = _bucket_numels(), _bucket_indices()
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
        expect(all(grad_at[j] < i for j in buckets[b]), f"{where}: bucket {b} ({len(buckets[b])} parameters) was "
               "all-reduced before all its gradients were ready; count the ready gradients per bucket and launch "
               "when the count reaches the bucket's size.")
        expect(b == len(numels) - 1 or i < last_grad,
               f"{where}: bucket {b}'s all-reduce was launched only when backward had produced its last "
               "gradient: no overlap. Launch a bucket as soon as ITS gradients are all ready.")
    expect(all(log[i][2] for i in launches),
           f"{where}: dist.all_reduce without async_op=True blocks backward until the bucket has "
           "travelled; launch it with async_op=True and wait for the work objects in finish().")


def _judge_overlap(where: str, case: dict, rank_1_held: bool) -> None:
    """Each all-reduce still in flight when backward moved on (judged where rank 1 held its launches back until
    rank 0 waited), and completed when finish() returned."""
    for b, done in enumerate(case["done_at_next_event"] if rank_1_held else []):
        expect(not done, f"{where}: bucket {b}'s all-reduce had already completed when backward went on, although "
               "rank 1 launched its all-reduces only once rank 0 waited for one: the hook waited for the "
               "all-reduce (work.wait(), .get_future().wait(), or another blocking call), and backward stood still "
               "while the bucket travelled: nothing overlaps. Keep the work and wait for it in finish().")
    for b, done in enumerate(case["done_after_finish"]):
        expect(done, f"{where}: bucket {b}'s all-reduce was still in flight when finish() returned: call wait() on "
               "each work in finish(), before reading the all-reduced tensor")


def _judge_gradients(where: str, case: dict) -> None:
    if case["error"] < 1e-5:
        return
    raise AssertionError(
        f"{where}: the gradients differ from torch DDP's by {case['error']:.3g}: they are " + (
            "the SUM over the ranks; DDP averages: divide by dist.get_world_size() after waiting."
            if case["error_vs_sum"] < 1e-5 else
            "this rank's own (or its own / world_size): the all-reduced values never reached p.grad. Copy each "
            "slice of the all-reduced tensor back into its p.grad." if case["error_vs_own"] < 1e-5 else
            "neither the mean nor the sum over ranks. After waiting, divide by dist.get_world_size() and copy "
            "each slice back into its p.grad, in the order the bucket was concatenated.")
    )
