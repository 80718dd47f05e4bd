"""course_lib.compression.measure: what is timed, how often, and how bytes are counted (never how fast)."""
import pytest
import torch
from torch import nn

from course_lib.compression import measure as M
from course_lib.compression.pruning import magnitude_mask
from course_lib.models import LeNet5, LeNet300


class Recorder(nn.Module):
    """Counts calls and remembers the input shape and the grad mode it saw."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(784, 10)
        self.calls, self.shapes, self.grad = 0, set(), set()

    def forward(self, x):
        self.calls += 1
        self.shapes.add(tuple(x.shape))
        self.grad.add(torch.is_grad_enabled())
        return self.lin(x.flatten(1))


def test_latency_seconds_times_batch_256_after_warmup_without_grad():
    model = Recorder().train()
    seconds = M.latency_seconds(model, repeats=4, warmup=2)
    assert isinstance(seconds, float) and seconds > 0
    assert model.calls == 6 and model.shapes == {(256, 1, 28, 28)} and model.grad == {False}
    assert model.training   # eval during timing, mode restored afterwards


def test_compare_latency_interleaves_and_honours_inputs():
    a, b = Recorder(), Recorder()
    x = torch.randn(3, 784)
    times = M.compare_latency({"a": a, "b": b}, repeats=3, warmup=1, inputs=x)
    assert set(times) == {"a", "b"} and all(t > 0 for t in times.values())
    assert a.calls == b.calls == 4 and a.shapes == {(3, 784)}


def test_latency_of_real_models_is_finite():
    times = M.compare_latency({"lenet300": LeNet300(), "lenet5": LeNet5()}, batch_size=8, repeats=2, warmup=1)
    assert all(0 < t < 10 for t in times.values())


@pytest.mark.parametrize("kwargs,match", [
    ({"repeats": 0}, "repeats must be a positive int"),
    ({"warmup": -1}, "warmup must be a non-negative int"),
    ({"batch_size": 0}, "batch_size must be a positive int"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        M.latency_seconds(LeNet300(), **kwargs)


def test_compare_latency_needs_models():
    with pytest.raises(ValueError, match="non-empty dict"):
        M.compare_latency({})


def test_model_size_bytes_counts_parameters_and_float_buffers():
    assert M.model_size_bytes(LeNet300()) == 266_610 * 4
    assert M.model_size_bytes(LeNet300(), bits=8) == 266_610
    bn = nn.BatchNorm1d(10)   # weight, bias, running_mean, running_var; not num_batches_tracked (int)
    assert M.model_size_bytes(bn) == 40 * 4
    with pytest.raises(ValueError, match="bits"):
        M.model_size_bytes(bn, bits=0)


def test_serialized_bytes_is_the_file_size():
    size = M.serialized_bytes(LeNet300())
    assert M.model_size_bytes(LeNet300()) < size < M.model_size_bytes(LeNet300()) + 10_000
    model = LeNet300()
    assert M.serialized_bytes(model.state_dict()) == M.serialized_bytes(model)     # any object torch.save takes
    assert M.serialized_bytes({"w": torch.zeros(1000, dtype=torch.int8)}) < M.serialized_bytes({"w": torch.zeros(1000)})


def test_csr_bytes_are_torchs_and_break_even_is_where_they_cross():
    w = torch.randn(300, 784, generator=torch.Generator().manual_seed(0))
    csr = M.csr(w)
    assert M.csr_bytes(w, torch.int64) == sum(t.nbytes for t in (csr.values(), csr.col_indices(), csr.crow_indices()))
    for index_dtype, index_bytes, near in ((torch.int32, 4, 0.5), (torch.int64, 8, 2 / 3)):
        s = M.csr_break_even_sparsity(300, 784, 4, index_bytes)
        assert s == pytest.approx(near, abs=0.01)
        dense = w.numel() * 4
        assert M.csr_bytes(w * magnitude_mask(w, s - 0.01), index_dtype) > dense
        assert M.csr_bytes(w * magnitude_mask(w, s + 0.01), index_dtype) < dense


def test_csr_model_bytes_stores_matrices_sparse_and_vectors_dense():
    model = LeNet300()
    assert M.csr_model_bytes(model, torch.int64) > M.model_size_bytes(model)   # dense weights: CSR only adds indices
    with torch.no_grad():
        for layer in (model.fc1, model.fc2, model.fc3):
            layer.weight.zero_()
    biases = sum(layer.bias.nbytes for layer in (model.fc1, model.fc2, model.fc3))
    assert M.csr_model_bytes(model) == biases + 4 * (301 + 101 + 11)            # only the row pointers remain
    with pytest.raises(ValueError, match="at least 2 dims"):
        M.csr(torch.ones(3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_latency_on_gpu_synchronizes():
    model = LeNet300().cuda()
    assert M.latency_seconds(model, repeats=3, warmup=1) > 0
