"""α–β cost model: formulas, fit, nccl-tests bandwidths, and one real measurement (what-if: tests/test_network.py)."""

import matplotlib
import numpy as np
import pytest

from course_lib.distributed import costmodel as cm
from course_lib.bench.allreduce import allreduce_bench, human_bytes

matplotlib.use("Agg")
A, B = 1e-5, 1e-9  # 10 µs, 1 GB/s


def test_formulas_match_hand_computed_cases():
    n = 1e6
    assert cm.ring_time(n, 4, A, B) == pytest.approx(6e-5 + 1.5e-3)    # 2·3·α + 2·3/4·n·β
    assert cm.naive_time(n, 4, A, B) == pytest.approx(6e-5 + 6e-3)     # 2·3·α + 2·3·n·β
    assert cm.tree_time(n, 4, A, B) == pytest.approx(4e-5 + 4e-3)      # 2·log2(4)·(α + n·β)
    assert cm.tree_time(n, 5, A, B) == pytest.approx(6 * (A + n * B))  # ⌈log2 5⌉ = 3
    assert cm.ring_time(n, 2, A, B) == pytest.approx(2 * A + n * B)
    for algorithm in cm.ALGORITHMS:
        assert cm.allreduce_time(algorithm, n, 1, A, B) == 0.0          # one rank sends nothing
    times = cm.ring_time(np.array([0.0, 1e6]), 8, A, B)
    assert times.shape == (2,) and times[0] == pytest.approx(14 * A)
    # the ring's bandwidth term stays below 2·n·β for any p; naive's grows with p
    assert cm.ring_time(n, 64, 0, B) < 2 * n * B < cm.naive_time(n, 3, 0, B)


def test_formulas_refuse_bad_input():
    with pytest.raises(ValueError, match="algorithm must be one of"):
        cm.allreduce_time("star", 1, 2, A, B)
    with pytest.raises(ValueError, match="world_size"):
        cm.ring_time(1, 0, A, B)
    with pytest.raises(ValueError, match="n_bytes"):
        cm.ring_time(-1, 2, A, B)
    with pytest.raises(ValueError, match="alpha and beta"):
        cm.ring_time(1, 2, -A, B)


@pytest.mark.parametrize("algorithm", cm.ALGORITHMS)
@pytest.mark.parametrize("p", [2, 4])
def test_fit_recovers_known_alpha_beta(algorithm, p):
    sizes = np.array([2.0**10 * 4**k for k in range(9)])
    exact = cm.allreduce_time(algorithm, sizes, p, A, B)
    assert cm.fit_alpha_beta(sizes, exact, algorithm, p) == pytest.approx((A, B), rel=1e-9)
    noisy = exact * np.random.default_rng(0).uniform(0.97, 1.03, len(sizes))
    alpha, beta = cm.fit_alpha_beta(sizes, noisy, algorithm, p)
    assert alpha == pytest.approx(A, rel=0.1) and beta == pytest.approx(B, rel=0.1)
    assert cm.relative_errors(sizes, noisy, algorithm, p, alpha, beta).max() < 0.06


def test_fit_keeps_alpha_and_beta_non_negative_and_checks_input():
    sizes = np.array([1e3, 1e4, 1e5, 1e6])
    assert cm.fit_alpha_beta(sizes, np.full(4, 1e-3), "ring", 2) == pytest.approx((5e-4, 0), rel=1e-9, abs=1e-20)
    alpha, beta = cm.fit_alpha_beta(sizes, [2e-3, 1.9e-3, 1.5e-3, 1e-3], "ring", 2)  # unconstrained: beta < 0
    assert beta == 0 and 5e-4 < alpha < 1e-3
    with pytest.raises(ValueError, match="same length"):
        cm.fit_alpha_beta([1, 2, 3], [1, 2], "ring", 2)
    with pytest.raises(ValueError, match="times > 0"):
        cm.fit_alpha_beta([1, 2], [1, 0], "ring", 2)
    with pytest.raises(ValueError, match="world_size must be >= 2"):
        cm.fit_alpha_beta([1, 2], [1, 2], "ring", 1)


def test_algbw_and_busbw_follow_nccl_tests():
    assert cm.algbw(1e9, 1.0) == pytest.approx(1.0)                      # GB/s = size / time / 1e9
    assert cm.algbw(2**20, 1e-3) == pytest.approx(2**20 / 1e-3 / 1e9)
    for n, factor in [(2, 1.0), (4, 1.5), (8, 1.75)]:                   # 2(n-1)/n
        assert cm.busbw(1e9, 1.0, n) == pytest.approx(factor)
    assert cm.busbw(1e9, 1.0, 4, "all_gather") == pytest.approx(0.75)
    assert cm.busbw(1e9, 1.0, 4, "broadcast") == pytest.approx(1.0)
    # a ring that runs exactly at link speed 1/β shows busbw == link bandwidth, whatever p
    for p in (2, 3, 8):
        assert cm.busbw(1e9, cm.ring_time(1e9, p, 0, B), p) == pytest.approx(1 / B / 1e9)
    with pytest.raises(ValueError, match="collective must be one of"):
        cm.busbw(1, 1, 2, "gossip")
    with pytest.raises(ValueError, match="time_s"):
        cm.algbw(1, 0)


def test_plot_and_helpers():
    sizes = [2**10, 2**20, 2**24]
    times = cm.ring_time(np.array(sizes, float), 2, A, B)
    ax = cm.plot_measured_vs_predicted(sizes, {"ring": times}, {"ring": (A, B)}, world_size=2)
    assert len(ax.lines) == 2 and ax.get_xscale() == "log"
    assert [human_bytes(n) for n in (512, 2**10, 2**26)] == ["512 B", "1 KB", "64 MB"]
    # measure() refuses bad arguments before it starts any process
    with pytest.raises(ValueError, match="impl_name"):
        cm.measure([1024], impls=("gloo",))
    with pytest.raises(ValueError, match="sizes_bytes"):
        cm.measure([0, 1024])
    with pytest.raises(ValueError, match="repeats"):
        cm.measure([1024], repeats=0)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_quick_benchmark_measures_both_implementations_on_two_ranks():
    """Structure only: timings on a shared machine are noise, never asserted."""
    result = allreduce_bench(quick=True)
    s = result.summary
    assert {"ratio_1mb_plus", "model_max_error", "model_max_error_torch", "alpha_us", "bandwidth_GBps",
            "speedup", "table", "backend"} <= set(s)
    assert s["world_size"] == 2 and s["quick"] and s["ratio_1mb_plus"] > 0 and s["model_max_error"] >= 0
    assert [r["bytes"] for r in s["table"]] == [2**10, 2**14, 2**16, 2**18, 2**20, 2**22, 2**24]
    assert all(r["torch_s"] > 0 and r["ring_s"] > 0 for r in s["table"])
    assert len(result.rows) == 7 and "ring busbw GB/s" in result.rows[0]


def test_terms_split_latency_from_bandwidth():
    lat, bw = cm.allreduce_terms("ring", 1e6, 4, A, B)
    assert lat == pytest.approx(6 * A) and bw == pytest.approx(1.5e-3)
    assert lat + bw == pytest.approx(cm.ring_time(1e6, 4, A, B))
    lat, bw = cm.allreduce_terms("ring", np.array([1e6, 1e6]), 1024, A, B)
    assert lat == pytest.approx(2 * 1023 * A) and bw == pytest.approx(2 * 1023 / 1024 * 1e6 * B)
