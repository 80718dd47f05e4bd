"""Checks for solutions/04_single_gpu_exercises.ipynb: moving batches, device-agnostic evaluation.

These checks run on any machine. The "meta" device (tensors with a shape and dtype but no
data) stands in for a GPU: a tensor that reached it has `device.type == "meta"`, so a
forgotten `.to(device)` shows up even where no GPU exists.
"""
from __future__ import annotations

import torch
from torch import nn

from . import expect, expect_close, passed

META = torch.device("meta")


def check_to_device(to_device) -> None:
    """Tensors anywhere in a tuple/list/dict nest move; containers, keys and non-tensors stay."""
    t = torch.arange(3)
    batch = {"image": torch.ones(2, 1, 4, 4), "label": t, "meta": {"ids": [t, 7], "name": "a"},
             "pair": (t, 2.5), "size": 2}
    got = to_device(batch, META)
    expect(isinstance(got, dict), f"a dict batch should come back as a dict; got {type(got).__name__}. "
           "Hint: rebuild it with {key: to_device(value, device) for key, value in batch.items()}.")
    expect(set(got) == set(batch), f"the dict keys changed: expected {sorted(batch)}, got {sorted(got)}")
    expect(isinstance(got["image"], torch.Tensor) and got["image"].device == META,
           "batch['image'] was not moved to the device. Hint: for a dict (or list, tuple), call to_device "
           "on each of its values and rebuild the container.")
    expect(got["image"].shape == (2, 1, 4, 4), "batch['image'] changed shape")
    expect(isinstance(got["meta"], dict) and isinstance(got["meta"]["ids"], list),
           "nested containers must keep their type (a dict stays a dict, a list stays a list)")
    ids = got["meta"]["ids"]
    expect(isinstance(ids[0], torch.Tensor) and ids[0].device == META,
           "a tensor inside a list inside a dict was not moved: recurse into every container")
    for path, value, expected in (("['meta']['ids'][1]", ids[1], 7), ("['meta']['name']", got["meta"]["name"], "a"),
                                  ("['pair'][1]", got["pair"][1], 2.5), ("['size']", got["size"], 2)):
        expect(type(value) is type(expected) and value == expected,
               f"batch{path} = {expected!r} is not a tensor and must come back unchanged; got {value!r}. "
               "Hint: only call .to() on torch.Tensor instances.")
    expect(isinstance(got["pair"], tuple) and got["pair"][0].device == META,
           "a tuple must stay a tuple with its tensors moved")
    expect(t.device.type == "cpu" and batch["label"] is t, "to_device must not modify the input batch in place")
    as_list = to_device([t, (t, 1)], META)
    expect(isinstance(as_list, list) and isinstance(as_list[1], tuple) and as_list[0].device == META,
           "a list [tensor, (tensor, 1)] must come back as a list holding a tensor and a tuple, moved")
    single = to_device(t, META)
    expect(isinstance(single, torch.Tensor) and single.device == META, "a bare tensor must be moved too")
    passed("to_device")


class _ScrambleWhenTraining(nn.Module):
    """Returns its input as logits in eval mode, reversed in train mode (like dropout: train-only).

    Also records, for every call, whether autograd was recording and whether its input had been
    moved with .to() (plain lists: the grader reads them back from the student's process).
    """

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.grad_enabled: list[bool] = []
        self.moved: list[bool] = []

    def forward(self, x):
        self.grad_enabled.append(torch.is_grad_enabled())
        self.moved.append(isinstance(x, _Arrived))
        x = x * self.scale
        return x.flip(1) if self.training else x


LEFT_BEHIND = "labels left on the host"


def _refuse_mixed(args, kwargs) -> None:
    """Like a GPU, refuse an operation between a tensor on the 'device' (_Arrived) and one never moved."""
    tensors = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
    if any(type(a) is _Arrived for a in tensors) and any(type(a) is _Moved for a in tensors):
        raise RuntimeError(f"Expected all tensors to be on the same device ({LEFT_BEHIND})")


class _Arrived(torch.Tensor):
    """A batch that went through `.to()`: on the 'device'. `.cpu()` brings a result back to the host."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        _refuse_mixed(args, kwargs)
        out = super().__torch_function__(func, types, args, kwargs or {})
        return out.as_subclass(_Moved) if getattr(func, "__name__", "") == "cpu" else out


class _Moved(torch.Tensor):
    """A batch on the host whose `.to()` returns an _Arrived tensor, so the model can tell whether it was moved."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        _refuse_mixed(args, kwargs)
        out = super().__torch_function__(func, types, args, kwargs or {})
        return out.as_subclass(_Arrived) if getattr(func, "__name__", "") == "to" else out


def check_evaluate_accuracy(evaluate_accuracy) -> None:
    """Accuracy as a float in [0, 1] over the whole loader, in eval mode, without autograd."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(13, 10, generator=g)
    y = x.argmax(1).clone()
    y[[1, 2, 3, 9]] = (y[[1, 2, 3, 9]] + 1) % 10  # 9 of 13 right: batches of 8 and 5 score 5/8 and 4/5
    expected = (x.argmax(1) == y).float().mean().item()
    loader = [(x[:8], y[:8]), (x[8:], y[8:])]
    model = _ScrambleWhenTraining()
    model.train()
    got = evaluate_accuracy(model, loader, torch.device("cpu"))
    expect(isinstance(got, float), f"return a Python float; got {type(got).__name__}. Hint: .item() or float().")
    expect(0.0 <= got <= 1.0, f"accuracy must be a fraction in [0, 1]; got {got!r} (a percentage?)")
    if abs(got - (x.flip(1).argmax(1) == y).float().mean().item()) < 1e-9 and abs(got - expected) > 1e-9:
        raise AssertionError("the model was evaluated in training mode: dropout (and this model) behave "
                             "differently there. Call model.eval() before the loop.")
    if abs(got - sum((x[s].argmax(1) == y[s]).float().mean().item() for s in (slice(0, 8), slice(8, 13))) / 2) < 1e-9:
        raise AssertionError("that is the mean of per-batch accuracies; the last batch is smaller, so count "
                             "correct predictions and samples over the whole loader instead.")
    expect_close(got, expected, "accuracy", hint="correct predictions / number of samples, over every batch.")
    expect(model.grad_enabled and not any(model.grad_enabled),
           "the forward passes ran with autograd recording: wrap evaluation in torch.no_grad() "
           "(it saves the memory and time of building a graph nobody will use).")
    expect(model.training, "the model was left in eval mode: restore the mode it had (model.train(was_training)), "
           "or the next training epoch runs without dropout.")

    tracked = [(xb.as_subclass(_Moved), yb.as_subclass(_Moved)) for xb, yb in loader]
    model.eval()
    model.moved.clear()
    try:
        got = evaluate_accuracy(model, tracked, torch.device("cpu"))
    except RuntimeError as exc:
        if LEFT_BEHIND not in str(exc):
            raise
        raise AssertionError("the labels y were compared with the model's predictions without moving them: on a "
                             "GPU that fails (predictions on cuda, labels on cpu). Move y to `device` too (or bring "
                             "the predictions back with .cpu()).") from None
    expect(model.moved and all(model.moved), "the batches were never moved with .to(device): on a GPU the model would receive "
           "CPU tensors and fail. Move x and y to `device` inside the loop.")
    expect(not model.training, "the model was in eval mode before; it should be in eval mode after")
    expect_close(float(got), expected, "accuracy (model already in eval mode)")
    passed("evaluate_accuracy")
