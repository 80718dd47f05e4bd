"""Checks for solutions/00_start_here_exercises.ipynb: counting parameters, describing a batch."""
from __future__ import annotations

import torch
from torch import nn

from . import expect, expect_close, passed


def _bn_model() -> nn.Module:
    # Parameter elements, counted by hand: conv 1*4*3*3 + 4 = 40, BatchNorm weight+bias 8,
    # linear 4*26*26*10 + 10 = 27050  ->  27098. BatchNorm also holds 3 buffers (9 elements).
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))


class _TiedNet(nn.Module):
    """Input embedding and output layer share one weight (weight tying, as in language models), plus a frozen
    layer. Parameter elements: shared 6*4 = 24 once, head bias 6, frozen 4*4 + 4 = 20  ->  50."""

    def __init__(self):
        super().__init__()
        self.embed, self.frozen, self.head = nn.Embedding(6, 4), nn.Linear(4, 4), nn.Linear(4, 6)
        self.head.weight = self.embed.weight            # one tensor, two layers
        self.frozen.requires_grad_(False)               # not trained now, still a parameter of the model

    def forward(self, tokens):
        return self.head(self.frozen(self.embed(tokens)))


def _shared_twice(model: nn.Module) -> int:
    return sum(p.numel() for m in model.modules() for p in m.parameters(recurse=False))


def check_count_parameters(count_parameters) -> None:
    """Parameter *elements* (weights and biases), not modules, tensors or buffers; a shared tensor once."""
    cases = [(nn.Linear(10, 5), 55, "nn.Linear(10, 5): 10*5 weights + 5 biases"),
             (_bn_model(), 27098, "conv(1->4, 3x3) + BatchNorm2d(4) + Linear(2704 -> 10)")]
    from ..models import Net
    cases.append((Net(), 21840, "the course's Net"))
    cases.append((_TiedNet(), 50, "Embedding(6, 4) and Linear(4, 6) sharing one 6x4 weight, plus a frozen "
                  "Linear(4, 4)"))
    for model, expected, what in cases:
        got = count_parameters(model)
        expect(isinstance(got, int) and not isinstance(got, bool),
               f"count_parameters should return a Python int; got {type(got).__name__} ({got!r}). "
               "Hint: tensor.numel() is already an int; sum() of ints is an int.")
        hint = ""
        every = list(model.parameters())
        if got == len(list(model.modules())):
            hint = "That is the number of modules: count the elements of each parameter tensor (p.numel())."
        elif got == len(every):
            hint = "That is the number of parameter tensors: count their elements with p.numel()."
        elif got == _shared_twice(model):
            hint = ("A weight shared by two layers (tied weights) is ONE parameter: it is stored and updated once. "
                    "You counted it per layer; model.parameters() yields each tensor once.")
        elif got == sum(t.numel() for t in model.state_dict().values()):
            hint = ("That includes buffers such as BatchNorm's running_mean/running_var/num_batches_tracked: "
                    "buffers are state, not parameters (the optimizer never updates them). Use model.parameters().")
        elif got == sum(p.numel() for p in every if p.requires_grad):
            hint = ("Frozen parameters (requires_grad=False) are parameters of the model too: count them. "
                    "(course_lib.models.count_parameters has trainable_only=True for the other number.)")
        elif got == sum(p.numel() for p in every if p.dim() > 1):
            hint = "Biases are parameters too."
        expect(got == expected, f"{what}: expected {expected:,} parameter elements, got {got:,}. {hint}".strip())
    passed("count_parameters")


def check_describe_batch(describe_batch) -> None:
    """A dict with shape (tuple), dtype (str), min/max/mean (Python floats) of a whole batch."""
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (8, 1, 28, 28), dtype=torch.uint8, generator=g)
    raw[0, 0, 0, 0], raw[1, 0, 0, 0] = 0, 255
    float_batch = torch.randn(4, 3, 5, generator=g, dtype=torch.float64)
    for x in (float_batch, raw):
        try:
            got = describe_batch(x)
        except RuntimeError as exc:  # torch raises NotImplementedError (with a message) for uint8 mean()
            if isinstance(exc, NotImplementedError) and not str(exc):
                raise  # the untouched stub
            raise AssertionError(f"describe_batch failed on a {x.dtype} batch: {exc}. Hint: mean() is only "
                                 "defined for floating-point tensors; convert with x.float() first.") from None
        expect(isinstance(got, dict), f"describe_batch should return a dict; got {type(got).__name__}")
        keys = {"shape", "dtype", "min", "max", "mean"}
        expect(set(got) == keys, f"expected exactly the keys {sorted(keys)}; got {sorted(got)}")
        expect(tuple(got["shape"]) == tuple(x.shape) and all(isinstance(s, int) for s in got["shape"]),
               f"shape: expected {tuple(x.shape)} (the whole batch, batch dimension first); got {got['shape']!r}")
        expect(got["dtype"] == str(x.dtype), f"dtype: expected the string {str(x.dtype)!r}; got {got['dtype']!r}. "
               "Hint: str(x.dtype).")
        for key in ("min", "max", "mean"):
            expect(type(got[key]) is float, f"{key}: expected a Python float; got {type(got[key]).__name__}. "
                   "Hint: a 0-d tensor becomes a float with .item(); for integer tensors convert first.")
        expect_close(got["min"], x.min().double().item(), "min", hint="The minimum over the whole batch.")
        expect_close(got["max"], x.max().double().item(), "max", hint="The maximum over the whole batch.")
        expect_close(got["mean"], x.double().mean().item(), "mean", atol=1e-4,
                     hint="The mean over every element of the batch.")
    passed("describe_batch")
