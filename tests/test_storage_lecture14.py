"""Relative indices with fillers, as lecture 14 shows them: every width, counted against the runs of zeros."""
import pytest
import torch

from course_lib.compression import storage


@pytest.mark.parametrize("bits", [3, 5, 8])
def test_fillers_are_the_runs_of_zeros_divided_by_2_to_the_b(bits):
    g = torch.Generator().manual_seed(0)
    positions = (torch.rand(5000, generator=g) < 0.08).nonzero().flatten()
    zeros = torch.diff(positions, prepend=torch.tensor([-1])) - 1
    gaps, is_filler = storage.relative_indices(positions, bits)
    assert int(is_filler.sum()) == int((zeros // 2**bits).sum()) and int(gaps.max()) < 2**bits
    assert torch.equal(storage.positions_from_gaps(gaps)[~is_filler], positions)
