"""What a compressed model costs at inference: latency and storage, measured the same way everywhere.

Pruning, quantization and distillation all report these, so they come from one place:

    latency_seconds(model)                       # median seconds of one forward on a batch of 256
    compare_latency({"dense": a, "small": b})    # the same, interleaved: load hits both alike
    model_size_bytes(model)                      # dense fp32 storage of parameters and buffers
    serialized_bytes(model)                      # what torch.save writes (quantized models too)
    csr_model_bytes(model)                       # weight matrices stored sparse (CSR), the rest dense

Timings on a shared machine are noisy: report ratios measured side by side (`compare_latency`),
and never assert a tight time in a test.
"""
from __future__ import annotations

import io
import statistics
import time
import warnings

import torch
from torch import nn

from ..validate import non_negative_int, positive_int

INPUT_SHAPE = (1, 28, 28)   # one MNIST image


def example_batch(batch_size: int = 256, input_shape=INPUT_SHAPE, seed: int = 0) -> torch.Tensor:
    """A fixed random batch [batch_size, *input_shape] (latency does not depend on the values)."""
    positive_int("batch_size", batch_size)
    return torch.randn(batch_size, *input_shape, generator=torch.Generator().manual_seed(seed))


def _device(model: nn.Module) -> torch.device:
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def _timer(model: nn.Module, x: torch.Tensor):
    """A function that runs model(x) once and returns its wall-clock seconds."""
    sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)

    @torch.inference_mode()
    def once() -> float:
        sync()
        t0 = time.perf_counter()
        model(x)
        sync()
        return time.perf_counter() - t0
    return once


def compare_latency(models: dict, batch_size: int = 256, input_shape=INPUT_SHAPE, repeats: int = 30,
                    warmup: int = 5, inputs: torch.Tensor | None = None) -> dict:
    """name -> median seconds of one forward pass, in eval mode, models timed in turn every repeat.

    Interleaving means a burst of load on a shared machine slows every model, not just one, so
    the ratios stay fair. `warmup` untimed calls first (allocator, oneDNN/MKL kernel choice).
    inputs: a batch to use instead of `example_batch(batch_size, input_shape)`.
    """
    if not isinstance(models, dict) or not models:
        raise ValueError("models must be a non-empty dict name -> nn.Module")
    positive_int("repeats", repeats)
    non_negative_int("warmup", warmup)
    x = example_batch(batch_size, input_shape) if inputs is None else inputs
    modes = {name: m.training for name, m in models.items()}
    timers = {name: _timer(m.eval(), x.to(_device(m))) for name, m in models.items()}
    try:
        for _ in range(warmup):
            for once in timers.values():
                once()
        times = {name: [] for name in models}
        for _ in range(repeats):
            for name, once in timers.items():
                times[name].append(once())
    finally:
        for name, m in models.items():
            m.train(modes[name])
    return {name: statistics.median(t) for name, t in times.items()}


def latency_seconds(model: nn.Module, batch_size: int = 256, input_shape=INPUT_SHAPE, repeats: int = 30,
                    warmup: int = 5, inputs: torch.Tensor | None = None) -> float:
    """Median seconds of one forward pass of `model` on a batch (default 256 MNIST images)."""
    return compare_latency({"model": model}, batch_size, input_shape, repeats, warmup, inputs)["model"]


def model_size_bytes(model: nn.Module, bits: int = 32) -> int:
    """Storage of every parameter and floating-point buffer at `bits` per value (default dense fp32).

    Counts values, not the format: a pruned (masked) model is as big as the dense one here.
    """
    positive_int("bits", bits)
    values = sum(p.numel() for p in model.parameters())
    values += sum(b.numel() for b in model.buffers() if b.is_floating_point())
    return (values * bits + 7) // 8


def serialized_bytes(obj) -> int:
    """Bytes of torch.save(obj) (of its state_dict for a module): the real file size, whatever the format."""
    buffer = io.BytesIO()
    torch.save(obj.state_dict() if isinstance(obj, nn.Module) else obj, buffer)
    return buffer.getbuffer().nbytes


def csr(weight: torch.Tensor) -> torch.Tensor:
    """torch's CSR tensor of `weight` viewed as [out, -1] (a conv's filters flattened)."""
    if not isinstance(weight, torch.Tensor) or weight.dim() < 2:
        raise ValueError(f"weight must be a torch.Tensor with at least 2 dims; got {getattr(weight, 'shape', weight)!r}")
    with warnings.catch_warnings():   # torch warns on every conversion that CSR support is "beta"
        warnings.simplefilter("ignore", UserWarning)
        return weight.detach().reshape(weight.shape[0], -1).to_sparse_csr()


def csr_bytes(weight: torch.Tensor, index_dtype: torch.dtype = torch.int32) -> int:
    """Bytes of `weight` in CSR: non-zero values + one column index each + (rows + 1) row pointers."""
    matrix = csr(weight)
    index_bytes = torch.empty(0, dtype=index_dtype).element_size()
    return matrix.values().nbytes + (matrix.col_indices().numel() + matrix.crow_indices().numel()) * index_bytes


def csr_break_even_sparsity(rows: int, cols: int, value_bytes: int = 4, index_bytes: int = 4) -> float:
    """Sparsity above which CSR is smaller than dense rows x cols storage.

    dense = r*c*v; CSR = nnz*(v + i) + (r + 1)*i. Every kept value carries an i-byte column
    index, so fp32 with int32 indices breaks even near 50% sparsity, with int64 near 67%.
    """
    dense = rows * cols * value_bytes
    nnz = (dense - (rows + 1) * index_bytes) / (value_bytes + index_bytes)
    return 1 - nnz / (rows * cols)


def csr_model_bytes(model: nn.Module, index_dtype: torch.dtype = torch.int32) -> int:
    """Storage with every parameter of >= 2 dims (Linear/conv weights) in CSR and the rest dense."""
    return sum(csr_bytes(p, index_dtype) if p.dim() >= 2 else p.nbytes for p in model.parameters())
