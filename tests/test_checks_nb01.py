import pytest
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
