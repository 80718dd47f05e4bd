"""Checks for the exercises of lecture 01 (CPU MNIST): `accuracy` and `train_step`.

A wrong answer is named by what it did: the checks compare its results with what each known mistake would give
on the same inputs, and name a mistake only when it explains every result.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from . import answer_source, call_answer, calls_function, expect, expect_close, passed


# Metric libraries that compute the whole exercise in one call (torchmetrics is installed with the course).
METRIC_CALLS = ("torchmetrics", "sklearn", "accuracy", "multiclass_accuracy", "Accuracy", "MulticlassAccuracy",
                "accuracy_score")


def _accuracy_cases():
    """(logits, targets) without ties in any row: the square case first, where argmax over the wrong dimension
    still gives a result (so it can be named), then other shapes, one sample, float64 and bfloat16 logits."""
    g = torch.Generator().manual_seed(1)
    distinct = torch.stack([torch.randperm(5, generator=g) for _ in range(6)]).to(torch.bfloat16)  # no ties
    square = torch.randn(10, 10, generator=g)
    square_targets = square.argmax(1)
    square_targets[[2, 5, 7]] = (square_targets[[2, 5, 7]] + 1) % 10      # 7 of 10 right; over dim 0, 1 of 10
    return [
        (square, square_targets),
        (torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [0.5, 0.2, 0.9], [1.0, 0.0, 4.0]]),
         torch.tensor([0, 1, 1, 2])),                                          # 3 of 4 right
        (torch.randn(37, 10, generator=g), torch.randint(0, 10, (37,), generator=g)),
        (torch.randn(5, 10, generator=g) * 0.01 - 3.0, torch.arange(5)),       # negative logits
        (torch.randn(1, 7, generator=g, dtype=torch.float64), torch.tensor([3])),  # one sample
        (distinct, torch.tensor([0, 1, 2, 3, 4, 0])),
    ]


TOLERANCE = 1e-6    # a float32 mean is this close; a wrong accuracy is at least 1 / N away


def _right(logits, targets):
    return (logits.argmax(dim=1) == targets).double()


def _share(hits: torch.Tensor) -> float:
    return hits.double().mean().item()


# Mistakes, each by the accuracy it gives: (what the answer did, its value from logits and targets).
ACCURACY_MISTAKES = (
    ("The predicted class is the argmax over the class dimension (dim=1), one per sample; you took it over dim 0, "
     "the batch.", lambda logits, t: _share(logits.argmax(0) == t) if logits.shape[0] == logits.shape[1] else None),
    ("You compared the largest logit VALUE with the targets: compare its INDEX, logits.argmax(dim=1).",
     lambda logits, t: _share(logits.max(1).values == t)),
    ("You compared the largest probability VALUE with the targets: compare its INDEX, logits.argmax(dim=1) (softmax "
     "does not change which entry is largest).", lambda logits, t: _share(logits.softmax(1).max(1).values == t)),
    ("You divided by the number of classes (logits.shape[1]): divide by the number of samples N.",
     lambda logits, t: _right(logits, t).sum().item() / logits.shape[1]),
)


def _accuracy_runs(accuracy):
    """[(logits, targets, result)] for the cases, stopping at the first case the answer crashes on: if an earlier
    case already came out wrong, that is the better evidence, so the crash is raised only when none did."""
    runs = []
    for logits, targets in _accuracy_cases():
        given = logits.clone(), targets.clone()
        what = f"accuracy on logits {tuple(logits.shape)} ({logits.dtype})"
        try:
            result = call_answer(accuracy, logits, targets, what=what)
        except AssertionError:
            if any(not _fits(r, lg, t) for lg, t, r in runs):
                break
            raise
        expect(torch.equal(logits, given[0]) and torch.equal(targets, given[1]),
               f"{what} changed its inputs: only read logits and targets (no in-place operations on them).")
        runs.append((logits, targets, result))
    return runs


def _fits(result, logits, targets) -> bool:
    return isinstance(result, float) and abs(result - _right(logits, targets).mean().item()) <= TOLERANCE


def _type_hint(result, logits, targets) -> str:
    if isinstance(result, torch.Tensor):
        return "Hint: that is a tensor; a 0-d tensor becomes a float with .item()."
    right = int(_right(logits, targets).sum().item())
    if isinstance(result, int) and result == right:
        return f"Hint: that is the number of right predictions ({right}): divide it by N."
    if isinstance(result, int) and result == right // len(targets):
        return "Hint: // is integer division (it floors 3 // 4 to 0): divide with /."
    return "Hint: return a Python float, e.g. with .item() or float()."


def check_accuracy(accuracy) -> None:
    """accuracy(logits [N, C], targets [N] int64) -> Python float, the fraction predicted right."""
    source = answer_source(accuracy)
    for name in METRIC_CALLS:
        expect(not calls_function(source, name), f"accuracy uses {name}: a metrics library does the whole exercise; "
               "compute it with tensor operations (argmax, ==, mean).")
    runs = _accuracy_runs(accuracy)
    for logits, targets, result in runs:
        what = f"accuracy on logits {tuple(logits.shape)} ({logits.dtype})"
        expect(isinstance(result, float), f"{what} should return a Python float, got {type(result).__name__} "
               f"({result!r}). {_type_hint(result, logits, targets)}")
        expected = _right(logits, targets).mean().item()
        count = int(_right(logits, targets).sum().item())
        if not 0.0 <= result <= 1.0:
            kind = ("the count of right predictions" if result == count else "a percentage" if
                    _same(expected, result / 100) else "not a fraction")
            raise AssertionError(f"{what} returned {result}, outside [0, 1]: {kind}. Return the fraction "
                                 "(number right) / N.")
        if abs(result - expected) > TOLERANCE:
            hint = next((what_it_did for what_it_did, value in ACCURACY_MISTAKES
                         if all(_same(value(lg, t), r) for lg, t, r in runs)),
                        "Hint: the predicted class is the argmax over the class dimension (dim=1), one per sample; "
                        "accuracy is (number right) / N.")
            expect_close(result, expected, what, atol=TOLERANCE, rtol=0, hint=f"Expected {expected:.4f}. {hint}")
    passed("accuracy")


def _same(value, result) -> bool:
    return value is not None and isinstance(result, float) and abs(value - result) <= TOLERANCE


class _CheckNet(nn.Module):
    """A small model with dropout, so train() vs eval() changes the loss and the update."""

    def __init__(self):
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Linear(12, 16), nn.Dropout(0.5), nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def _reference_step(model, x, y, optimizer) -> dict:
    """One step with PyTorch's own ops, for comparison: its loss, and the losses known mistakes return."""
    eval_model = copy.deepcopy(model).eval()
    model.train()
    optimizer.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    optimizer.step()
    logits = logits.detach()
    with torch.no_grad():
        wrong = {
            "the SUM over the batch (reduction='sum'); F.cross_entropy's default, the mean, keeps the step size "
            "independent of the batch size": F.cross_entropy(logits, y, reduction="sum").item(),
            "cross-entropy of softmax(logits): F.cross_entropy applies log_softmax itself, so pass the raw "
            "logits": F.cross_entropy(logits.softmax(1), y).item(),
            "F.nll_loss of the raw logits: nll_loss expects log-probabilities (log_softmax first), or use "
            "F.cross_entropy": F.nll_loss(logits, y).item(),
            "the loss in eval mode (dropout off): call model.train() BEFORE the forward pass":
                F.cross_entropy(eval_model(x), y).item(),
            # the same random stream as an answer's second forward pass after optimizer.step()
            "the loss AFTER the update (a second forward pass after optimizer.step()): return the loss of the "
            "forward pass the gradients came from": F.cross_entropy(model(x), y).item(),
        }
    return {"loss": loss.item(), "wrong": wrong}


