"""The measured pipeline timeline: phases named per micro-batch, in the schedule's order, and a Chrome file."""
import json

import pytest

from course_lib import trace
from course_lib.distributed import pipeline_trace, schedules
from course_lib.distributed.launch import launch


def schedule_timeline(name: str, K: int, M: int, steps: int = 2) -> trace.Timeline:
    """The predicted schedule as a Timeline: every op lasts 1 ms, steps one after the other."""
    ops = schedules.timed(schedules.order(name, K, M))
    span = schedules.makespan(ops)
    spans = [trace.Span(f"{'forward' if op.kind == 'F' else 'backward'} mb{op.micro}", f"rank {op.stage} · main",
                        1e3 * (op.time + i * span), 1e3, "forward" if op.kind == "F" else "backward")
             for i in range(steps) for op in ops]
    return trace.Timeline(spans)


@pytest.mark.parametrize("name", schedules.SCHEDULES)
@pytest.mark.parametrize("K,M", [(2, 1), (2, 4), (4, 6)])
def test_idle_share_of_the_ideal_schedule_is_the_bubble(name, K, M):
    timeline = schedule_timeline(name, K, M)
    assert pipeline_trace.idle_share(timeline, K, M) == pytest.approx(schedules.bubble_fraction(K, M))
    for k in range(K):
        assert pipeline_trace.phase_order(timeline, f"rank {k} · main") == schedules.order(name, K, M)[k] * 2


def test_idle_share_refuses_a_timeline_that_does_not_match():
    timeline = schedule_timeline("gpipe", 2, 4)
    with pytest.raises(ValueError, match="K=3 but the timeline has forward/backward spans on 2 rows"):
        pipeline_trace.idle_share(timeline, 3, 4)
    with pytest.raises(ValueError, match="2M=6 ops per step"):
        pipeline_trace.idle_share(timeline, 2, 3)
    with pytest.raises(ValueError, match="M must"):
        pipeline_trace.idle_share(timeline, 2, 0)


def test_traced_steps_refuses_a_batch_that_does_not_split():
    with pytest.raises(ValueError, match="batch=10 must be divisible by micro_batches=4"):
        pipeline_trace.traced_steps(0, 2, "gpipe", 4, batch=10)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_measured_timeline_runs_the_schedule_and_saves_a_chrome_trace(tmp_path):
    name, K, M, steps = "1f1b", 2, 4, 2          # 1F1B: forwards and backwards interleave, a stricter order
    timeline = trace.merge(launch(pipeline_trace.traced_steps, K, name, M, steps, 32, 64, timeout=150))
    assert timeline.rows == ["rank 0 · main", "rank 1 · main"]
    for k, row in enumerate(timeline.rows):
        ops = pipeline_trace.phase_order(timeline, row)
        assert ops == schedules.order(name, K, M)[k] * steps                       # every op, in order
        assert [m for kind, m in ops if kind == "F"] == list(range(M)) * steps      # forwards mb0, mb1, ...
    assert {"comm", "forward", "backward", "optimizer"} <= {s.kind for s in timeline.spans}
    assert "recv wait" in timeline.names() and not any(n.startswith("gloo:") for n in timeline.names())
    assert 0 <= pipeline_trace.idle_share(timeline, K, M) < 1
    data = json.loads(timeline.save_chrome(tmp_path / "pipeline.json").read_text())
    events = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(events) == len(timeline.spans) and data["otherData"]["label"].startswith(name)
    for rank in range(K):
        pid = next(e["pid"] for e in data["traceEvents"] if e["ph"] == "M" and e["args"]["name"] == f"rank {rank}")
        forwards = sorted((e for e in events if e["pid"] == pid and e["name"].startswith("forward")),
                          key=lambda e: e["ts"])
        assert [e["name"] for e in forwards] == [f"forward mb{m}" for m in range(M)] * steps


def test_label_micro_batches_writes_one_number_per_wide_op():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = schedule_timeline("1f1b", 2, 3, steps=1)
    ax = timeline.draw()
    pipeline_trace.label_micro_batches(ax, timeline)
    assert sorted(t.get_text() for t in ax.texts) == sorted([str(m) for m in range(3)] * 4)
    plt.close("all")
