"""Collectives from send/recv agree with torch.distributed on 2, 3 and 4 ranks, any size; ring traffic."""
import pytest
import torch

from course_lib.distributed import collectives as C
from course_lib.distributed.launch import launch
from course_lib.distributed.ring import plot_ring_step, ring_schedule, ring_state, ring_stepper


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_every_collective_matches_torch_distributed(world_size):
    sizes = (1, world_size * 4, world_size * 4 + 1, 1001)  # smaller than N, divisible, and not
    for rank, errors in enumerate(launch(C.compare_with_torch, world_size, sizes)):
        assert {"all_reduce_naive", "all_reduce_tree", "all_reduce_ring", "reduce_scatter", "broadcast",
                "scatter", "all_gather", "reduce(non-root unchanged)"} <= set(errors)
        assert max(errors.values()) < 1e-5, (rank, errors)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ring_spreads_traffic_evenly_and_naive_piles_it_on_rank_0():
    n, numel = 4, 1000
    results = launch(C.traffic_of, n, numel)
    sent = {alg: C.traffic_matrix([r[alg] for r in results]) for alg in C.ALGORITHMS}
    size = numel * 4
    ring = sent["ring"]
    assert ring.sum(1).tolist() == [2 * (n - 1) * size // n] * n      # 2(N-1)/N x size per rank
    assert all(ring[r, (r + 1) % n] == ring[r].sum() for r in range(n))  # only to the right neighbour
    assert sent["naive"].sum(1).tolist() == [(n - 1) * size] + [size] * (n - 1)
    assert sent["tree"].sum(1).max() == 2 * size  # log2(4) sends from the root
    assert all(not r[alg].collective_calls for r in results for alg in C.ALGORITHMS)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_ring_schedule_ends_with_every_chunk_fully_reduced(n):
    schedule = ring_schedule(n)
    assert len(schedule) == 2 * (n - 1)
    assert all(dst == (src + 1) % n for step in schedule for src, dst, _, _ in step)
    assert torch.all(ring_state(schedule, n, len(schedule)) == n)
    if n > 1:  # after reduce-scatter, rank r holds the finished chunk (r+1) % N
        half = ring_state(schedule, n, n - 1)
        assert all(half[r, (r + 1) % n] == n for r in range(n))


def test_ring_plot_and_stepper_run_headless():
    import matplotlib
    matplotlib.use("Agg")
    schedule = ring_schedule(3)
    for step in range(len(schedule) + 1):
        plot_ring_step(schedule, step)
    assert ring_stepper(3) is not None


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="world_size"):
        ring_schedule(0)
    with pytest.raises(ValueError, match="step"):
        ring_state(ring_schedule(3), 3, 5)
    with pytest.raises(ValueError, match="algorithm"):
        C.all_reduce(torch.ones(3), algorithm="butterfly")
    with pytest.raises(ValueError, match="op"):
        C.all_reduce_ring(torch.ones(3), op="mean")
    with pytest.raises(ValueError, match="contiguous"):
        C.all_reduce_ring(torch.ones(3, 4).t(), op="sum")
    with pytest.raises(TypeError, match="tensor"):
        C.reduce_scatter([1.0, 2.0])