def _loss_hint(loss: float, reference: dict) -> str:
    """Name the loss the learner returned, if it is a known wrong one."""
    for what, value in reference["wrong"].items():
        if abs(loss - value) <= 1e-5 * max(1.0, abs(value)):
            return f"That is {what}."
    return ("Return the cross-entropy of model(x) against y computed before the update, in training mode "
            "(model.train()).")


def _update_hint(learner, before, without_zero_grad) -> str:
    """What the answer's update was, from the parameters it left: no zero_grad, by hand, or something else."""
    after = [p.detach() for p in learner.parameters()]
    if all(torch.allclose(a, b, atol=1e-6) for a, b in zip(after, without_zero_grad)):
        return ("The gradients of an earlier step were added to this one's: call optimizer.zero_grad() before "
                "loss.backward() (PyTorch adds new gradients to .grad).")
    grads = [p.grad for p in learner.parameters()]
    if all(g is not None for g in grads):
        steps = torch.cat([(b - a).reshape(-1) for a, b in zip(after, before)])
        flat = torch.cat([g.reshape(-1) for g in grads])
        lr = (steps @ flat / (flat @ flat)).item() if flat.any() else 0.0
        if lr > 0 and torch.allclose(steps, lr * flat, atol=1e-6):
            return (f"Your update is a plain p -= {lr:.3g} * p.grad (written by hand, or by an optimizer of your "
                    "own): update with the optimizer you are given (optimizer.step()), not by hand; it has its own "
                    "learning rate, momentum or Adam's moments.")
    return ("The update differs from one optimizer.step() on this batch's gradient: update with the optimizer you "
            "are given, once, after loss.backward().")


