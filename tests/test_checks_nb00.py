"""The checks of exercise notebook 00 pass the reference solutions and fail stubs and wrong answers."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

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


# --- every input the text allows, and messages that name what the answer did (issue 34) ----------------------

def course_library(m):
    from course_lib import models
    return models.count_parameters(m)


def trainable_after_unfreezing(m):
    m.requires_grad_(True)                                   # "count everything": unfreezes the caller's model
    return sum(p.numel() for p in m.parameters() if p.requires_grad)


def counts_in_eval_mode(m):
    m.eval()
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("wrong, words", [
    (course_library, "calls course_lib.models.count_parameters"),
    (lambda m: sum(p.numel() for c in m.children() for p in c.parameters()), "model.children\\(\\)"),
    (lambda m: sum(t.numel() for t in m.state_dict().values()), "state_dict.*shared weight"),
    (lambda m: sum(len(p) for p in m.parameters()), "raised TypeError on a model with its own 0-d parameter"),
    (lambda m: sum(p.shape[0] * p.shape[1] for p in m.parameters()), "raised IndexError"),
    (lambda m: torch.nn.utils.parameters_to_vector(m.parameters()).numel(), "on nn.ReLU\\(\\), which has no param"),
    (trainable_after_unfreezing, "changed the model.*requires_grad flags differ"),
    (counts_in_eval_mode, "changed the model.*train/eval modes of its modules differ"),
    (lambda m: sum(p.numel() for p in m.parameters() if p.dim() > 0), "A 0-d parameter.*is a parameter too"),
])
def test_count_parameters_wrong_answers_named(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_count_parameters(wrong)


def test_count_parameters_more_right_answers():
    import math

    import numpy as np
    check_count_parameters(lambda m: sum(math.prod(p.shape) for p in m.parameters()))
    check_count_parameters(lambda m: sum(int(np.prod(p.shape)) for p in m.parameters()))
    check_count_parameters(lambda m: sum(p.numel() for p in {p for p in m.parameters()}))


def describe_via_view(x):
    flat = x.view(-1).double()
    return {"shape": tuple(x.shape), "dtype": str(x.dtype), "min": flat.min().item(), "max": flat.max().item(),
            "mean": flat.mean().item()}


def shifts_in_place(x):
    x -= x.min()                                             # "normalise" the caller's batch
    return _described(x)


@pytest.mark.parametrize("wrong, words", [
    (lambda x: _described(x, shape=lambda x: list(x.shape)), "shape: expected a tuple; got list"),
    (describe_via_view, "failed on a permuted \\(non-contiguous\\).*view"),
    (lambda x: _described(x, mean=lambda x: x.sum().item() / x.numel()), "mean came out infinite.*overflowed"),
    (shifts_in_place, "changed the batch it was given"),
    (lambda x: _described(x, min=lambda x: x.min().item()), "min of a uint8.*got int.*floating point first"),
    (lambda x: _described(x, mean=lambda x: x[0].double().mean().item()), "first sample's mean"),
    (lambda x: _described(x, max=lambda x: x.double().amax(dim=0).mean().item()), "max of a float64"),
])
def test_describe_batch_wrong_answers_named(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_describe_batch(wrong)


def test_describe_batch_more_right_answers():
    check_describe_batch(lambda x: {"shape": x.shape, "dtype": str(x.dtype), "min": x.float().min().item(),
                                    "max": x.float().max().item(), "mean": x.float().mean().item()})
    check_describe_batch(lambda x: dict(shape=tuple(x.shape), dtype=str(x.dtype),
                                        **{k: float(getattr(x.double(), k)()) for k in ("min", "max", "mean")}))


# --- property tests: the solutions agree with PyTorch on drawn inputs ------------------------------------------

LAYERS = st.sampled_from(["linear", "linear-no-bias", "conv", "batchnorm", "embedding", "relu"])


def _layer(kind, width):
    return {"linear": lambda: nn.Linear(width, width), "linear-no-bias": lambda: nn.Linear(width, width, bias=False),
            "conv": lambda: nn.Conv2d(width, width, 3), "batchnorm": lambda: nn.BatchNorm1d(width),
            "embedding": lambda: nn.Embedding(7, width), "relu": nn.ReLU}[kind]()


@settings(max_examples=40)
@given(kinds=st.lists(LAYERS, max_size=5), width=st.integers(1, 6), tie=st.booleans(), freeze=st.booleans())
def test_solution_counts_what_pytorch_holds(kinds, width, tie, freeze):
    """Any stack of layers, some sharing a weight, some frozen: the parameter elements PyTorch itself holds."""
    layers = [_layer(kind, width) for kind in kinds]
    linears = [layer for layer in layers if type(layer) is nn.Linear]
    if tie and len(linears) >= 2:
        linears[1].weight = linears[0].weight
    if freeze and layers:
        layers[0].requires_grad_(False)
    model = nn.Sequential(*layers)
    unique = {id(p): p for p in model.parameters()}.values()
    expected = nn.utils.parameters_to_vector(unique).numel() if unique else 0
    got = NS["count_parameters"](model)
    assert type(got) is int and got == expected


DTYPES = st.sampled_from([torch.uint8, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64])


@settings(max_examples=60)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), dtype=DTYPES, permute=st.booleans(),
       seed=st.integers(0, 2**16))
def test_solution_describes_any_batch(shape, dtype, permute, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randint(0, 256, shape, generator=g) if not dtype.is_floating_point else
         torch.randn(shape, generator=g) * 100).to(dtype)
    if permute:
        x = x.permute(*reversed(range(x.dim())))
    d = NS["describe_batch"](x)
    assert d["shape"] == tuple(x.shape) and d["dtype"] == str(x.dtype)
    assert (d["min"], d["max"]) == (x.min().item(), x.max().item())
    assert all(type(d[k]) is float for k in ("min", "max", "mean"))
    assert math.isclose(d["mean"], torch.mean(x.double()).item(), rel_tol=1e-12, abs_tol=1e-12)
