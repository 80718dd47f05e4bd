"""Interleaved 1F1B and zero-bubble schedules: valid orders, their bubble on the virtual clock against the closed
forms, memory and messages, and the same orders as torch.distributed.pipelining's own schedules.

Time convention of the hand cases (`pipeline_clock.unit_times`): balanced stages; a whole stage's forward F, input
gradient I and weight gradient W each take 1, so a full backward B = I + W takes 2; a rank holding v chunks takes
1/v of that per chunk; messages are free unless a test says otherwise.
"""
import matplotlib

matplotlib.use("Agg")
import pytest

from course_lib.distributed import pipeline_torch, schedules
from course_lib.distributed import schedules_zb as zb
from course_lib.distributed.schedules_zb import Action
from course_lib.simulate import pipeline_clock as clock

SHAPES = [(K, M) for K in (1, 2, 3, 4, 5) for M in (1, 2, 3, 4, 5, 6, 8, 10, 12)]
VALID = [(name, K, M) for name in zb.SCHEDULES for K, M in SHAPES if name != "interleaved" or M % K == 0]


def replay(name, K, M, **times):
    return clock.replay_actions(zb.order(name, K, M), clock.unit_times(zb.chunks_per_rank(name), **times))


@pytest.mark.parametrize("name,K,M", VALID)
def test_every_order_is_valid_and_replays_without_breaking_a_dependency(name, K, M):
    orders = zb.order(name, K, M)
    zb.check_order(orders, M)              # each op once; F before B (or I before W) on its rank
    r = replay(name, K, M)
    clock.check_replay(r)                  # stage order in time: F(s) after F(s-1), I(s) after I(s+1); no overlap
    v = zb.chunks_per_rank(name)
    assert len(r.runs) == sum(map(len, orders)) == K * v * M * (3 if name.startswith("zb") else 2)
    assert r.busy() == pytest.approx([3.0 * M] * K)    # the same work per rank whatever the schedule


def test_hand_case_p4_m8_each_bubble_equals_its_closed_form():
    K, M = 4, 8
    steps = {"gpipe": 3 * (M + K - 1), "1f1b": 3 * (M + K - 1),        # (M+K-1) slots of F+B = 3
             "interleaved": 3 * M + 3 * (K - 1) / 2,                      # the fill and drain in half-size chunks
             "zb-h1": 3 * M + (K - 1) * (1 + 1 - 1),                      # (K-1)(t_F + t_I - t_W)
             "zb-v": 3 * M + (K - 1) * 0.5}                               # K-1 chunk forwards before rank K-1 starts
    for name, step in steps.items():
        r = replay(name, K, M)
        assert r.step == pytest.approx(step), name
        assert r.bubble_over_ideal == pytest.approx(zb.bubble_over_ideal(name, K, M)), name
        assert r.bubble == pytest.approx(zb.bubble_share(name, K, M)), name
    assert zb.bubble_over_ideal("gpipe", K, M) == (K - 1) / M and zb.bubble_over_ideal("interleaved", K, M) == 3 / 16
    assert zb.bubble_over_ideal("zb-h1", K, M) == 3 / 24 and zb.bubble_over_ideal("zb-v", K, M) == 3 / 48
    assert zb.bubble_share("1f1b", K, M) == pytest.approx(schedules.bubble_fraction(K, M))


@pytest.mark.parametrize("name", zb.SCHEDULES)
@pytest.mark.parametrize("K,M", [(2, 4), (3, 6), (4, 8), (4, 12), (5, 10), (1, 3)])
def test_replayed_bubble_follows_the_closed_form(name, K, M):
    assert replay(name, K, M).bubble_over_ideal == pytest.approx(zb.bubble_over_ideal(name, K, M), abs=1e-12)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved"])
def test_the_full_backward_schedules_do_not_depend_on_op_times(name):
    for t_i, t_w in ((0.5, 0.5), (1.5, 1.5), (0.25, 2.0)):     # B = F, B = 3F, B = 2.25F
        assert replay(name, 4, 8, t_i=t_i, t_w=t_w).bubble_over_ideal == pytest.approx(zb.bubble_over_ideal(name, 4, 8))


