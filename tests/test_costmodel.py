"""α–β cost model: formulas, fit, nccl-tests bandwidths, what-if calculator, and one real measurement."""
import math

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


def test_scaling_efficiency_limits_and_a_hand_case():
    assert cm.scaling_efficiency(10**9, 4, 0.1, math.inf, 64, alpha=0) == 1.0    # infinite bandwidth
    assert cm.scaling_efficiency(10**9, 4, 0.1, 1.25, 1) == 1.0                   # one GPU: no comm
    assert cm.scaling_efficiency(10**6, 4, 0.1, 1.0, 2, alpha=0) == pytest.approx(0.1 / 0.104)
    assert cm.scaling_efficiency(10**6, 4, 0.1, 1.0, 2, alpha=0, overlap=1.0) == 1.0  # fully hidden
    # overlap can never hide more than the compute: 4 s of comm, 0.1 s compute
    assert cm.scaling_efficiency(10**9, 4, 0.1, 1.0, 2, alpha=0, overlap=1.0) == pytest.approx(0.1 / 4.0)
    effs = [cm.scaling_efficiency(25_600_000, 4, 0.1, 1.25, n, alpha=50e-6) for n in (2, 4, 8, 64)]
    assert effs == sorted(effs, reverse=True) and 0 < effs[-1] < effs[0] < 1


@pytest.mark.parametrize("kwargs, name", [
    ({"parameters": 0}, "parameters"), ({"parameters": 1.5}, "parameters"),
    ({"bytes_per_param": 0}, "bytes_per_param"),
    ({"step_compute_s": -1}, "step_compute_s"), ({"link_GBps": 0}, "link_GBps"), ({"link_GBps": "fast"}, "link_GBps"),
    ({"n_gpus": 0}, "n_gpus"), ({"alpha": -1e-6}, "alpha"),
    ({"overlap": 1.5}, "overlap"), ({"overlap": True}, "overlap"),
])
def test_scaling_efficiency_refuses_bad_input_by_name(kwargs, name):
    args = {"parameters": 1000, "bytes_per_param": 4, "step_compute_s": 0.1, "link_GBps": 1.0, "n_gpus": 2} | kwargs
    with pytest.raises(ValueError, match=name):
        cm.scaling_efficiency(**args)


def test_what_if_table_nvlink_beats_ethernet():
    rows = cm.what_if_table(n_gpus=8)
    assert len(rows) == len(cm.EXAMPLE_MODELS) * len(cm.LINKS)
    by = {(r["model"], r["link"]): r for r in rows}
    for model in cm.EXAMPLE_MODELS:
        assert by[(model, "NVLink4 (H100)")]["efficiency"] >= by[(model, "10 GbE")]["efficiency"]
    assert by[("1B-param", "10 GbE")]["efficiency"] < 0.5 < by[("ResNet-50", "NVLink4 (H100)")]["efficiency"]
    with pytest.raises(ValueError, match="n_gpus"):
        cm.what_if_table(n_gpus=0)


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


def test_links_are_per_direction_and_named_by_generation():
    for name, (both, one) in cm.NVLINK_GENERATIONS.items():
        assert one == both / 2 and "NVLink" in name and "(" in name       # per direction = half the total
    assert cm.LINKS["NVLink4 (H100)"][1] == 450 and cm.LINKS["InfiniBand NDR"][1] == 400 / 8
    assert [cm.link_for(g) for g in (2, 8, 9, 64)] == ["NVLink4 (H100)"] * 2 + ["InfiniBand NDR"] * 2
    assert cm.link_for(72, domain=cm.NVLINK_DOMAIN["GB200 NVL72"]) == "NVLink4 (H100)"
    with pytest.raises(ValueError, match="between"):
        cm.link_for(16, between="carrier pigeon")


def test_terms_split_latency_from_bandwidth():
    lat, bw = cm.allreduce_terms("ring", 1e6, 4, A, B)
    assert lat == pytest.approx(6 * A) and bw == pytest.approx(1.5e-3)
    assert lat + bw == pytest.approx(cm.ring_time(1e6, 4, A, B))
    lat, bw = cm.allreduce_terms("ring", np.array([1e6, 1e6]), 1024, A, B)
    assert lat == pytest.approx(2 * 1023 * A) and bw == pytest.approx(2 * 1023 / 1024 * 1e6 * B)
