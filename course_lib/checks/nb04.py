"""Checks for solutions/04_single_gpu_exercises.ipynb: moving batches, device-agnostic evaluation.

These checks run on any machine. The "meta" device (tensors with a shape and dtype but no
data) stands in for a GPU: a tensor that reached it has `device.type == "meta"`, so a
forgotten `.to(device)` shows up even where no GPU exists.
"""
from __future__ import annotations

import torch
from torch import nn

from . import answer_source, calls_function, expect, expect_close, passed

META = torch.device("meta")
CONTAINERS = (dict, list, tuple)


def _mismatch(given, got, path: str) -> str:
    """The first place where `got` is not `given` with every tensor moved to META, in words; "" if none."""
    where = f"batch{path}"
    if isinstance(given, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{where} is a tensor and must come back as a tensor moved to the device; got {got!r}"
        if got.device != META:
            return (f"{where} is on {got.device}, not on the device it was given: call .to(device) on every tensor"
                    + (" (it came back as the very tensor it was)." if got is given else "."))
        if got.shape != given.shape or got.dtype != given.dtype:
            return (f"{where} changed shape or dtype: {tuple(given.shape)} {given.dtype} -> {tuple(got.shape)} "
                    f"{got.dtype}")
        return ""
    if type(given) in CONTAINERS:
        kind = type(given).__name__
        if type(got) is not type(given):
            return (f"{where} is a {kind} and must come back as a {kind} (containers keep their type); got "
                    f"{type(got).__name__}")
        if got is given and _holds_tensor(given):
            return (f"{where} came back as the very {kind} it was, its tensors not moved: build a new {kind} from "
                    "to_device of each of its items.")
        if kind == "dict" and list(got) != list(given):
            return f"the keys of {where} changed: expected {list(given)}, got {list(got)}"
        if kind != "dict" and len(got) != len(given):
            return f"{where} has {len(given)} items; got {len(got)}"
        keys = given.keys() if kind == "dict" else range(len(given))
        return next((m for m in (_mismatch(given[k], got[k], f"{path}[{k!r}]") for k in keys) if m), "")
    if type(got) is not type(given) or got != given:
        return (f"{where} = {given!r} is not a tensor and must come back unchanged; got {got!r}. Hint: only call "
                ".to() on torch.Tensor instances.")
    return ""


def _holds_tensor(obj) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return any(_holds_tensor(v) for v in items)


def _layout(obj):
    """Every container and leaf of a batch by identity (and each tensor's device): what in-place work changes."""
    if isinstance(obj, dict):
        return ("dict", id(obj), [(k, _layout(v)) for k, v in obj.items()])
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, id(obj), [_layout(v) for v in obj])
    return (id(obj), obj.device) if isinstance(obj, torch.Tensor) else (id(obj),)


def _moved(to_device, batch, what: str):
    before = _layout(batch)
    try:
        got = to_device(batch, META)
    except NotImplementedError:
        raise
    except Exception as exc:
        if not _recursed(exc):
            raise AssertionError(f"to_device raised {type(exc).__name__} on {what}: {exc}") from None
        hint = ""
        if _holds(batch, str):
            try:
                to_device("a", META)
            except Exception as again:  # noqa: BLE001 - only a recursion on "a" says something about strings
                if _recursed(again):
                    hint = (" It recursed forever on a string: a str is iterable and each of its characters is a "
                            "str again. Recurse only into dict, list and tuple; return anything else unchanged.")
        raise AssertionError(f"to_device raised RecursionError on {what}.{hint}") from None
    expect(_layout(batch) == before, f"to_device changed the batch it was given ({what}): the input must not be "
           "modified; build new containers instead of writing into the old ones.")
    return got


def _recursed(exc: Exception) -> bool:
    # in the grading sandbox the student's RecursionError arrives as a StudentError that names it
    return isinstance(exc, RecursionError) or getattr(exc, "name", "") == "RecursionError"


def _holds(obj, kind) -> bool:
    if isinstance(obj, kind):
        return True
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return any(_holds(v, kind) for v in items)


