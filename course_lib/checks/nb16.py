"""Checks for solutions/16_frameworks_exercises.ipynb: Trainer flags as raw PyTorch, and raw PyTorch as flags.

Both checks run the real Lightning Trainer (one CPU device, SGD, a linear model on random data) and
compare the weights it ends with, and what it did (optimizer steps, dtypes under autocast), with the
learner's code. Lightning is the reference, not a copy of the solution. Where the weights differ, a
forward pre-hook on both models tells after which batches the weights changed and how far each step
moved them, so the message says what the learner's loop did differently. Flags are judged by what the
Trainer did, so flags that change nothing graded (progress bar, logger, model summary, deterministic,
default_root_dir, a max_steps that ends with the epoch) pass; only devices/strategy/num_nodes that would
start more processes are refused up front.
"""
from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from . import answer_source, calls_method, expect, passed
from ..models import max_diff

LR = 0.1
# 7 batches: for 2, 3 and 4 the last group is short; 9 steps once, after the last batch; 1 clips every batch
CASES = [(1, None), (2, None), (3, 0.05), (4, 0.02), (9, None), (1, 0.05)]


def _setup(batches: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(batches * 16, 1, 28, 28, generator=g), torch.randint(0, 10, (batches * 16,), generator=g)
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), DataLoader(TensorDataset(x, y), batch_size=16)


# What the check itself decides (quiet, one CPU process); a learner's flag with the same name wins, and then the
# weights, steps and dtypes judge it. Flags that change only the console, logs or files change nothing graded.
QUIET = {"accelerator": "cpu", "devices": 1, "max_epochs": 1, "logger": False, "enable_checkpointing": False,
         "enable_progress_bar": False, "enable_model_summary": False}
ONE_PROCESS = {"devices": (1, [0], "1", "auto"), "num_nodes": (1,), "accelerator": ("cpu", "auto"),
               "strategy": ("auto", "single_device")}


def _trainer(loader, model, **flags):
    """Fit FlagProbe(model) with QUIET overridden by `flags`, in a private folder (default_root_dir is ours:
    a logger or checkpoint a learner switched on writes there, not into the grader's folder)."""
    import tempfile

    import lightning as L

    from ..frameworks import FlagProbe

    for name, allowed in ONE_PROCESS.items():
        if name in flags and flags[name] not in allowed:
            raise AssertionError(f"{name}={flags[name]!r}: the fragment runs in ONE process on the CPU; leave "
                                 f"{name} out (or {allowed[0]!r}): more devices or nodes would start more processes "
                                 "and split the batches among them")
    probe = FlagProbe(copy.deepcopy(model), lr=LR)
    # Trainer(deterministic=True) switches torch.use_deterministic_algorithms on for the whole process and
    # leaves it on: put it back, or the grader's next check (int8 kernels have no deterministic version) fails
    deterministic = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        with tempfile.TemporaryDirectory(prefix="nb16_trainer_") as root:
            trainer = L.Trainer(**{**QUIET, **flags, "default_root_dir": root})
            trainer.fit(probe, loader)
    finally:
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
    return probe


def _flat(module: nn.Module, grad: bool = False) -> torch.Tensor:
    """The module's parameters (or their .grad, zeros where None) as one vector."""
    if grad:
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten()
                          for p in module.parameters()]).clone()
    return torch.cat([p.detach().flatten() for p in module.parameters()]).clone()


def _record_forwards(model: nn.Module, batches: list) -> list:
    """Before every forward of `model`, and of any deep copy of it (the hook is a plain function, which deepcopy
    shares), append (index of the batch in `batches` or None, the module, its weights, its .grad then)."""
    records = []

    def hook(module, args):
        x = args[0] if args else None
        index = next((i for i, b in enumerate(batches)
                      if isinstance(x, torch.Tensor) and x.shape == b.shape and torch.equal(x, b)), None)
        records.append((index, module, _flat(module), _flat(module, grad=True)))

    model.register_forward_pre_hook(hook)
    return records


def _steps(records: list, final: torch.Tensor) -> list:
    """(batch index, change of the weights) for every change between two forwards, and after the last one."""
    weights = [r[2] for r in records] + [final]
    return [(records[k][0], weights[k + 1] - weights[k]) for k in range(len(records))
            if not torch.equal(weights[k], weights[k + 1])]