def test_zero_bubble_needs_w_to_fill_and_zbv_enough_micro_batches():
    # with a cheap W there is less to fill with: ZB-H1's bubble is (K-1)(t_F + t_I - t_W), more than a third of 1F1B's
    r = replay("zb-h1", 4, 8, t_i=1.5, t_w=0.5)
    assert r.step - 24 == pytest.approx(3 * (1 + 1.5 - 0.5))
    assert replay("zb-v", 4, 4).bubble_over_ideal > 3 / 24                 # M < 2K-1: more than the closed form
    with pytest.raises(ValueError, match="M must be >= 2K-1"):
        zb.bubble_over_ideal("zb-v", 4, 4)


def test_memory_in_flight_and_messages_per_step():
    K, M = 4, 8
    peaks = {n: [zb.peak_in_flight(o, zb.chunks_per_rank(n)) for o in zb.order(n, K, M)] for n in zb.SCHEDULES}
    assert peaks["gpipe"] == [M] * K and peaks["1f1b"] == [K - r for r in range(K)]
    assert peaks["zb-h1"] == [K] * K and peaks["zb-v"] == [K] * K        # 1F1B's peak (rank 0's), on every rank
    assert peaks["interleaved"] == [(2 * (K - 1 - r) + K + 1) / 2 for r in range(K)]    # warm-up + 1 chunks of 1/2
    msgs = {n: zb.messages(zb.order(n, K, M)) for n in zb.SCHEDULES}
    assert msgs["gpipe"] == msgs["1f1b"] == msgs["zb-h1"] == 2 * M * (K - 1)
    assert msgs["interleaved"] == 2 * M * (2 * K - 1) and msgs["zb-v"] == 2 * M * (2 * K - 2)   # the V turns locally
    assert len(replay("interleaved", K, M).sends) == msgs["interleaved"]


def test_a_message_cost_lands_on_the_critical_path():
    cost = 0.25
    free = replay("gpipe", 2, 1)
    paid = clock.replay_actions(zb.order("gpipe", 2, 1), clock.unit_times(), lambda a: cost)
    assert paid.step == pytest.approx(free.step + 2 * cost)          # F0, send, F1, B1, send back, B0
    assert [(s.rank, s.dest) for s in paid.sends] == [(0, 1), (1, 0)]
    zbv = clock.replay_actions(zb.order("zb-v", 1, 1), clock.unit_times(2), lambda a: 5.0)
    assert zbv.sends == [] and zbv.step == pytest.approx(3.0)        # both chunks on one rank: the V's turn is free


def test_the_1f1b_family_written_as_actions_is_schedules_order():
    assert zb.order("1f1b", 3, 4)[1] == [Action(k, 1, m) for k, m in schedules.one_f_one_b_order(3, 4)[1]]
    assert zb.zb_h1_order(2, 3)[1] == [Action("F", 1, 0), Action("I", 1, 0), Action("F", 1, 1), Action("I", 1, 1),
                                      Action("W", 1, 0), Action("F", 1, 2), Action("I", 1, 2), Action("W", 1, 1),
                                      Action("W", 1, 2)]
    assert zb.stage_ranks("interleaved", 3, 2) == [0, 1, 2, 0, 1, 2] and zb.stage_ranks("zb-v", 3) == [0, 1, 2, 2, 1, 0]


def test_merge_backward_joins_an_i_directly_followed_by_its_w():
    seq = [Action("F", 0, 0), Action("I", 0, 0), Action("W", 0, 0), Action("I", 0, 1), Action("F", 0, 2),
           Action("W", 0, 1)]
    assert zb.merge_backward(seq) == [Action("F", 0, 0), Action("B", 0, 0), Action("I", 0, 1), Action("F", 0, 2),
                                      Action("W", 0, 1)]


