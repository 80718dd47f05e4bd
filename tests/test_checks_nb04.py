"""The checks of exercise notebook 04 pass the reference solutions and fail stubs and wrong answers."""
import pytest
import torch

from course_lib.checks.nb04 import check_evaluate_accuracy, check_to_device
from nbtools import ROOT, notebook_namespace

NS = notebook_namespace(ROOT / "solutions" / "04_single_gpu_exercises.ipynb")


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_to_device(NS["to_device"])
    check_evaluate_accuracy(NS["evaluate_accuracy"])


def test_stubs_fail():
    for check in (check_to_device, check_evaluate_accuracy):
        with pytest.raises(NotImplementedError):
            check(stub)


def tuples_only(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, tuple):
        return tuple(tuples_only(b, device) for b in batch)
    return batch


def loses_keys(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return [loses_keys(v, device) for v in batch.values()]
    if isinstance(batch, (list, tuple)):
        return type(batch)(loses_keys(b, device) for b in batch)
    return batch


def moves_numbers(batch, device):
    if isinstance(batch, dict):
        return {k: moves_numbers(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(moves_numbers(b, device) for b in batch)
    if isinstance(batch, str):
        return batch
    return torch.as_tensor(batch).to(device)


def lists_become_tuples(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: lists_become_tuples(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return tuple(lists_become_tuples(b, device) for b in batch)
    return batch


def in_place(batch, device):
    if isinstance(batch, dict):
        for k, v in batch.items():
            batch[k] = in_place(v, device)
        return batch
    return NS["to_device"](batch, device)


@pytest.mark.parametrize("wrong, hint", [
    (tuples_only, "not moved"), (loses_keys, "dict"), (moves_numbers, "unchanged"),
    (lists_become_tuples, "keep their type"), (in_place, "in place"),
])
def test_to_device_wrong_answers(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_to_device(wrong)


def no_eval(model, loader, device):
    correct = seen = 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            correct += (model(x).argmax(1) == y).sum().item()
            seen += len(y)
    return correct / seen


def not_moved(model, loader, device):
    was = model.training
    model.eval()
    correct = seen = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            seen += len(y)
    model.train(was)
    return correct / seen


def with_grad(model, loader, device):
    was = model.training
    model.eval()
    correct = seen = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        correct += (model(x).argmax(1) == y).sum().item()
        seen += len(y)
    model.train(was)
    return correct / seen


def mean_of_batches(model, loader, device):
    was = model.training
    model.eval()
    accs = []
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            accs.append((model(x).argmax(1) == y).float().mean().item())
    model.train(was)
    return sum(accs) / len(accs)


def stays_in_eval(model, loader, device):
    model.eval()
    with torch.no_grad():
        pairs = [(model(x.to(device)).argmax(1) == y.to(device)) for x, y in loader]
    return torch.cat(pairs).float().mean().item()


def percent(model, loader, device):
    return 100 * NS["evaluate_accuracy"](model, loader, device)


@pytest.mark.parametrize("wrong, hint", [
    (no_eval, "training mode"), (not_moved, "never moved"), (with_grad, "no_grad"),
    (mean_of_batches, "per-batch"), (stays_in_eval, "left in eval mode"), (percent, "fraction"),
])
def test_evaluate_accuracy_wrong_answers(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_evaluate_accuracy(wrong)


def to_device_pytree(batch, device):
    from torch.utils._pytree import tree_map
    return tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, batch)


def to_device_match(batch, device):
    match batch:
        case torch.Tensor():
            return batch.to(device, non_blocking=True)
        case dict():
            return {k: to_device_match(v, device) for k, v in batch.items()}
        case list():
            return [to_device_match(v, device) for v in batch]
        case tuple():
            return tuple(to_device_match(v, device) for v in batch)
        case _:
            return batch


@pytest.mark.parametrize("right", [to_device_pytree, to_device_match])
def test_to_device_other_right_answers(right):
    check_to_device(right)


def inference_mode_tensors(model, loader, device):
    was = model.training
    model.eval()
    correct, seen = torch.zeros(()), 0
    with torch.inference_mode():
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            correct += model(x).argmax(dim=1).eq(y).sum()
            seen += y.numel()
    model.train(mode=was)
    return float(correct) / seen


@torch.no_grad()
def decorated_cpu_compare(model, loader, device):
    was = model.training
    model.eval()
    hits = [(model(x.to(device)).argmax(1).cpu() == y).sum().item() for x, y in loader]
    sizes = [len(y) for _, y in loader]
    if was:
        model.train()
    return sum(hits) / sum(sizes)


def y_not_moved(model, loader, device):
    was = model.training
    model.eval()
    correct = seen = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x.to(device)).argmax(1) == y).sum().item()
            seen += len(y)
    model.train(was)
    return correct / seen


@pytest.mark.parametrize("right", [inference_mode_tensors, decorated_cpu_compare])
def test_evaluate_accuracy_other_right_answers(right):
    check_evaluate_accuracy(right)


def test_labels_left_on_the_host_fail():
    with pytest.raises(AssertionError, match="labels"):
        check_evaluate_accuracy(y_not_moved)