@functools.lru_cache(maxsize=16)
def _trainer_weights(accumulate: int, clip) -> tuple:
    """(optimizer steps, final parameters, forward records) of the Trainer on `_setup(7)`: the same every call, so
    run once."""
    model, loader = _setup(7)
    records = _record_forwards(model, [x for x, _ in loader])
    probe = _trainer(loader, model, accumulate_grad_batches=accumulate, gradient_clip_val=clip)
    return probe.steps, [p.detach().clone() for p in probe.model.parameters()], records, _flat(probe.model)


def _clipped_early(mine: list, theirs: list, clip) -> str:
    """The first forward inside a group where the learner's accumulated gradient already had norm `clip` and the
    Trainer's was larger: the learner clipped each micro-batch's gradient. "" if there is none."""
    reference = {}
    for i, _, _, grad in theirs:
        reference.setdefault(i, grad)
    for i, _, _, grad in mine:
        norm, norm_ref = grad.norm().item(), reference.get(i, grad).norm().item()
        if norm_ref > clip * (1 + 1e-3) and abs(norm - clip) < 1e-4 * clip:
            return (f" Before batch {i} your accumulated gradient had norm {clip} (clipped already), the Trainer's "
                    f"{norm_ref:.3g}: it clips only the accumulated gradient, once per step, right before "
                    "optimizer.step().")
    return ""


def _step_difference(mine: list, theirs: list, final: tuple, accumulate: int, clip) -> str:
    """What the learner's loop did differently from the Trainer's: their forward records and final weights."""
    steps, reference_steps = _steps(mine, final[0]), _steps(theirs, final[1])
    after, wanted = [i for i, _ in steps], [i for i, _ in reference_steps]
    if after != wanted:
        return (f"The weights changed after batches {after} (counting from 0); the Trainer stepped after batches "
                f"{wanted}" + (": it also steps after the LAST batch of the epoch, whose group is short."
                               if after == wanted[:-1] else "."))
    first = next(((k, m, t) for k, (m, t) in enumerate(zip(steps, reference_steps))
                  if (m[1] - t[1]).abs().max() > 1e-6), None)
    if first is None:
        return "Your loop stepped after the same batches, each step within 1e-6 of the Trainer's."
    k, (i, delta), (_, reference) = first
    step = f"Step {k + 1} (after batch {i})"
    grad, grad_ref = delta.norm().item() / LR, reference.norm().item() / LR       # SGD: change = -lr * gradient
    cosine = torch.nn.functional.cosine_similarity(delta, reference, dim=0).item()
    group = i + 1 - (wanted[k - 1] + 1 if k else 0)         # batches since the previous step
    if cosine > 0.9999:
        ratio = grad / grad_ref
        text = f"{step} moved the weights {ratio:.3g} times as far as the Trainer's, in the same direction"
        if clip is not None and abs(grad_ref - clip) < 1e-4 * clip:
            return (f"{text}: the Trainer clipped this step's gradient to norm {clip}, yours had norm {grad:.3g}. "
                    "Clip the accumulated gradient (clip_grad_norm_) right before optimizer.step().")
        if group < accumulate and abs(ratio - accumulate / group) < 1e-3 * accumulate:
            return (f"{text}: you divided the short last group ({group} batch{'es' if group > 1 else ''}) by its "
                    f"own length; the Trainer divides every micro-batch's loss by accumulate_grad_batches="
                    f"{accumulate}, in the last group too.")
        if abs(ratio - accumulate) < 1e-3 * accumulate:
            return (f"{text}: your gradient is the sum over the {accumulate} micro-batches; the Trainer divides each "
                    "micro-batch's loss by accumulate_grad_batches.")
        return text + "."
    text = f"{step} went another way than the Trainer's (cosine {cosine:.4f})"
    if clip is not None and abs(delta.abs().max().item() / LR - clip) < 1e-4 * clip:
        return (f"{text}, and its gradient's largest entries are exactly +-{clip}: that is clipping by value "
                "(clip_grad_value_); the Trainer clips the norm (clip_grad_norm_), which keeps the direction.")
    early = _clipped_early(mine, theirs, clip) if clip is not None else ""
    return f"{text}, with gradient norm {grad:.3g} against the Trainer's {grad_ref:.3g}.{early}"