def _unchanged_hint(learner) -> str:
    grads = [p.grad for p in learner.parameters()]
    if all(g is None or not g.any() for g in grads):
        return ("No gradients are left after the call: loss.backward() did not run, or the gradients were cleared "
                "after it. Order: zero_grad(), forward, loss.backward(), optimizer.step().")
    return "The gradients are there, but no step used them: call optimizer.step() after loss.backward()."


# (optimizer class, its arguments, its name in messages): the learner must call the optimizer it is given,
# not write its own update (a hard-coded learning rate, or no momentum, would pass plain SGD with lr=0.1).
OPTIMIZERS = ((torch.optim.SGD, dict(lr=0.1), "SGD(lr=0.1)"),
              (torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=1e-3), "SGD(lr=0.05, momentum=0.9)"),
              (torch.optim.Adam, dict(lr=0.01), "Adam(lr=0.01)"))


def _one_step(train_step, learner, optimizer, x, y, step):
    """The answer's step, checked for what a step must not do; (its loss, what an answer without zero_grad
    would have left, the parameters before)."""
    shadow_model, shadow_opt = copy.deepcopy((learner, optimizer))
    for p, q in zip(learner.parameters(), shadow_model.parameters()):   # deepcopy leaves .grad behind
        q.grad = None if p.grad is None else p.grad.clone()
    before = [p.detach().clone() for p in learner.parameters()]
    torch.manual_seed(100 + step)
    shadow_model.train()
    F.cross_entropy(shadow_model(x), y).backward()
    shadow_opt.step()
    given = x.clone(), y.clone()
    torch.manual_seed(100 + step)  # the same dropout masks as the reference
    loss = call_answer(train_step, learner, x, y, optimizer, what="train_step")
    expect(torch.equal(x, given[0]) and torch.equal(y, given[1]),
           "train_step changed the batch x or y it was given: only read them.")
    return loss, [p.detach() for p in shadow_model.parameters()], before


def check_train_step(train_step) -> None:
    """train_step(model, x, y, optimizer) -> float: one training step with cross-entropy, loss before the step."""
    torch.manual_seed(0)
    x, y = torch.randn(8, 12), torch.randint(0, 4, (8,))
    for opt_class, kwargs, opt_name in OPTIMIZERS:
        torch.manual_seed(1)
        learner = _CheckNet()
        reference = copy.deepcopy(learner)
        optimizer = opt_class(learner.parameters(), **kwargs)
        ref_optimizer = opt_class(reference.parameters(), **kwargs)
        # A state a real loop leaves behind: stale gradients from an earlier step, model in eval mode.
        learner.eval()
        for p in learner.parameters():
            p.grad = torch.full_like(p, 0.5)

        for step in range(2):
            loss, without_zero_grad, before = _one_step(train_step, learner, optimizer, x, y, step)
            torch.manual_seed(100 + step)
            ref = _reference_step(reference, x, y, ref_optimizer)
            call = f"with {opt_name}, call {step + 1}"
            expect(isinstance(loss, float),
                   f"train_step should return the loss as a Python float, got {type(loss).__name__}. "
                   "Hint: loss.item() (a float also detaches it from the graph).")
            if step == 0:
                expect(any(not torch.equal(b, p) for b, p in zip(before, learner.parameters())),
                       f"train_step did not change the parameters ({call}). {_unchanged_hint(learner)}")
                expect(learner.training,
                       "after train_step the model is still in eval mode: call model.train() first, so dropout "
                       "(and batch norm) behave as in training.")
            expect_close(loss, ref["loss"], f"loss returned by train_step ({call})", atol=1e-5,
                         hint=_loss_hint(loss, ref))
            for (name, p), q in zip(learner.named_parameters(), reference.parameters()):
                if not torch.allclose(p.detach(), q.detach(), atol=1e-5):
                    expect_close(p.detach(), q.detach(), f"parameter {name!r} after train_step ({call})", atol=1e-5,
                                 hint=_update_hint(learner, before, without_zero_grad))
    passed("train_step")
