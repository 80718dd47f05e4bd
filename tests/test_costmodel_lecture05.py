"""The cost-model facts lecture 05 states, checked here in full (the lecture keeps one assert per fact)."""
import math
from dataclasses import replace

import pytest

from course_lib.distributed import costmodel as cm
from course_lib.distributed import network as N

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


def test_resnet50_what_if_cards_matter_ethernet_does_not_scale_overlap_helps():
    """The sweep and the asserts of lecture 05's what-if section."""
    params, compute = N.EXAMPLE_MODELS["ResNet-50"]
    dgx = N.FABRICS["DGX H100"]
    ethernet = replace(dgx, name="one 10 GbE card", inter=N.LINKS["10 GbE"], nics_per_node=1)
    eff = lambda fabric, g, algorithm="auto", overlap=0.0: N.scaling_efficiency(params, 4, compute, g, fabric,
                                                                                 algorithm, overlap)
    assert eff(dgx, 8) > eff(dgx, 64) > 0.9 > 0.5 > eff(ethernet, 64)
    assert eff(ethernet, 64, overlap=0.8) > eff(ethernet, 64)
    assert eff(dgx, 64, N.ONE_CARD) < eff(dgx, 64)             # the mistake underrates the cluster
    assert N.scaling_efficiency(10**9, 4, 1.0, 1024, replace(dgx, intra=N.Link(0, math.inf),
                                                              inter=N.Link(0, math.inf))) == 1.0


def test_nvlink_vs_ethernet_arithmetic_and_lecture_slider_order():
    per_rank = 2 * 7 / 8 * 25e6 * 4
    nvlink, ethernet = N.LINKS["NVLink4 (H100)"].GBps, N.LINKS["10 GbE"].GBps
    assert round(per_rank / (ethernet * 1e9) / (per_rank / (nvlink * 1e9))) == 360
    params = int(25.6e6)
    base = N.FABRICS["DGX H100"]
    effs = {(link, cards): N.scaling_efficiency(params, 4, 0.1, 16, replace(base, inter=N.LINKS[link],
                                                                         nics_per_node=cards))
            for link in ("InfiniBand NDR", "10 GbE") for cards in (1, 8)}
    assert effs[("InfiniBand NDR", 8)] > effs[("InfiniBand NDR", 1)] > effs[("10 GbE", 8)] > effs[("10 GbE", 1)]


def test_across_nodes_section_hand_check():
    """Lecture 05's check on two DGX H100 nodes: the rings' bandwidth term is the one-card mistake's / 8 cards."""
    dgx = N.FABRICS["DGX H100"]
    ring, mistake = (N.allreduce_terms(100e6, 16, dgx, a)[1] for a in ("ring", N.ONE_CARD))
    assert ring == pytest.approx(2 * 15 / 16 * 100e6 / min(450e9, 8 * 50e9)) and mistake / ring == pytest.approx(8)