def check_like_trainer(train_epoch_like_trainer, cases=CASES) -> None:
    """train_epoch_like_trainer(model, loader, lr, accumulate, clip) ends with the Trainer's weights."""
    source = answer_source(train_epoch_like_trainer)
    used = [name for name in ("lightning", "pytorch_lightning", "Trainer") if calls_method(source, name)]
    expect(not used, f"your answer uses {(used or [''])[0]}: the exercise is the Trainer's loop in plain PyTorch, "
                     "without Lightning")
    # A graded answer runs in the sandbox, where the model goes by value (pickled): no hook can travel with it, so
    # there the message says only what the final weights show.
    from ..grading.remote import is_remote
    watch = not is_remote(train_epoch_like_trainer)
    for accumulate, clip in cases:
        model, loader = _setup(7)
        start = copy.deepcopy(model)
        records = _record_forwards(start, [x for x, _ in loader]) if watch else None
        mine = train_epoch_like_trainer(start, loader, LR, accumulate, clip)
        expect(isinstance(mine, nn.Module), f"return the trained model; got {type(mine).__name__}")
        steps, weights, theirs, final = _trainer_weights(accumulate, clip)
        diff = max_diff(list(mine.parameters()), weights)
        if diff < 1e-5:
            continue
        what = (f"accumulate={accumulate}, clip={clip}, 7 batches: your weights differ from the Trainer's by "
                f"{diff:.3g} (the Trainer stepped {steps} times).")
        expect(records is not None, f"{what} Look at after which batches your loop steps, what it divides each "
                                    "micro-batch's loss by, and what it clips, when.")
        expect(records, f"{what} Your loop never called the model it was given on the loader's batches.")
        expect(any(record[1] is mine for record in records),
               f"{what} The model you returned is not the one your loop ran: train the model you were given (or "
               "return the one you trained).")
        raise AssertionError(f"{what} {_step_difference(records, theirs, (_flat(mine), final), accumulate, clip)}")
    passed("train_epoch_like_trainer")


CLIP = 0.05


def raw_fragment(model: nn.Module, loader) -> nn.Module:
    """The raw-PyTorch loop of exercise 2 (8 batches of 16)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for i, (x, y) in enumerate(loader):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        (loss / 4).backward()
        if (i + 1) % 4 == 0:
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=CLIP)
            optimizer.step()
            optimizer.zero_grad()
    return model


def check_trainer_flags(trainer_flags) -> None:
    """trainer_flags() -> Trainer keyword arguments that make the Trainer run `raw_fragment`."""
    flags = trainer_flags()
    expect(isinstance(flags, dict), f"return a dict of Trainer arguments, e.g. {{'max_epochs': 1}}; got {flags!r}")
    model, loader = _setup(8, seed=1)
    try:
        probe = _trainer(loader, model, **flags)
    except (TypeError, ValueError, RuntimeError, ImportError) as exc:   # MisconfigurationException: a ValueError
        raise AssertionError(f"Trainer(**{flags}) does not run: {type(exc).__name__}: {exc}") from None
    expect(len(probe.dtypes) == 8, f"the fragment makes one pass over the loader's 8 batches; with your flags the "
           f"Trainer ran {len(probe.dtypes)} training steps (max_epochs, max_steps, limit_train_batches, "
           "fast_dev_run and overfit_batches decide how many)")
    expect(all(p.dtype == torch.float32 for p in probe.parameters()),
           "your flags store the weights in bf16; the fragment keeps fp32 weights and only computes in bf16 "
           "(mixed precision, not 'true' bf16)")
    expect(all(probe.autocast) and set(probe.dtypes) == {torch.bfloat16},
           f"the fragment computes the forward pass under bf16 autocast; with your flags the logits were "
           f"{sorted({str(d) for d in probe.dtypes})}. Which `precision=` value means bf16 autocast?")
    expect("bf16" in str(flags.get("precision", "bf16")),
           f"precision={flags.get('precision')!r} asks for fp16 autocast: on a CPU Lightning swaps in bf16 with a "
           "warning, on a GPU it would compute in fp16. The fragment asks for bf16: say so.")
    expect(probe.steps == 2, f"the fragment steps the optimizer twice in 8 batches; with your flags the Trainer "
           f"stepped {probe.steps} times")
    diff = max_diff(raw_fragment(copy.deepcopy(model), loader), probe.model)
    clip, algorithm = flags.get("gradient_clip_val"), flags.get("gradient_clip_algorithm", "norm")
    expect(diff < 1e-4, f"the weights differ from the fragment's by {diff:.3g}. The fragment clips the gradient's "
           f"norm to {CLIP} before each step; your flags "
           + ("do not clip (gradient_clip_val is not set)" if clip is None else
              f"clip by {algorithm!r}" if str(algorithm).lower() != "norm" else
              f"clip at {clip}" if clip != CLIP else "do too, yet the weights differ")
           + ".")
    passed("trainer_flags")


# --- exercise 3: Horovod's steps 4 and 3 by hand, against torch DDP ------------------------------------

HOROVOD_ROOTS = (1, 0)          # rank 1 first: broadcasting from rank 0 by habit is a wrong answer
HOROVOD_STEPS = 3


class _RecordingSGD(torch.optim.SGD):
    """SGD that keeps what the first step() saw: the weights (after the broadcast) and the gradients."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.first, self.steps = None, 0

    def step(self, closure=None):
        if self.first is None:
            params = [p for group in self.param_groups for p in group["params"]]
            self.first = ([p.detach().clone() for p in params],
                          [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params])
        self.steps += 1
        return super().step(closure)


