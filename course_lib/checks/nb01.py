"""Checks for the exercises of lecture 01 (CPU MNIST): `accuracy` and `train_step`."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from . import expect, expect_close, passed


def _call(fn, *args, what: str, hint: str = ""):
    """Call the learner's fn; turn a crash (other than the stub's NotImplementedError) into a hint."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:  # a shape error from the wrong dim is a wrong answer, not a test crash
        raise AssertionError(f"{what} raised {type(exc).__name__}: {exc}. {hint}".strip()) from exc


def check_accuracy(accuracy) -> None:
    """accuracy(logits [N, C], targets [N] int64) -> Python float, the fraction predicted right."""
    g = torch.Generator().manual_seed(1)
    hint_dim = "The predicted class is the argmax over the class dimension (dim=1), one per sample."
    cases = [
        (torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [0.5, 0.2, 0.9], [1.0, 0.0, 4.0]]),
         torch.tensor([0, 1, 1, 2])),                                          # 3 of 4 right
        (torch.randn(10, 10, generator=g), torch.randint(0, 10, (10,), generator=g)),  # square: dim 0 runs
        (torch.randn(37, 10, generator=g), torch.randint(0, 10, (37,), generator=g)),
        (torch.randn(5, 10, generator=g) * 0.01 - 3.0, torch.arange(5)),       # negative logits
    ]
    for logits, targets in cases:
        result = _call(accuracy, logits.clone(), targets.clone(), what=f"accuracy on logits {tuple(logits.shape)}",
                       hint=hint_dim)
        expect(isinstance(result, float),
               f"accuracy should return a Python float, got {type(result).__name__}. "
               "Hint: a 0-d tensor becomes a float with .item().")
        expected = (logits.argmax(dim=1) == targets).double().mean().item()
        expect(0.0 <= result <= 1.0,
               f"accuracy returned {result}, outside [0, 1]: return a fraction (correct / N), not a count.")
        expect_close(result, expected, f"accuracy on logits {tuple(logits.shape)}", atol=1e-9,
                     hint=f"expected {expected:.4f}. {hint_dim} Compare class indices with the targets, "
                          "not probabilities.")
    passed("accuracy")


class _CheckNet(nn.Module):
    """A small model with dropout, so train() vs eval() changes the loss and the update."""

    def __init__(self):
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Linear(12, 16), nn.Dropout(0.5), nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def _reference_step(model, x, y, optimizer) -> tuple[float, torch.Tensor]:
    """One step with PyTorch's own ops, for comparison: (loss, the logits it came from)."""
    model.train()
    optimizer.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    optimizer.step()
    return loss.item(), logits.detach()


def _loss_hint(loss: float, logits: torch.Tensor, y: torch.Tensor) -> str:
    """Name the loss the learner seems to have returned, if it is a known wrong one."""
    wrong = {"the SUM over the batch (reduction='sum'); F.cross_entropy's default, the mean, keeps the step size "
             "independent of the batch size": F.cross_entropy(logits, y, reduction="sum").item(),
             "cross-entropy of softmax(logits): F.cross_entropy applies log_softmax itself, so pass the raw "
             "logits": F.cross_entropy(logits.softmax(1), y).item(),
             "F.nll_loss of the raw logits: nll_loss expects log-probabilities (log_softmax first), or use "
             "F.cross_entropy": F.nll_loss(logits, y).item()}
    for what, value in wrong.items():
        if abs(loss - value) <= 1e-4 * max(1.0, abs(value)):
            return f"That is {what}."
    return ("Return the cross-entropy of model(x) against y computed before the update, in training mode "
            "(model.train()).")


# (optimizer class, its arguments, its name in messages): the learner must call the optimizer it is given,
# not write its own update (a hard-coded learning rate, or no momentum, would pass plain SGD with lr=0.1).
OPTIMIZERS = ((torch.optim.SGD, dict(lr=0.1), "SGD(lr=0.1)"),
              (torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=1e-3), "SGD(lr=0.05, momentum=0.9)"),
              (torch.optim.Adam, dict(lr=0.01), "Adam(lr=0.01)"))


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
        before = [p.detach().clone() for p in learner.parameters()]

        for step in range(2):
            torch.manual_seed(100 + step)  # same dropout masks for both
            ref_loss, ref_logits = _reference_step(reference, x, y, ref_optimizer)
            torch.manual_seed(100 + step)
            loss = _call(train_step, learner, x, y, optimizer, what="train_step")
            call = f"with {opt_name}, call {step + 1}"
            expect(isinstance(loss, float),
                   f"train_step should return the loss as a Python float, got {type(loss).__name__}. "
                   "Hint: loss.item() (a float also detaches it from the graph).")
            if step == 0:
                expect(any(not torch.equal(b, p) for b, p in zip(before, learner.parameters())),
                       "train_step did not change the parameters. Hint: call optimizer.step() after loss.backward().")
                expect(learner.training,
                       "after train_step the model is still in eval mode: call model.train() first, so dropout "
                       "(and batch norm) behave as in training.")
            expect_close(loss, ref_loss, f"loss returned by train_step ({call})", atol=1e-5,
                         hint=_loss_hint(loss, ref_logits, y))
            for (name, p), q in zip(learner.named_parameters(), reference.parameters()):
                expect_close(p.detach(), q.detach(), f"parameter {name!r} after train_step ({call})", atol=1e-5,
                             hint="The update differs from one optimizer.step() on this batch's gradient. Did you "
                                  "call optimizer.zero_grad() first (else old gradients add up), and loss.backward() "
                                  "before optimizer.step()? Update with the optimizer you are given (its learning "
                                  "rate, momentum, ...), not by hand.")
    passed("train_step")
