"""Checks for solutions/00_start_here_exercises.ipynb: counting parameters, describing a batch.

Each check runs the answer on every case first and names a mistake only when that mistake explains the answer's
results on all of them (one number can match two mistakes by chance; several models cannot).
"""
from __future__ import annotations

import torch
from torch import nn

from . import answer_source, calls_method, expect, expect_close, passed


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


class _ScaledNet(nn.Module):
    """A parameter of the model itself, 0-d (a learned temperature), beside a layer without bias: 1 + 3*2 = 7."""

    def __init__(self):
        super().__init__()
        self.temperature = nn.Parameter(torch.tensor(1.0))
        self.proj = nn.Linear(3, 2, bias=False)

    def forward(self, x):
        return self.proj(x) / self.temperature


def _per_layer(model: nn.Module) -> int:
    return sum(p.numel() for m in model.modules() for p in m.parameters(recurse=False))


# Mistakes, each by the number it gives for a model: (what the answer counted, that number).
COUNT_MISTAKES = (
    ("That is the number of modules: count the elements of each parameter tensor (p.numel()).",
     lambda model: len(list(model.modules()))),
    ("That is the number of parameter tensors: count their elements with p.numel().",
     lambda model: len(list(model.parameters()))),
    ("That counts model.state_dict(): it holds buffers such as BatchNorm's running_mean/running_var/"
     "num_batches_tracked (state, not parameters: the optimizer never updates them) and lists a shared weight "
     "under each layer's name. Use model.parameters().",
     lambda model: sum(t.numel() for t in model.state_dict().values())),
    ("A weight shared by two layers (tied weights) is ONE parameter: it is stored and updated once. You counted it "
     "per layer; model.parameters() yields each tensor once.", _per_layer),
    ("Frozen parameters (requires_grad=False) are parameters of the model too: count them. "
     "(course_lib.models.count_parameters has trainable_only=True for the other number.)",
     lambda model: sum(p.numel() for p in model.parameters() if p.requires_grad)),
    ("Biases (and other 1-D or 0-d parameters) are parameters too.",
     lambda model: sum(p.numel() for p in model.parameters() if p.dim() > 1)),
    ("A 0-d parameter (a single number, like this temperature) is a parameter too: its numel() is 1.",
     lambda model: sum(p.numel() for p in model.parameters() if p.dim() > 0)),
    ("That counts only the parameters of model.children(): the model's own parameters (and all of a model without "
     "submodules, such as a bare nn.Linear) are left out; model.parameters() includes them, at every depth.",
     lambda model: sum(p.numel() for child in model.children() for p in child.parameters())),
)


def _model_state(model: nn.Module):
    return ([(name, p.requires_grad, p.detach().clone()) for name, p in model.named_parameters()],
            [(name, b.clone()) for name, b in model.named_buffers()], [m.training for m in model.modules()])


def _changes(before, after) -> str:
    """What an answer changed in a model, in words; "" if nothing."""
    (params, buffers, modes), (params2, buffers2, modes2) = before, after
    if [(n, r) for n, r, _ in params] != [(n, r) for n, r, _ in params2]:
        return "the parameters' requires_grad flags"
    if any(not torch.equal(a, b) for (_, _, a), (_, _, b) in zip(params, params2)):
        return "parameter values"
    if any(not torch.equal(a, b) for (_, a), (_, b) in zip(buffers, buffers2)):
        return "buffer values"
    return "the train/eval modes of its modules" if modes != modes2 else ""


def _counted(count_parameters, model: nn.Module, what: str) -> int:
    before = _model_state(model)
    try:
        got = count_parameters(model)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise AssertionError(f"count_parameters raised {type(exc).__name__} on {what}: {exc}") from None
    changed = _changes(before, _model_state(model))
    expect(not changed, f"count_parameters changed the model it was given ({what}): {changed} differ after the "
           "call. Only read the model.")
    expect(isinstance(got, int) and not isinstance(got, bool),
           f"count_parameters should return a Python int; got {type(got).__name__} ({got!r}) on {what}. "
           "Hint: tensor.numel() is already an int; sum() of ints is an int.")
    return got


def check_count_parameters(count_parameters) -> None:
    """Parameter *elements* (weights and biases), not modules, tensors or buffers; a shared tensor once."""
    expect(not calls_method(answer_source(count_parameters), "count_parameters"),
           "count_parameters calls course_lib.models.count_parameters, which does the whole exercise: count with "
           "model.parameters() yourself.")
    from ..models import Net
    cases = [(nn.Linear(10, 5), 55, "nn.Linear(10, 5): 10*5 weights + 5 biases"),
             (_bn_model(), 27098, "conv(1->4, 3x3) + BatchNorm2d(4) + Linear(2704 -> 10)"),
             (Net(), 21840, "the course's Net"),
             (_TiedNet(), 50, "Embedding(6, 4) and Linear(4, 6) sharing one 6x4 weight, plus a frozen Linear(4, 4)"),
             (_ScaledNet(), 7, "a model with its own 0-d parameter (a temperature) and a Linear(3, 2, bias=False)"),
             (nn.ReLU(), 0, "nn.ReLU(), which has no parameters")]
    runs = [(model, expected, what, _counted(count_parameters, model, what)) for model, expected, what in cases]
    for model, expected, what, got in runs:
        if got != expected:
            hint = next((mistake for mistake, count in COUNT_MISTAKES
                         if all(g == count(m) for m, _, _, g in runs)), "")
            raise AssertionError(f"{what}: expected {expected:,} parameter elements, got {got:,}. {hint}".strip())
    passed("count_parameters")