def _horovod_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.Tanh(), nn.Linear(8, 4))


def _horovod_batches(rank: int) -> list:
    g = torch.Generator().manual_seed(50 + rank)          # every rank its own data
    return [(torch.randn(6, 12, generator=g), torch.randint(0, 4, (6,), generator=g)) for _ in range(HOROVOD_STEPS)]


def _run_recording_all_reduce(fn, model, optimizer, batches, root):
    """Run the learner's loop; what each dist.all_reduce it made was given: [(before the first step, the tensor
    shares a p.grad's memory)], or None when its code holds all_reduce under a name of its own (then unseen)."""
    import torch.distributed as dist
    real, calls = dist.all_reduce, []
    if any(value is real for value in getattr(fn, "__globals__", {}).values()):
        fn(model, optimizer, batches, root)
        return None

    def recording(tensor, *args, **kwargs):
        grads = {p.grad.untyped_storage().data_ptr() for p in model.parameters() if p.grad is not None}
        calls.append((optimizer.steps == 0, tensor.untyped_storage().data_ptr() in grads))
        return real(tensor, *args, **kwargs)
    dist.all_reduce = recording
    try:
        fn(model, optimizer, batches, root)
    finally:
        dist.all_reduce = real
    return calls


def _own_gradient_mistake(reduced) -> str:
    """Why step() saw this rank's own gradient, from the all-reduces the loop made (None: not seen)."""
    before = [shares for first, shares in (reduced or []) if first]
    if reduced is None or any(before):
        return "all-reduce the gradients and average them BEFORE optimizer.step()"
    if before:
        return ("the all-reduces before the first step reduced tensors that are not p.grad (a copy: .clone(), "
                "torch.cat, ...) and the result never reached p.grad: reduce p.grad itself, or copy the result "
                "back into it")
    if reduced:
        return "all-reduce and average BEFORE optimizer.step(), not after"
    return "the loop never calls dist.all_reduce: average the gradients over the ranks before optimizer.step()"


def horovod_cases(rank: int, world_size: int, source: str, name: str) -> list:
    """Worker: per root rank, the learner's loop from this rank's own random weights, against torch DDP started from
    the root's weights; what the first optimizer step saw, and the max differences that tell the mistakes apart."""
    import torch.distributed as dist
    from ..grading.student import compile_source

    fn = compile_source(source, name)
    batches, out = _horovod_batches(rank), []
    for root in HOROVOD_ROOTS:
        if root >= world_size:
            continue
        model = _horovod_model(100 + rank)                 # different initial weights on every rank
        own = [p.detach().clone() for p in model.parameters()]
        optimizer = _RecordingSGD(model.parameters(), lr=LR)
        reduced = _run_recording_all_reduce(fn, model, optimizer, batches, root)
        reference = nn.parallel.DistributedDataParallel(_horovod_model(100 + root))   # the root's weights
        ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
        local = copy.deepcopy(reference.module)
        x, y = batches[0]
        F.cross_entropy(local(x), y).backward()            # this rank's own gradient at the first step
        for i, (x, y) in enumerate(batches):
            ref_opt.zero_grad()
            F.cross_entropy(reference(x), y).backward()
            if i == 0:
                mean = [p.grad.clone() for p in reference.parameters()]
            ref_opt.step()
        weights = [p.detach().clone() for p in model.parameters()]
        gathered = [None] * world_size
        dist.all_gather_object(gathered, weights)
        start, grads = optimizer.first if optimizer.first else (own, [torch.zeros_like(p) for p in own])
        root0 = list(_horovod_model(100).parameters())
        out.append({"root": root, "steps": optimizer.steps, "reduced": reduced,
                    "start_vs_root": max_diff(start, list(_horovod_model(100 + root).parameters())),
                    "start_vs_own": max_diff(start, own), "start_vs_rank0": max_diff(start, root0),
                    "grad_vs_mean": max_diff(grads, mean),
                    "grad_vs_sum": max_diff(grads, [g * world_size for g in mean]),
                    "grad_vs_local": max_diff(grads, [p.grad for p in local.parameters()]),
                    "ranks_disagree": max(max_diff(weights, w) for w in gathered),
                    "final_vs_ddp": max_diff(weights, list(reference.module.parameters()))})
    return out


