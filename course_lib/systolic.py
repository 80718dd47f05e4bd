"""A systolic array, simulated cycle by cycle: how a TPU multiplies matrices.

A grid of multiply-accumulate cells, each wired only to its neighbours. This simulator is
*output-stationary*: cell (i, j) keeps the running sum C[i, j]; values of A flow left to right,
values of B top to bottom, one cell per clock cycle. Row i of A enters i cycles late and column j
of B j cycles late (the *skew*), so that A[i, p] and B[p, j] meet in cell (i, j) at cycle i + j + p.
Output-stationary is the easiest to read: the answer builds up in place.

TPUs are *weight-stationary* instead: each cell holds one weight, loaded once and then reused for
every row of a whole batch of activations streaming past, and the partial sums flow down. In
inference the weights are the same for every input, so keeping them in the cells saves reloading them.
Either way the point is the same: every operand is read from memory ONCE and then handed from cell
to cell, instead of being read once per multiply-add (`naive_reads`).

    from course_lib import systolic
    run = systolic.matmul(A, B)              # A (n, k), B (k, m); an n x m array of cells
    run.C, run.cycles, run.reads             # == A @ B; k + n + m - 2 cycles; n*k + k*m reads
    systolic.tiled_matmul(A, B, rows=4, cols=4)   # a fixed 4 x 4 array, one output tile at a time
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

from .validate import positive_int


class Run(NamedTuple):
    """The product, the clock cycles it took, and how many numbers were read from memory."""

    C: torch.Tensor
    cycles: int
    reads: int


def _check_operands(A, B) -> None:
    for name, t in (("A", A), ("B", B)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor; got {getattr(t, 'shape', type(t).__name__)}")
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"A's columns must equal B's rows; got A {tuple(A.shape)} and B {tuple(B.shape)}")


def feed(A: torch.Tensor, B: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The values that enter the array at cycle t: (a_left (n,), b_top (m,)), zeros outside the data.

    Row i of A enters at the left edge i cycles late: a_left[i] = A[i, t - i].
    Column j of B enters at the top edge j cycles late: b_top[j] = B[t - j, j].
    """
    n, k = A.shape
    m = B.shape[1]
    a_left = torch.zeros(n, dtype=A.dtype)
    b_top = torch.zeros(m, dtype=B.dtype)
    for i in range(n):
        if 0 <= t - i < k:
            a_left[i] = A[i, t - i]
    for j in range(m):
        if 0 <= t - j < k:
            b_top[j] = B[t - j, j]
    return a_left, b_top


def step(acc, a, b, a_left, b_top):
    """One clock cycle. Every cell takes the a of its left neighbour and the b of the one above
    (the edge cells take a_left / b_top) and adds their product to its sum. All (n, m) tensors."""
    a = torch.cat([a_left[:, None], a[:, :-1]], dim=1)    # a moves one cell right
    b = torch.cat([b_top[None, :], b[:-1, :]], dim=0)     # b moves one cell down
    return acc + a * b, a, b


def matmul(A: torch.Tensor, B: torch.Tensor, feed: Callable = feed,
           on_cycle: Callable | None = None) -> Run:
    """A @ B on an n x m output-stationary array. on_cycle(t, a, b, acc) sees every cycle (pictures).

    The last products meet in the far corner cell (n-1, m-1) at cycle (k-1) + (n-1) + (m-1),
    so the run takes k + n + m - 2 cycles. `feed` is replaceable (the exercise writes one).
    """
    _check_operands(A, B)
    n, k = A.shape
    m = B.shape[1]
    dtype = torch.result_type(A, B)
    acc, a, b = (torch.zeros(n, m, dtype=dtype) for _ in range(3))
    cycles = k + n + m - 2
    for t in range(cycles):
        a_left, b_top = feed(A, B, t)
        acc, a, b = step(acc, a, b, a_left.to(dtype), b_top.to(dtype))
        if on_cycle is not None:
            on_cycle(t, a, b, acc)
    return Run(acc, cycles, reads=n * k + k * m)


def tiled_matmul(A: torch.Tensor, B: torch.Tensor, rows: int, cols: int) -> Run:
    """A @ B on a fixed rows x cols array: one (rows, cols) tile of C at a time.

    Each tile reads its rows of A and its columns of B once, so A is read ceil(m / cols) times
    and B ceil(n / rows) times: a bigger array means fewer re-reads.
    """
    _check_operands(A, B)
    positive_int("rows", rows)
    positive_int("cols", cols)
    n, m = A.shape[0], B.shape[1]
    C = torch.zeros(n, m, dtype=torch.result_type(A, B))
    cycles = reads = 0
    for i in range(0, n, rows):
        for j in range(0, m, cols):
            tile = matmul(A[i:i + rows], B[:, j:j + cols])
            C[i:i + rows, j:j + cols] = tile.C
            cycles, reads = cycles + tile.cycles, reads + tile.reads
    return Run(C, cycles, reads)


def naive_reads(n: int, k: int, m: int) -> int:
    """Numbers a matmul reads when every multiply-add fetches both operands from memory: 2*n*k*m."""
    for name, v in (("n", n), ("k", k), ("m", m)):
        positive_int(name, v)
    return 2 * n * k * m


def tiled_reads(n: int, k: int, m: int, rows: int, cols: int) -> int:
    """The reads of `tiled_matmul` from shapes alone: n*k*ceil(m/cols) + k*m*ceil(n/rows)."""
    naive_reads(n, k, m)
    positive_int("rows", rows)
    positive_int("cols", cols)
    return n * k * math.ceil(m / cols) + k * m * math.ceil(n / rows)


def snapshots(A: torch.Tensor, B: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(a, b, acc) of every cell after each cycle of `matmul(A, B)`, for pictures."""
    frames = []
    matmul(A, B, on_cycle=lambda t, a, b, acc: frames.append((a.clone(), b.clone(), acc.clone())))
    return frames


def draw_cycles(A: torch.Tensor, B: torch.Tensor, cycles=None, axes=None):
    """One grid per cycle: each cell shows the a (from the left) and b (from above) it holds and its sum;
    green cells multiply a pair that belongs together this cycle."""
    frames = snapshots(A, B)
    cycles = list(range(len(frames))) if cycles is None else list(cycles)
    for t in cycles:
        if not 0 <= t < len(frames):
            raise ValueError(f"cycles must lie in 0..{len(frames) - 1}; got {t}")
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(1, len(cycles), figsize=(2.6 * len(cycles), 2.9))
    axes = [axes] if not hasattr(axes, "__len__") else list(axes)
    n, m = frames[0][2].shape
    k = A.shape[1]
    i, j = torch.arange(n)[:, None], torch.arange(m)[None, :]
    for ax, t in zip(axes, cycles):
        a, b, acc = frames[t]
        busy = (t - i - j >= 0) & (t - i - j < k)     # A[i, p] and B[p, j] meet here at t = i + j + p
        ax.imshow(busy.float(), cmap="Greens", vmin=0, vmax=2)
        for r in range(n):
            for c in range(m):
                ax.text(c, r - 0.22, f"a={a[r, c]:g} b={b[r, c]:g}", ha="center", va="center", fontsize=7)
                ax.text(c, r + 0.18, f"{acc[r, c]:g}", ha="center", va="center", fontsize=11, weight="bold")
        ax.set_xticks(range(m)), ax.set_yticks(range(n))
        ax.set_title(f"cycle {t}")
    return axes
