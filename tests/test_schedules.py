"""GPipe and 1F1B schedules as data: dependencies, step count, bubble, activations in flight."""
import matplotlib

matplotlib.use("Agg")
import pytest

from course_lib.distributed import schedules
from course_lib.distributed.schedules import Op

SHAPES = [(K, M) for K in range(1, 6) for M in range(1, 9)]


@pytest.mark.parametrize("name", schedules.SCHEDULES)
@pytest.mark.parametrize("K,M", SHAPES)
def test_schedules_are_valid_and_take_2_m_plus_k_minus_1_steps(name, K, M):
    ops = schedules.timed(schedules.order(name, K, M))
    schedules.check_schedule(ops, K, M)
    assert schedules.makespan(ops) == 2 * (M + K - 1)
    assert schedules.schedule_bubble(ops, K) == pytest.approx(schedules.bubble_fraction(K, M))
    peaks = [schedules.peak_in_flight(o) for o in schedules.order(name, K, M)]
    assert peaks == schedules.predicted_peak_in_flight(name, K, M)


def test_gpipe_times_follow_the_formula():
    K, M = 4, 6
    for op in schedules.gpipe_schedule(K, M):
        want = op.stage + op.micro if op.kind == "F" else (M + K - 1) + (K - 1 - op.stage) + op.micro
        assert op.time == want, op


def test_1f1b_keeps_fewer_activations_than_gpipe():
    assert schedules.predicted_peak_in_flight("gpipe", 4, 8) == [8, 8, 8, 8]
    assert schedules.predicted_peak_in_flight("1f1b", 4, 8) == [4, 3, 2, 1]
    assert schedules.predicted_peak_in_flight("1f1b", 4, 2) == [2, 2, 2, 1]
    assert schedules.one_f_one_b_order(2, 3)[1] == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]


def test_bubble_fraction_values():
    assert schedules.bubble_fraction(1, 5) == 0
    assert schedules.bubble_fraction(4, 6) == pytest.approx(3 / 9)
    assert schedules.bubble_fraction(2, 1) == 0.5
    assert schedules.bubble_fraction(8, 100) < schedules.bubble_fraction(8, 10)


def test_check_schedule_rejects_broken_schedules():
    good = schedules.gpipe_schedule(2, 2)
    with pytest.raises(ValueError, match="two ops"):
        schedules.check_schedule(good + [Op(0, 0, "F", 0)], 2, 2)
    with pytest.raises(ValueError, match="missing"):
        schedules.check_schedule(good[:-1], 2, 2)
    early = [op._replace(time=op.micro) if op.kind == "F" else op for op in good]      # stage 1 does not wait
    with pytest.raises(ValueError, match="before its input"):
        schedules.check_schedule(early, 2, 2)
    wrong_way = [op._replace(time=10 + op.stage) if op.kind == "B" and op.micro == 0 else op for op in good]
    with pytest.raises(ValueError, match="gradient"):
        schedules.check_schedule(wrong_way, 2, 2)


def test_orders_that_deadlock_are_refused():
    with pytest.raises(ValueError, match="deadlock"):
        schedules.timed([[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]])


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="K must"):
        schedules.bubble_fraction(0, 4)
    with pytest.raises(ValueError, match="M must"):
        schedules.gpipe_order(2, 0)
    with pytest.raises(ValueError, match="schedule must be one of"):
        schedules.order("interleaved", 2, 2)


def test_plots_draw_one_box_per_op():
    import matplotlib.pyplot as plt

    ops = schedules.one_f_one_b_schedule(3, 4)
    ax = schedules.plot_schedule(ops, title="1F1B")
    assert len(ax.patches) == len(ops) and "bubble 33%" in ax.get_title()
    events = [[("F", 0, 0.0, 0.01), ("B", 0, 0.03, 0.05)], [("F", 0, 0.01, 0.02), ("B", 0, 0.02, 0.03)]]
    assert len(schedules.plot_timeline(events).patches) == 4
    plt.close("all")
