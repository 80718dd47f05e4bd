"""The systolic-array simulator agrees with torch.matmul and counts cycles and reads as documented."""
import pytest
import torch

from course_lib import systolic


def ints(*shape, seed=0):
    return torch.randint(-5, 6, shape, generator=torch.Generator().manual_seed(seed)).float()


@pytest.mark.parametrize("n, k, m", [(1, 1, 1), (3, 3, 3), (2, 5, 4), (6, 1, 2), (4, 7, 1)])
def test_matmul_exact_for_integer_values(n, k, m):
    A, B = ints(n, k), ints(k, m, seed=1)
    run = systolic.matmul(A, B)
    assert torch.equal(run.C, A @ B)
    assert run.cycles == k + n + m - 2 and run.reads == n * k + k * m


def test_matmul_floats_and_integer_dtype():
    g = torch.Generator().manual_seed(2)
    A, B = torch.randn(5, 4, generator=g), torch.randn(4, 3, generator=g)
    assert torch.allclose(systolic.matmul(A, B).C, A @ B, atol=1e-6)
    Ai, Bi = A.mul(10).long(), B.mul(10).long()
    run = systolic.matmul(Ai, Bi)
    assert run.C.dtype == torch.int64 and torch.equal(run.C, Ai @ Bi)


@pytest.mark.parametrize("n, k, m, rows, cols", [(7, 5, 9, 3, 4), (8, 8, 8, 4, 4), (2, 3, 2, 4, 4), (5, 2, 6, 1, 1)])
def test_tiled_matmul(n, k, m, rows, cols):
    A, B = ints(n, k, seed=3), ints(k, m, seed=4)
    run = systolic.tiled_matmul(A, B, rows, cols)
    assert torch.equal(run.C, A @ B)
    assert run.reads == systolic.tiled_reads(n, k, m, rows, cols)


def test_reads_reuse():
    # a 1x1 array re-reads both operands for every multiply-add; an s x s array reuses each s times
    assert systolic.tiled_reads(16, 16, 16, 1, 1) == systolic.naive_reads(16, 16, 16) == 2 * 16**3
    assert systolic.naive_reads(64, 64, 64) / systolic.tiled_reads(64, 64, 64, 8, 8) == 8


def test_on_cycle_and_snapshots():
    A, B = ints(2, 3), ints(3, 2, seed=5)
    frames = systolic.snapshots(A, B)
    assert len(frames) == 3 + 2 + 2 - 2 and torch.equal(frames[-1][2], A @ B)
    a, b, acc = frames[0]                       # cycle 0: only cell (0, 0) holds data
    assert a[0, 0] == A[0, 0] and b[0, 0] == B[0, 0] and acc[0, 0] == A[0, 0] * B[0, 0] and acc.count_nonzero() <= 1


@pytest.mark.parametrize("args, match", [
    ((torch.ones(3), torch.ones(3, 2)), "A must be a 2-D"),
    ((torch.ones(2, 3), [[1.0]]), "B must be a 2-D"),
    ((torch.ones(2, 3), torch.ones(4, 2)), "A's columns must equal B's rows"),
])
def test_bad_operands(args, match):
    with pytest.raises(ValueError, match=match):
        systolic.matmul(*args)


def test_bad_sizes():
    with pytest.raises(ValueError, match="rows"):
        systolic.tiled_matmul(torch.ones(2, 2), torch.ones(2, 2), rows=0, cols=2)
    with pytest.raises(ValueError, match="cols"):
        systolic.tiled_reads(2, 2, 2, 2, 1.5)
    with pytest.raises(ValueError, match="k"):
        systolic.naive_reads(2, 0, 2)
    with pytest.raises(ValueError, match="cycles"):
        systolic.draw_cycles(torch.ones(2, 2), torch.ones(2, 2), cycles=[9])
