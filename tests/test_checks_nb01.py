import pytest
import torch
import torch.nn.functional as F

from course_lib.checks.nb01 import check_accuracy, check_train_step
from nbtools import ROOT, notebook_namespace

NS = notebook_namespace(ROOT / "solutions" / "01_cpu_mnist_exercises.ipynb")


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass(capsys):
    check_accuracy(NS["accuracy"])
    check_train_step(NS["train_step"])
    assert capsys.readouterr().out.count("all checks passed") == 2


def test_stubs_fail():
    for check in (check_accuracy, check_train_step):
        with pytest.raises(NotImplementedError):
            check(stub)


@pytest.mark.parametrize("wrong", [
    lambda logits, t: (logits.argmax(0) == t).float().mean().item(),            # argmax over the batch
    lambda logits, t: float((logits.argmax(1) == t).sum().item()),             # a count, not a fraction
    lambda logits, t: (logits.softmax(1).max(1).values == t).float().mean().item(),  # compares probabilities
    lambda logits, t: (logits.argmax(1) == t).float().mean(),                  # a tensor, not a float
], ids=["wrong-dim", "count", "probabilities", "tensor"])
def test_accuracy_wrong_answers_fail(wrong):
    with pytest.raises(AssertionError):
        check_accuracy(wrong)


def no_zero_grad(model, x, y, optimizer):
    model.train()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def no_train_mode(model, x, y, optimizer):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def backward_after_step(model, x, y, optimizer):
    model.train()
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    optimizer.step()
    loss.backward()
    return loss.item()


def returns_tensor(model, x, y, optimizer):
    model.train()
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


@pytest.mark.parametrize("wrong", [no_zero_grad, no_train_mode, backward_after_step, returns_tensor])
def test_train_step_wrong_answers_fail(wrong):
    with pytest.raises(AssertionError):
        check_train_step(wrong)


def test_check_messages_say_why():
    with pytest.raises(AssertionError, match="zero_grad"):
        check_train_step(no_zero_grad)
    with pytest.raises(AssertionError, match="eval mode"):
        check_train_step(no_train_mode)
    with pytest.raises(AssertionError, match="fraction"):
        check_accuracy(lambda logits, t: float((logits.argmax(1) == t).sum().item()))
    with pytest.raises(AssertionError, match="dim=1"):
        check_accuracy(lambda logits, t: (logits.argmax(0) == t).float().mean().item())


def _step(loss_fn=lambda out, y: F.cross_entropy(out, y), update=None, zero=lambda m, o: o.zero_grad()):
    def train_step(model, x, y, optimizer):
        model.train()
        zero(model, optimizer)
        loss = loss_fn(model(x), y)
        loss.backward()
        if update is None:
            optimizer.step()
        else:
            update(model, optimizer)
        return loss.item()
    return train_step


def _by_hand(lr_of):
    def update(model, optimizer):
        with torch.no_grad():
            for p in model.parameters():
                p -= lr_of(optimizer) * p.grad
    return update


@pytest.mark.parametrize("wrong, hint", [
    (_step(lambda out, y: F.cross_entropy(out, y, reduction="sum")), "SUM over the batch"),
    (_step(lambda out, y: F.cross_entropy(out.softmax(1), y)), "softmax"),
    (_step(lambda out, y: F.nll_loss(out, y)), "log-probabilities"),
    (_step(update=_by_hand(lambda o: 0.1)), "not by hand"),                          # hard-coded learning rate
    (_step(update=_by_hand(lambda o: o.param_groups[0]["lr"])), "not by hand"),      # ignores momentum, Adam
    (_step(zero=lambda m, o: None), "zero_grad"),
], ids=["sum", "softmax", "nll-of-logits", "hand-update-lr", "hand-update-no-momentum", "no-zero-grad"])
def test_train_step_wrong_losses_and_updates(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_train_step(wrong)


def zero_grad_by_hand(model, optimizer):
    for p in model.parameters():
        p.grad = None


@pytest.mark.parametrize("right", [
    _step(zero=lambda m, o: m.zero_grad()),                                          # the model's zero_grad
    _step(zero=lambda m, o: o.zero_grad(set_to_none=False)),
    _step(zero=zero_grad_by_hand),
    _step(lambda out, y: torch.nn.CrossEntropyLoss()(out, y)),
    _step(lambda out, y: F.nll_loss(F.log_softmax(out, dim=1), y)),
], ids=["model-zero-grad", "zeros", "grad-none", "module-loss", "log-softmax-nll"])
def test_train_step_other_right_answers(right):
    check_train_step(right)