def _to_device_cases():
    t = torch.arange(3)
    return [("a dict batch", {"image": torch.ones(2, 1, 4, 4), "label": t, "meta": {"ids": [t, 7], "name": "a"},
                              "pair": (t, 2.5), "size": 2}),
            ("a list batch", [t, (t, 1)]),
            ("a bare tensor", t),
            ("a tuple batch", ({"a": [torch.zeros(1)]}, "x", None)),
            ("a batch with empty containers, None and a bool", {"list": [], "dict": {}, "tuple": (), "none": None,
                                                                "flag": True, "x": torch.ones(2)}),
            ("a deeply nested tensor", [[[[torch.ones(1, 2)]]]]),
            ("a bare string", "abc")]


def check_to_device(to_device) -> None:
    """Tensors anywhere in a tuple/list/dict nest move; containers, keys and non-tensors stay."""
    for what, batch in _to_device_cases():
        error = _mismatch(batch, _moved(to_device, batch, what), "")
        expect(not error, f"{what}: {error}")
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


def _type_hint(got, correct: int) -> str:
    if isinstance(got, torch.Tensor):
        return "Hint: that is a tensor; a 0-d tensor becomes a float with .item()."
    if isinstance(got, int) and got == correct:
        return f"Hint: that is the number of right predictions ({correct}): divide it by the number of samples."
    return "Hint: .item() or float()."


def _range_hint(got: float, expected: float, correct: int) -> str:
    if abs(got - 100 * expected) < 1e-4:
        return "that is a percentage: return the fraction"
    return "that is the number of right predictions: divide it by the number of samples" if got == correct else \
        "return the fraction of samples predicted right"


def check_evaluate_accuracy(evaluate_accuracy) -> None:
    """Accuracy as a float in [0, 1] over the whole loader, in eval mode, without autograd."""
    expect(not calls_function(answer_source(evaluate_accuracy), "evaluate"),
           "evaluate_accuracy calls course_lib.loop.evaluate, which does the whole exercise: write the loop yourself.")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(13, 10, generator=g)
    y = x.argmax(1).clone()
    y[[1, 2, 3, 9]] = (y[[1, 2, 3, 9]] + 1) % 10  # 9 of 13 right: batches of 8, 4 and 1 score 5/8, 3/4 and 1/1
    expected = (x.argmax(1) == y).float().mean().item()
    batches = (slice(0, 8), slice(8, 12), slice(12, 13))
    loader = [(x[s], y[s]) for s in batches]
    given = [(xb.clone(), yb.clone()) for xb, yb in loader]
    model = _ScrambleWhenTraining()
    model.train()
    got = evaluate_accuracy(model, loader, torch.device("cpu"))
    expect(all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(loader, given)),
           "evaluate_accuracy changed the batches of the loader: only read them (x.to(device) makes a new tensor).")
    correct = int((x.argmax(1) == y).sum())
    expect(isinstance(got, float), f"return a Python float; got {type(got).__name__} ({got!r}). "
           f"{_type_hint(got, correct)}")
    expect(0.0 <= got <= 1.0,
           f"accuracy must be a fraction in [0, 1]; got {got!r}: {_range_hint(got, expected, correct)}.")
    if abs(got - (x.flip(1).argmax(1) == y).float().mean().item()) < 1e-9 and abs(got - expected) > 1e-9:
        raise AssertionError("the model was evaluated in training mode: dropout (and this model) behave "
                             "differently there. Call model.eval() before the loop.")
    if abs(got - sum((x[s].argmax(1) == y[s]).float().mean().item() for s in batches) / len(batches)) < 1e-9:
        raise AssertionError("that is the mean of per-batch accuracies; the batches differ in size (8, 4, 1), so count "
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
    expect(model.moved and all(model.moved), "the model received inputs that were never moved with .to(device): on "
           "a GPU it would receive CPU tensors and fail. Move x and y to `device` inside the loop.")
    expect(not model.training, "the model was in eval mode before; it should be in eval mode after")
    expect_close(float(got), expected, "accuracy (model already in eval mode)")
    passed("evaluate_accuracy")
