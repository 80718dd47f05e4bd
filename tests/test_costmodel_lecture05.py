"""The cost-model facts lecture 05 states, checked here in full (the lecture keeps one assert per fact)."""
import math

import pytest

from course_lib.distributed import costmodel as cm

ALPHA, BETA, P = 10e-6, 1 / 10e9, 16  # the lecture's example: 10 µs, 10 GB/s, 16 ranks


def test_tree_wins_small_messages_ring_wins_large_ones_and_the_latency_terms_grow_as_drawn():
    small, large = 2**10, 2**28
    t = {a: cm.allreduce_time(a, [small, large], P, ALPHA, BETA) for a in cm.ALGORITHMS}
    assert t["tree"][0] < t["ring"][0]                    # 2 log2(p) latencies beat 2(p-1)
    assert t["ring"][1] < t["tree"][1] < t["naive"][1]    # the ring moves the fewest bytes per link
    assert all(cm.ring_time(large, q, 0, BETA) < 2 * large * BETA for q in (2, 8, 1024))
    ring_lat = [cm.allreduce_terms("ring", 0, q, ALPHA, BETA)[0] for q in (8, 1024)]
    tree_lat = [cm.allreduce_terms("tree", 0, q, ALPHA, BETA)[0] for q in (8, 1024)]
    assert ring_lat == pytest.approx([14 * ALPHA, 2046 * ALPHA]) and tree_lat == pytest.approx([6 * ALPHA, 20 * ALPHA])


@pytest.mark.parametrize("q", [2, 4, 8, 64])
def test_busbw_is_algbw_times_2p_minus_1_over_p_and_shows_link_speed(q):
    assert math.isclose(cm.busbw(2**20, 1e-3, q), cm.algbw(2**20, 1e-3) * 2 * (q - 1) / q)
    assert math.isclose(cm.busbw(2**30, cm.ring_time(2**30, q, 0, BETA), q), 1 / BETA / 1e9)


def test_resnet50_what_if_nvlink_scales_ethernet_does_not_overlap_helps():
    params, compute = cm.EXAMPLE_MODELS["ResNet-50"]
    eff = lambda link, g, overlap=0.0: cm.scaling_efficiency(params, 4, compute, cm.LINKS[link][1], g,
                                                             alpha=cm.LINKS[link][0], overlap=overlap)
    assert eff("NVLink4 (H100)", 8) > eff("InfiniBand NDR", 64) > 0.9 > 0.5 > eff("10 GbE", 64)
    assert eff("10 GbE", 64, overlap=0.8) > eff("10 GbE", 64)
    assert cm.scaling_efficiency(10**9, 4, 1.0, math.inf, 1024, alpha=0) == 1.0
    table = cm.what_if_table(n_gpus=8)
    assert {r["model"]: r["efficiency"] for r in table if r["link"] == "10 GbE"}["1B-param"] < 0.5


def test_nvlink_vs_ethernet_arithmetic_and_lecture_slider_order():
    per_rank = 2 * 7 / 8 * 25e6 * 4
    nvlink, ethernet = cm.LINKS["NVLink4 (H100)"][1], cm.LINKS["10 GbE"][1]
    assert round(per_rank / (ethernet * 1e9) / (per_rank / (nvlink * 1e9))) == 360
    params = int(25.6e6)
    effs = {link: cm.scaling_efficiency(params, 4, 0.1, gbps, 8, alpha=a) for link, (a, gbps) in cm.LINKS.items()}
    assert effs["NVLink4 (H100)"] > effs["InfiniBand NDR"] > effs["10 GbE"]
