"""Checks for solutions/16_frameworks_exercises.ipynb: Trainer flags as raw PyTorch, and raw PyTorch as flags.

Both checks run the real Lightning Trainer (one CPU device, SGD, a linear model on random data) and
compare the weights it ends with, and what it did (optimizer steps, dtypes under autocast), with the
learner's code. Lightning is the reference, not a copy of the solution.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from . import expect, passed
from ..models import max_diff

LR = 0.1
CASES = [(1, None), (2, None), (3, 0.05), (4, 0.02)]   # 7 batches: for 2, 3 and 4 the last group is short


def _setup(batches: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(batches * 16, 1, 28, 28, generator=g), torch.randint(0, 10, (batches * 16,), generator=g)
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), DataLoader(TensorDataset(x, y), batch_size=16)


def _trainer(loader, model, **flags):
    from ..frameworks import FlagProbe, fit_quietly

    probe = FlagProbe(copy.deepcopy(model), lr=LR)
    fit_quietly(probe, loader, **flags)
    return probe


def check_like_trainer(train_epoch_like_trainer, cases=CASES) -> None:
    """train_epoch_like_trainer(model, loader, lr, accumulate, clip) ends with the Trainer's weights."""
    for accumulate, clip in cases:
        model, loader = _setup(7)
        mine = train_epoch_like_trainer(copy.deepcopy(model), loader, LR, accumulate, clip)
        expect(isinstance(mine, nn.Module), f"return the trained model; got {type(mine).__name__}")
        probe = _trainer(loader, model, accumulate_grad_batches=accumulate, gradient_clip_val=clip)
        diff = max_diff(mine, probe.model)
        expect(diff < 1e-5, f"accumulate={accumulate}, clip={clip}, 7 batches: your weights differ from the "
               f"Trainer's by {diff:.3g} (the Trainer stepped {probe.steps} times). Hints: "
               + ("each micro-batch's loss is divided by `accumulate`, so the summed gradient is the big batch's "
                  "mean; the Trainer also steps after the LAST batch of the epoch, even if the group is short. "
                  if accumulate > 1 else "with accumulate=1 this is a plain SGD epoch: zero_grad, backward, step. ")
               + ("Clip once per step, the norm of the accumulated gradient (clip_grad_norm_, not clip_grad_value_), "
                  "right before optimizer.step()." if clip is not None else ""))
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
    except (TypeError, ValueError, RuntimeError) as exc:   # MisconfigurationException is a ValueError
        raise AssertionError(f"Trainer(**{flags}) does not run: {type(exc).__name__}: {exc}") from None
    expect(all(p.dtype == torch.float32 for p in probe.parameters()),
           "your flags store the weights in bf16; the fragment keeps fp32 weights and only computes in bf16 "
           "(mixed precision, not 'true' bf16)")
    expect(all(probe.autocast) and set(probe.dtypes) == {torch.bfloat16},
           f"the fragment computes the forward pass under bf16 autocast; with your flags the logits were "
           f"{sorted({str(d) for d in probe.dtypes})}. Which `precision=` value means bf16 autocast?")
    expect(probe.steps == 2, f"the fragment steps the optimizer twice in 8 batches; with your flags the Trainer "
           f"stepped {probe.steps} times")
    diff = max_diff(raw_fragment(copy.deepcopy(model), loader), probe.model)
    expect(diff < 1e-4, f"the weights differ from the fragment's by {diff:.3g}: look at what happens just "
           "before optimizer.step() in the fragment")
    passed("trainer_flags")