def test_checks_reject_broken_orders_and_replays():
    good = zb.order("zb-h1", 2, 2)
    with pytest.raises(ValueError, match="runs twice"):
        zb.check_order([good[0] + [good[0][0]], good[1]], 2)
    with pytest.raises(ValueError, match="needs F and then B, or F, I and W"):
        zb.check_order([[a for a in good[0] if a != Action("W", 0, 1)], good[1]], 2)
    with pytest.raises(ValueError, match="out of order"):
        zb.check_order([good[0], [Action("W", 1, 0) if a == Action("I", 1, 0) else Action("I", 1, 0)
                                  if a == Action("W", 1, 0) else a for a in good[1]]], 2)
    with pytest.raises(ValueError, match="runs on ranks 0 and 1"):
        zb.check_order([good[0] + [Action("F", 1, 0)], good[1]], 2)
    with pytest.raises(ValueError, match="micro-batches must be 0..1"):
        zb.check_order(zb.order("zb-h1", 2, 3), 2)
    r = replay("1f1b", 2, 2)
    early = clock.Replay([x._replace(start=x.start - 1, end=x.end - 1) if x.rank == 1 and x.action.kind == "F"
                          and x.action.micro == 0 else x for x in r.runs], r.sends, r.ranks)
    with pytest.raises(ValueError, match="before its input"):
        clock.check_replay(early)
    one = replay("gpipe", 1, 2)                              # F0 at [0, 1), F1 at [1, 2), ...
    squeezed = clock.Replay([x._replace(start=0.5) if x.action == Action("F", 0, 1) else x for x in one.runs], [], 1)
    with pytest.raises(ValueError, match="at once"):
        clock.check_replay(squeezed)
    with pytest.raises(ValueError, match="deadlock"):
        clock.replay_actions([[Action("B", 0, 0), Action("F", 0, 0)], [Action("F", 1, 0), Action("B", 1, 0)]],
                             clock.unit_times())


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="name must be one of"):
        zb.order("dualpipe", 2, 2)
    with pytest.raises(ValueError, match="M must be a multiple of K"):
        zb.interleaved_order(4, 6)
    with pytest.raises(ValueError, match="v must be an int >= 2"):
        zb.interleaved_order(2, 4, v=1)
    with pytest.raises(ValueError, match="K must"):
        zb.zbv_order(0, 4)
    with pytest.raises(ValueError, match="t_w must be"):
        clock.unit_times(1, t_w=0)
    with pytest.raises(ValueError, match="orders must be"):
        clock.replay_actions([[("F", 0)]], clock.unit_times())


def test_plot_replay_draws_one_box_per_action():
    import matplotlib.pyplot as plt

    r = replay("zb-v", 2, 4)
    ax = clock.plot_replay(r, "ZB-V")
    assert sum(len(c.get_paths()) for c in ax.collections) == len(ax.texts) == len(r.runs)
    assert f"bubble {r.bubble:.0%}" in ax.get_title() and "a rank's later chunk" in [t.get_text() for t in
                                                                                    ax.get_legend().get_texts()]
    plt.close("all")


TORCH_CASES = [(name, K, M) for name in pipeline_torch.TORCH_SCHEDULES for K in (1, 2, 3, 4)
               for M in (1, 2, 3, 4, 6, 8, 12) if name != "interleaved" or M % K == 0]


@pytest.mark.parametrize("name,K,M", TORCH_CASES)
def test_our_order_is_torchs_own_plan(name, K, M):
    try:
        theirs = pipeline_torch.torch_order(name, K, M)
    except ValueError as e:                     # torch's zero bubble wants M a multiple of M // K
        assert "multiple" in str(e) and name == "zb-h1"
        pytest.skip(f"torch refuses {name} with K={K}, M={M}: {e}")
    assert theirs == zb.order(name, K, M)


def test_torch_order_refuses_unknown_schedules():
    with pytest.raises(ValueError, match="name must be one of"):
        pipeline_torch.torch_order("gpipe", 2, 2)
