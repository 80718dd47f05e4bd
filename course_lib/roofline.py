"""The roofline: which roof, compute or memory, limits a kernel (Williams, Waterman, Patterson 2009).

A kernel that does F FLOPs while moving B bytes has arithmetic intensity I = F / B (FLOP/byte).
Memory delivers at most `bandwidth` bytes/s, so the kernel cannot beat bandwidth * I FLOP/s;
the cores cannot beat `peak`. Attainable FLOP/s = min(peak, bandwidth * I): a slanted roof for
low-intensity kernels (memory-bound: elementwise ops), a flat one for high-intensity kernels
(compute-bound: large matmuls). The two meet at the ridge point I = peak / bandwidth.

    from course_lib.roofline import course_kernels, plot_roofline, layer_bound
    points = course_kernels("cpu")         # a matmul, Net's two convolutions, an elementwise add
    plot_roofline(points, peak_flops=1e11, bandwidth=1e10)
    layers, bound = layer_bound(batch=64)  # Net's layers trained alone: the FLOP/s its step cannot beat

Bytes are the tensors' sizes (each input read once, the output written once): the least traffic
the kernel can have. Real kernels may move more, which makes them sit lower, never higher.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .env import get_device
from .flops import count_flops
from .gpu import time_fn
from .validate import positive_int


class KernelPoint(NamedTuple):
    """One measured kernel: its FLOPs, the bytes it must move, and its median seconds per call."""

    name: str
    flops: float
    bytes: float
    seconds: float

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes

    @property
    def flops_per_second(self) -> float:
        return self.flops / self.seconds


def attainable(intensity, peak_flops: float, bandwidth: float):
    """The roof: min(peak_flops, bandwidth * intensity), in FLOP/s (bandwidth in bytes/s)."""
    if not (peak_flops > 0 and bandwidth > 0):
        raise ValueError(f"peak_flops and bandwidth must be > 0; got {peak_flops!r}, {bandwidth!r}")
    if isinstance(intensity, torch.Tensor):
        return torch.clamp(intensity * bandwidth, max=peak_flops)
    return min(peak_flops, bandwidth * intensity)


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measure_kernel(name: str, fn, flops: float, tensors, device="cpu", repeats: int = 5) -> KernelPoint:
    """Time `fn()` (median of `repeats`, after one warm-up) and pair it with its FLOPs and bytes.

    tensors: every tensor the kernel reads or writes once; their sizes add up to its bytes.
    """
    if not flops > 0:
        raise ValueError(f"flops must be > 0; got {flops!r}")
    seconds = time_fn(fn, get_device(str(device)), repeats=repeats, warmup=1)
    return KernelPoint(name, float(flops), float(_nbytes(*tensors)), seconds)


@torch.no_grad()
def course_kernels(device="cpu", matmul_n: int = 512, batch: int = 256, add_numel: int = 2**22,
                   repeats: int = 5) -> list[KernelPoint]:
    """Measure the course's kernels on `device`: a matmul, Net's conv1 and conv2, an elementwise add.

    FLOPs of the matmul and the convolutions come from FlopCounterMode (2 per multiply-add); the
    add's from the formula (one FLOP per element: FlopCounterMode does not count elementwise ops).
    """
    from .models import Net

    positive_int("matmul_n", matmul_n)
    positive_int("batch", batch)
    positive_int("add_numel", add_numel)
    device = get_device(str(device))
    net = Net().to(device).eval()
    points = []
    a, b = torch.randn(matmul_n, matmul_n, device=device), torch.randn(matmul_n, matmul_n, device=device)
    c = a @ b
    points.append(measure_kernel(f"matmul {matmul_n}x{matmul_n}", lambda: torch.mm(a, b, out=c),
                                 count_flops(lambda: a @ b), (a, b, c), device, repeats))
    x = torch.randn(batch, 1, 28, 28, device=device)
    for name, conv in (("conv1", net.conv1), ("conv2", net.conv2)):
        y = conv(x)
        points.append(measure_kernel(f"Net.{name}, batch {batch}", lambda conv=conv, x=x: conv(x),
                                     count_flops(lambda conv=conv, x=x: conv(x)),
                                     (x, conv.weight, conv.bias, y), device, repeats))
        x = torch.relu(torch.max_pool2d(y, 2))          # conv2's input, as in Net.forward
    u, v = torch.randn(add_numel, device=device), torch.randn(add_numel, device=device)
    w = torch.empty_like(u)
    points.append(measure_kernel(f"add, {add_numel:,} floats", lambda: torch.add(u, v, out=w), add_numel,
                                 (u, v, w), device, repeats))
    return points


def layer_bound(batch: int = 64, memory_format: str = "channels_last", device="cpu",
                repeats: int = 20) -> tuple[list[KernelPoint], float]:
    """Each of Net's layers trained alone: forward + backward of conv1, conv2, fc1, fc2 at `batch`, timed apart.

    Returns (one KernelPoint per layer, bound): bound = the layers' FLOPs over the sum of their times, the
    FLOP/s of a training step in which nothing else (pooling, activations, dropout, the loss, the optimizer,
    Python) took any time. A run of Net cannot beat it with these kernels: it is the ceiling to compare a
    run's achieved FLOP/s with, in place of the matmul peak (thin layers: 10 and 20 output channels).
    conv1's backward computes only its weight and bias gradients (its input is the image), as in training.
    memory_format: "channels_last" or "contiguous" for the convolutions' activations.
    """
    from .models import Net

    positive_int("batch", batch)
    positive_int("repeats", repeats)
    if memory_format not in ("channels_last", "contiguous"):
        raise ValueError(f"memory_format must be 'channels_last' or 'contiguous'; got {memory_format!r}")
    layout = torch.channels_last if memory_format == "channels_last" else torch.contiguous_format
    device = get_device(str(device))
    with torch.random.fork_rng(devices=[]):     # seeded here, and the caller's random stream left as it was
        torch.manual_seed(0)
        net = Net().to(device).to(memory_format=layout)
        x1 = torch.randn(batch, 1, 28, 28).to(device).contiguous(memory_format=layout)
    with torch.no_grad():      # each layer's input as Net.forward makes it
        x2 = torch.relu(torch.max_pool2d(net.conv1(x1), 2))
        x3 = torch.relu(torch.max_pool2d(net.conv2(x2), 2)).flatten(1)
        x4 = torch.relu(net.fc1(x3))
    points = []
    for name, layer, x in (("conv1", net.conv1, x1), ("conv2", net.conv2, x2), ("fc1", net.fc1, x3),
                           ("fc2", net.fc2, x4)):
        x = x.detach().requires_grad_(name != "conv1")
        grad = torch.ones_like(layer(x))

        def step(layer=layer, x=x, grad=grad):
            layer.zero_grad(set_to_none=True)
            x.grad = None
            layer(x).backward(grad)

        points.append(measure_kernel(f"Net.{name} fwd+bwd, batch {batch}", step, count_flops(step),
                                     (x, layer.weight, layer.bias, grad), device, repeats))
    return points, sum(p.flops for p in points) / sum(p.seconds for p in points)


def plot_roofline(points, peak_flops: float, bandwidth: float, ax=None, title: str | None = None,
                  other_peaks: dict | None = None):
    """Log-log roofline with the measured `points` on it; returns the axes.

    peak_flops in FLOP/s, bandwidth in bytes/s; other_peaks {label: FLOP/s} draws more flat roofs
    (e.g. an estimated datasheet peak) as dashed lines.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    lo = min([p.intensity for p in points] + [peak_flops / bandwidth]) / 4
    hi = max([p.intensity for p in points] + [peak_flops / bandwidth]) * 4
    grid = torch.logspace(torch.log10(torch.tensor(lo)), torch.log10(torch.tensor(hi)), 200, dtype=torch.float64)
    ax.plot(grid, attainable(grid, peak_flops, bandwidth) / 1e9, "k-", lw=2,
            label=f"roof: {peak_flops / 1e9:.0f} GFLOP/s, {bandwidth / 1e9:.1f} GB/s")
    for label, value in (other_peaks or {}).items():
        ax.axhline(value / 1e9, color="gray", ls="--", lw=1, label=f"{label}: {value / 1e9:.0f} GFLOP/s")
    for p in points:
        ax.plot(p.intensity, p.flops_per_second / 1e9, "o", ms=8,
                label=f"{p.name}: {p.intensity:.2g} FLOP/B, {p.flops_per_second / 1e9:.3g} GFLOP/s")
    ax.axvline(peak_flops / bandwidth, color="gray", ls=":", lw=1)
    ax.set_xscale("log"), ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte)"), ax.set_ylabel("GFLOP/s")
    ax.set_title(title or "roofline")
    ax.legend(fontsize=7, loc="lower right")
    return ax