def judge_horovod(world_size: int, results: list) -> None:
    """AssertionError naming the first mistake found in `horovod_cases`' results (one list per rank)."""
    cases = sorted(((case["root"], rank, case) for rank, per_rank in enumerate(results) for case in per_rank),
                   key=lambda item: item[:2])   # root 0 first: there a missing broadcast cannot pass for a wrong root
    for root, rank, case in cases:
        where = f"rank {rank} of {world_size}, root_rank={root}"
        expect(case["steps"] == HOROVOD_STEPS, f"{where}: optimizer.step() ran {case['steps']} times for "
               f"{HOROVOD_STEPS} batches; step once per batch")
        if rank != root and case["start_vs_root"] >= 1e-6:
            if root != 0 and case["start_vs_rank0"] < 1e-6:
                raise AssertionError(f"{where}: the weights at the first step are rank 0's, not rank {root}'s: "
                                     "broadcast from root_rank, not from 0")
            raise AssertionError(f"{where}: the first step started from "
                                 + ("this rank's own random weights" if case["start_vs_own"] < 1e-6
                                    else f"weights that are not rank {root}'s")
                                 + f": broadcast rank {root}'s parameters (dist.broadcast(tensor, src=root_rank)) "
                                   "before training")
    for root, rank, case in cases:          # every start is right: now the gradients and the weights
        where = f"rank {rank} of {world_size}, root_rank={root}"
        expect(case["grad_vs_sum"] > 1e-6 or case["grad_vs_mean"] < 1e-6,
               f"{where}: step() saw the SUM of the ranks' gradients; divide by dist.get_world_size() (DDP and "
               "Horovod average)")
        expect(case["grad_vs_local"] > 1e-6 or case["grad_vs_mean"] < 1e-6,
               f"{where}: step() saw this rank's own gradient: {_own_gradient_mistake(case.get('reduced'))}")
        expect(case["grad_vs_mean"] < 1e-5, f"{where}: the gradient at the first step differs from DDP's mean "
               f"over the ranks by {case['grad_vs_mean']:.3g}: sum with all_reduce, then divide by "
               "dist.get_world_size() (not a fixed number)")
        expect(case["ranks_disagree"] < 1e-6, f"{where}: after training the ranks hold different weights "
               f"(by {case['ranks_disagree']:.3g}); every rank must take the same averaged steps")
        expect(case["final_vs_ddp"] < 1e-5, f"{where}: your final weights differ from torch DDP's by "
               f"{case['final_vs_ddp']:.3g}")


def check_horovod_loop(train_like_horovod, world_size: int = 2) -> None:
    """train_like_horovod(model, optimizer, batches, root_rank) on `world_size` gloo ranks ends with DDP's weights."""
    from . import run_on_ranks

    expect(not calls_method(answer_source(train_like_horovod), "DistributedDataParallel"),
           "your answer wraps the model in DistributedDataParallel, whose gradient all-reduce is the exercise: "
           "average p.grad yourself with dist.all_reduce")

    results = run_on_ranks(horovod_cases, world_size, train_like_horovod,
                           "every rank must call the same collectives in the same order (the same tensors, the "
                           "same root)")
    judge_horovod(world_size, results)
    passed("train_like_horovod")