def _batches():
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (8, 1, 28, 28), dtype=torch.uint8, generator=g)
    raw[0, 0, 0, 0], raw[1, 0, 0, 0] = 0, 255
    return [("a float64 batch", torch.randn(4, 3, 5, generator=g, dtype=torch.float64)),
            ("a uint8 batch (raw MNIST images)", raw),
            ("an int64 batch of labels", torch.randint(0, 10, (16,), generator=g)),
            ("a float16 batch whose sum is beyond float16's range", torch.rand(64, 64, generator=g).half() * 100),
            ("a permuted (non-contiguous) float32 batch", torch.randn(2, 5, 4, 3, generator=g).permute(0, 3, 1, 2)),
            ("a one-sample bfloat16 batch", torch.randn(1, 6, generator=g).bfloat16())]


def _described(describe_batch, x: torch.Tensor, what: str) -> dict:
    given = x.clone()
    try:
        got = describe_batch(x)
    except NotImplementedError as exc:
        if not getattr(exc, "message", str(exc)):   # the untouched stub (in the grading sandbox, a StudentError)
            raise
        raise AssertionError(f"describe_batch raised NotImplementedError on {what}: {exc}") from None
    except Exception as exc:
        hint = (" Hint: mean() is only defined for floating-point tensors; convert with x.double() first."
                if "could not infer output dtype" in str(exc) else "")
        raise AssertionError(f"describe_batch failed on {what} {tuple(x.shape)}: {type(exc).__name__}: "
                             f"{str(exc).rstrip('.')}.{hint}") from None
    expect(torch.equal(x, given), f"describe_batch changed the batch it was given ({what}): only read it (convert "
           "into a new tensor, e.g. x.double(), instead of changing x in place).")
    return got


def _float_hint(value) -> str:
    if isinstance(value, torch.Tensor):
        return "Hint: that is a tensor; a 0-d tensor becomes a number with .item()."
    if isinstance(value, int):
        return "Hint: .item() of an integer tensor is an int: convert the tensor to floating point first (x.double())."
    return ""


def _mean_hint(got: float, x: torch.Tensor) -> str:
    if got in (float("inf"), float("-inf")):
        return (f"Hint: the mean came out infinite: the sum of a {x.dtype} batch overflowed its range; convert to "
                "float64 (x.double()) before reducing.")
    if got == x[0].double().mean().item():
        return "Hint: that is the first sample's mean: reduce over every element of the batch."
    return "Hint: the mean over every element of the batch."


def check_describe_batch(describe_batch) -> None:
    """A dict with shape (tuple), dtype (str), min/max/mean (Python floats) of a whole batch."""
    for what, x in _batches():
        got = _described(describe_batch, x, what)
        expect(isinstance(got, dict), f"describe_batch should return a dict; got {type(got).__name__}")
        keys = {"shape", "dtype", "min", "max", "mean"}
        expect(set(got) == keys, f"expected exactly the keys {sorted(keys)}; got {sorted(got)}")
        expect(isinstance(got["shape"], tuple),
               f"shape: expected a tuple; got {type(got['shape']).__name__} {got['shape']!r}. Hint: tuple(x.shape).")
        expect(tuple(got["shape"]) == tuple(x.shape) and all(type(s) is int for s in got["shape"]),
               f"shape of {what}: expected {tuple(x.shape)} (the whole batch, batch dimension first); "
               f"got {got['shape']!r}")
        expect(got["dtype"] == str(x.dtype), f"dtype: expected the string {str(x.dtype)!r}; got {got['dtype']!r}. "
               "Hint: str(x.dtype).")
        for key in ("min", "max", "mean"):
            expect(type(got[key]) is float, f"{key} of {what}: expected a Python float; got "
                   f"{type(got[key]).__name__}. {_float_hint(got[key])}".strip())
        # Statistics may be rounded to float32 or to the batch's own (coarser) float dtype, not further.
        rtol = max(torch.finfo(x.dtype).eps if x.is_floating_point() else 0.0, 1e-6)
        expect_close(got["min"], x.min().double().item(), f"min of {what}", atol=1e-6, rtol=rtol,
                     hint="The minimum over the whole batch.")
        expect_close(got["max"], x.max().double().item(), f"max of {what}", atol=1e-6, rtol=rtol,
                     hint="The maximum over the whole batch.")
        expect_close(got["mean"], x.double().mean().item(), f"mean of {what}", atol=1e-6, rtol=rtol,
                     hint=_mean_hint(got["mean"], x))
    passed("describe_batch")
