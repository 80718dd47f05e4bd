"""The checks of exercise notebook 00 pass the reference solutions and fail stubs and wrong answers."""
import pytest
import torch

from course_lib.checks.nb00 import check_count_parameters, check_describe_batch
from nbtools import ROOT, notebook_namespace

NS = notebook_namespace(ROOT / "solutions" / "00_start_here_exercises.ipynb")


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_count_parameters(NS["count_parameters"])
    check_describe_batch(NS["describe_batch"])


def test_stubs_fail():
    for check in (check_count_parameters, check_describe_batch):
        with pytest.raises(NotImplementedError):
            check(stub)


@pytest.mark.parametrize("wrong, hint", [
    (lambda m: len(list(m.modules())), "modules"),
    (lambda m: len(list(m.parameters())), "tensors"),
    (lambda m: sum(t.numel() for t in m.state_dict().values()), "buffers"),
    (lambda m: sum(p.numel() for p in m.parameters() if p.dim() > 1), "Biases"),
    (lambda m: torch.tensor(sum(p.numel() for p in m.parameters())), "int"),
    # per layer: a weight shared by two layers is counted twice
    (lambda m: sum(p.numel() for layer in m.modules() for p in layer.parameters(recurse=False)), "shared"),
    (lambda m: sum(p.numel() for _, p in m.named_parameters(remove_duplicate=False)), "shared"),
    (lambda m: sum(p.numel() for p in m.parameters() if p.requires_grad), "Frozen"),
    (lambda m: sum(p.numel() for p in m.parameters() if p.grad is not None or p.requires_grad), "Frozen"),
])
def test_count_parameters_wrong_answers(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_count_parameters(wrong)


@pytest.mark.parametrize("right", [
    lambda m: sum(p.numel() for p in {id(p): p for p in m.parameters()}.values()),   # dedupe by identity
    lambda m: sum(p.numel() for _, p in m.named_parameters()),
    lambda m: int(sum(torch.tensor(p.shape).prod() for p in m.parameters())),
])
def test_count_parameters_other_right_answers(right):
    check_count_parameters(right)


def _described(x, **changes):
    d = {"shape": tuple(x.shape), "dtype": str(x.dtype), "min": float(x.min()), "max": float(x.max()),
         "mean": x.double().mean().item()}
    d.update({k: v(x) for k, v in changes.items()})
    return d


@pytest.mark.parametrize("wrong, hint", [
    (lambda x: {"shape": tuple(x.shape), "dtype": str(x.dtype), "min": x.min().item(), "max": x.max().item(),
                "mean": x.mean().item()}, "mean\\(\\) is only defined"),                # no float conversion
    (lambda x: _described(x, min=lambda x: x.min(), max=lambda x: x.max()), "Python float"),  # 0-d tensors
    (lambda x: _described(x, shape=lambda x: tuple(x[0].shape)), "batch dimension"),   # one sample's shape
    (lambda x: _described(x, dtype=lambda x: x.dtype), "str\\(x.dtype\\)"),            # a dtype, not a string
    (lambda x: _described(x, mean=lambda x: x.double().mean(0).mean().item() + 1), "mean"),
    (lambda x: [tuple(x.shape), str(x.dtype)], "dict"),
])
def test_describe_batch_wrong_answers(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_describe_batch(wrong)


def test_describe_batch_other_right_answer():
    check_describe_batch(lambda x: {"shape": tuple(x.size()), "dtype": str(x.dtype), "min": float(x.min()),
                                    "max": float(x.max()), "mean": float(x.to(torch.float64).mean())})
