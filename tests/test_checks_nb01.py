import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

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


# --- every input the text allows, and messages that name what the answer did (issue 34) ----------------------

def with_torchmetrics(logits, targets):
    from torchmetrics.functional import accuracy as metric
    return metric(logits, targets, task="multiclass", num_classes=logits.shape[1]).item()


def squeezes_in_place(logits, targets):
    targets.unsqueeze_(1)                                   # "to compare column-wise": changes the caller's tensor
    right = logits.argmax(1, keepdim=True) == targets
    targets.squeeze_(1)
    logits.softmax(1)
    return right.float().mean().item() if logits.abs_() is not None else 0.0


@pytest.mark.parametrize("wrong, words", [
    (lambda logits, t: (logits.argmax(0) == t).float().mean().item(), "over dim 0, the batch"),
    (lambda logits, t: (logits.max(1).values == t).float().mean().item(), "largest logit VALUE"),
    (lambda logits, t: (logits.softmax(1).max(1).values == t).float().mean().item(), "largest probability VALUE"),
    (lambda logits, t: (logits.argmax(1) == t).sum().item() / logits.shape[1], "number of classes"),
    (lambda logits, t: (logits.argmax(1) == t).sum().item(), "number of right predictions \\(7\\): divide it by N"),
    (lambda logits, t: (logits.argmax(1) == t).sum().item() // len(t), "integer division"),
    (lambda logits, t: 100 * (logits.argmax(1) == t).float().mean().item(), "a percentage"),
    (lambda logits, t: (logits.argmax(1) == t).float().mean(), "a tensor.*item"),
    (lambda logits, t: (logits.argmax() == t).float().mean().item(), "Expected 0.7000.*argmax over the class dim"),
    (squeezes_in_place, "changed its inputs"),
    (with_torchmetrics, "uses torchmetrics"),
    (lambda logits, t: multiclass_accuracy(logits, t, num_classes=10).item(), "uses multiclass_accuracy"),
])
def test_accuracy_wrong_answers_named(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_accuracy(wrong)


def multiclass_accuracy(*args, **kwargs):                   # stands for torchmetrics' function, imported elsewhere
    raise AssertionError("not reached: the check refuses the call by its name")


@pytest.mark.parametrize("right", [
    lambda logits, t: logits.argmax(-1).eq(t).sum().item() / t.numel(),
    lambda logits, t: float((logits.max(dim=1).indices == t).double().mean()),
    lambda logits, t: sum(int(row.argmax()) == int(c) for row, c in zip(logits, t)) / len(t),
    lambda logits, t: (logits.topk(1, dim=1).indices.squeeze(1) == t).float().mean().item(),
])
def test_accuracy_more_right_answers(right):
    check_accuracy(right)


def train_after_forward(model, x, y, optimizer):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)                     # still in eval mode: dropout off
    model.train()
    loss.backward()
    optimizer.step()
    return loss.item()


def loss_after_step(model, x, y, optimizer):
    model.train()
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    return F.cross_entropy(model(x), y).item()


def no_backward(model, x, y, optimizer):
    model.train()
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    optimizer.step()
    return loss.item()


def own_optimizer(model, x, y, optimizer):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # ignores the one it is given
    return NS["train_step"](model, x, y, optimizer)


def normalises_x_in_place(model, x, y, optimizer):
    x -= x.mean()
    return NS["train_step"](model, x, y, optimizer)


@pytest.mark.parametrize("wrong, words", [
    (train_after_forward, "loss in eval mode.*BEFORE the forward pass"),
    (loss_after_step, "loss AFTER the update"),
    (backward_after_step, "gradients are there, but no step used them"),
    (no_backward, "No gradients are left after the call"),
    (own_optimizer, "Your update is a plain p -= 0.1 \\* p.grad.*optimizer of your own"),
    (normalises_x_in_place, "changed the batch x or y"),
])
def test_train_step_wrong_answers_named(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_train_step(wrong)


# --- property tests: the solution agrees with PyTorch on drawn inputs ------------------------------------------

@settings(max_examples=20)
@given(n=st.integers(1, 12), c=st.integers(1, 6), dtype=st.sampled_from([torch.float32, torch.float64,
                                                                         torch.bfloat16]), seed=st.integers(0, 999))
def test_solution_accuracy_equals_torchmetrics(n, c, dtype, seed):
    from torchmetrics.functional import accuracy as metric
    g = torch.Generator().manual_seed(seed)
    logits = torch.stack([torch.randperm(c, generator=g) for _ in range(n)]).to(dtype)   # no ties
    targets = torch.randint(0, c, (n,), generator=g)
    got = NS["accuracy"](logits, targets)
    want = metric(logits.float(), targets, task="multiclass", num_classes=c, average="micro").item() if c > 1 else 1.0
    assert isinstance(got, float) and abs(got - want) < 1e-6


@settings(max_examples=15)
@given(batch=st.integers(1, 6), opt=st.sampled_from(range(3)), seed=st.integers(0, 999))
def test_solution_step_equals_the_optimizers_own(batch, opt, seed):
    """Any batch size and optimizer: the solution's step is PyTorch's, starting from eval mode and stale grads."""
    import copy
    from course_lib.checks.nb01 import OPTIMIZERS, _CheckNet
    opt_class, kwargs, _ = OPTIMIZERS[opt]
    torch.manual_seed(seed)
    model, x, y = _CheckNet().eval(), torch.randn(batch, 12), torch.randint(0, 4, (batch,))
    twin = copy.deepcopy(model)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    o1, o2 = opt_class(model.parameters(), **kwargs), opt_class(twin.parameters(), **kwargs)
    torch.manual_seed(seed)
    loss = NS["train_step"](model, x, y, o1)
    torch.manual_seed(seed)
    twin.train()
    want = F.cross_entropy(twin(x), y)
    want.backward()
    o2.step()
    assert isinstance(loss, float) and abs(loss - want.item()) < 1e-6
    assert all(torch.allclose(p, q) for p, q in zip(model.parameters(), twin.parameters()))


def test_calls_function_sees_bare_and_dotted_calls_only():
    from course_lib.checks.nb01 import calls_function
    assert calls_function("return multiclass_accuracy(a, b)", "multiclass_accuracy")
    assert calls_function("return torchmetrics.functional.accuracy(a, b)", "accuracy")
    assert calls_function("from torchmetrics import Accuracy", "Accuracy")
    assert not calls_function("def accuracy(a, b):\n    return a  # accuracy(a, b)\n", "accuracy")
    assert not calls_function("accuracy = 'accuracy(a)'", "accuracy")
