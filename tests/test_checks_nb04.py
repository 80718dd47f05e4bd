"""The checks of exercise notebook 04 pass the reference solutions and fail stubs and wrong answers."""
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils._pytree import tree_map

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
    (lists_become_tuples, "keep their type"), (in_place, "changed the batch it was given"),
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


# --- every input the text allows, and messages that name what the answer did (issue 34) ----------------------

def any_iterable(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: any_iterable(v, device) for k, v in batch.items()}
    if hasattr(batch, "__iter__"):                            # a str is iterable too
        return type(batch)([any_iterable(v, device) for v in batch])
    return batch


def top_level_only(batch, device):
    if isinstance(batch, dict):
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return NS["to_device"](batch, device)


def tuples_become_lists(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: tuples_become_lists(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [tuples_become_lists(v, device) for v in batch]
    return batch


def drops_none(batch, device):
    if isinstance(batch, dict):
        return {k: drops_none(v, device) for k, v in batch.items() if v is not None}
    return NS["to_device"](batch, device)


def lists_in_place(batch, device):
    if isinstance(batch, list):
        for i, v in enumerate(batch):
            batch[i] = lists_in_place(v, device)
        return batch
    if isinstance(batch, dict):
        return {k: lists_in_place(v, device) for k, v in batch.items()}
    return NS["to_device"](batch, device)


def with_cuda(batch, device):
    return torch.utils._pytree.tree_map(lambda v: v.cuda() if isinstance(v, torch.Tensor) else v, batch)


@pytest.mark.parametrize("wrong, words", [
    (any_iterable, "recursed forever on a string"),
    (top_level_only, "batch\\['meta'\\] came back as the very dict it was"),
    (tuples_become_lists, "batch\\['pair'\\] is a tuple and must come back as a tuple.*got list"),
    (drops_none, "the keys of batch\\[0\\] changed|keys of batch changed"),
    (lists_in_place, "changed the batch it was given \\(a dict batch\\)"),
    (with_cuda, "raised|is on cuda"),
], ids=lambda v: getattr(v, "__name__", v))
def test_to_device_wrong_answers_named(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_to_device(wrong)


def with_course_evaluate(model, loader, device):
    from course_lib import loop
    return loop.evaluate(model, loader, device)[1]


def count_of_right(model, loader, device):
    return int(100 * NS["evaluate_accuracy"](model, loader, device) * 13 / 100 + 0.5)


def normalises_in_place(model, loader, device):
    for x, _ in loader:
        x -= x.mean()
    return NS["evaluate_accuracy"](model, loader, device)


@pytest.mark.parametrize("wrong, words", [
    (with_course_evaluate, "calls course_lib.loop.evaluate"),
    (count_of_right, "got int \\(9\\).*number of right predictions \\(9\\)"),
    (percent, "that is a percentage"),
    (normalises_in_place, "changed the batches of the loader"),
    (lambda m, loader, d: torch.tensor(NS["evaluate_accuracy"](m, loader, d)), "got Tensor.*item"),
])
def test_evaluate_accuracy_wrong_answers_named(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_evaluate_accuracy(wrong)


# --- property tests: the solutions agree with PyTorch on drawn inputs ------------------------------------------

LEAVES = st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=3), st.none(), st.booleans(),
                   st.integers(0, 3).map(lambda d: torch.ones([2] * d)))
BATCHES = st.recursive(LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.lists(inner, max_size=3).map(tuple),
                                                        st.dictionaries(st.text(max_size=3), inner, max_size=3)),
                       max_leaves=12)


def _same_structure(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.device == b.device and a.shape == b.shape
    if isinstance(a, (list, tuple, dict)):
        keys = list(a) if isinstance(a, dict) else range(len(a))
        return (type(a) is type(b) and len(a) == len(b) and (not isinstance(a, dict) or list(a) == list(b))
                and all(_same_structure(a[k], b[k]) for k in keys))
    return type(a) is type(b) and a == b


@settings(max_examples=30)
@given(batch=BATCHES)
def test_solution_moves_any_nest_as_pytree_does(batch):
    meta = torch.device("meta")
    expected = tree_map(lambda v: v.to(meta) if isinstance(v, torch.Tensor) else v, batch)
    assert _same_structure(NS["to_device"](batch, meta), expected)


@settings(max_examples=20)
@given(n=st.integers(1, 30), batch_size=st.integers(1, 8), training=st.booleans(), seed=st.integers(0, 999))
def test_solution_accuracy_equals_the_course_evaluate(n, batch_size, training, seed):
    from course_lib.data import TensorLoader
    from course_lib.loop import evaluate
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Dropout(0.5)).train(training)
    loader = TensorLoader(torch.randn(n, 5), torch.randint(0, 4, (n,)), batch_size=batch_size, shuffle=False)
    got = NS["evaluate_accuracy"](net, loader, torch.device("cpu"))
    assert net.training == training
    assert abs(got - evaluate(net, loader)[1]) < 1e-12
