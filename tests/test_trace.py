"""course_lib.trace: the timeline a lecture draws is the profiler's, and the Chrome file opens in Perfetto."""
import json

import matplotlib
import pytest
import torch
import torch.nn.functional as F
from torch.profiler import record_function

from course_lib import trace
from course_lib.models import Net

matplotlib.use("Agg")


def labelled_step():
    model, opt = Net(), None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))

    def step():
        with record_function("forward"):
            loss = F.cross_entropy(model(x), y)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad()
    return step


def test_record_keeps_the_labelled_phases_in_order_one_per_step():
    timeline = trace.record(labelled_step(), steps=3, warmup=1, label="Net, batch 8, random data")
    main = [s for s in timeline.spans if s.row == "main" and s.depth == 0]
    assert [s.name for s in main] == ["forward", "backward", "optimizer"] * 3
    assert all(a.start_us + a.dur_us <= b.start_us + 1e-3 for a, b in zip(main, main[1:]))   # no overlap in a thread
    assert {s.kind for s in main} == {"forward", "backward", "optimizer"}
    assert timeline.total_ms("forward") > 0 and timeline.rows[0] == "main"


def test_chrome_trace_parses_and_names_every_span(tmp_path):
    timeline = trace.record(labelled_step(), steps=2, label="Net")
    path = timeline.save_chrome(tmp_path / "sub" / "step.json")
    data = json.loads(path.read_text())
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(timeline.spans) and {e["name"] for e in spans} >= {"forward", "backward", "optimizer"}
    assert all(e["dur"] >= 0 and isinstance(e["ts"], float | int) for e in spans)
    assert data["otherData"]["label"] == "Net" and not list(path.parent.glob(".*.tmp"))


def test_merge_puts_ranks_on_one_clock_and_overlap_is_interval_arithmetic():
    a = trace.Timeline([trace.Span("backward", "main", 0, 100, "backward"),
                        trace.Span("gloo:all_reduce", "thread 2", 50, 100, "comm")], start_ns=1_000_000)
    b = trace.Timeline([trace.Span("backward", "main", 0, 100, "backward")], start_ns=1_020_000)   # 20 us later
    merged = trace.merge([a, b])
    assert merged.rows == ["rank 0 · main", "rank 0 · thread 2", "rank 1 · main"]
    assert [s.start_us for s in merged.spans if s.row == "rank 1 · main"] == [20.0]
    # backward covers [0, 120] (two ranks), comm [50, 150]: 70 us of overlap
    assert merged.overlap_ms("comm", "backward") == pytest.approx(0.070)
    ax = merged.draw()
    assert [t.get_text() for t in ax.get_yticklabels()] == merged.rows
    with pytest.raises(ValueError, match="at least one"):
        trace.merge([])


@pytest.mark.parametrize("name, kind", [("gloo:all_reduce", "comm"), ("nccl:all_reduce", "comm"),
                                        ("c10d::allreduce_", "comm"), ("forward", "forward"),
                                        ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "data"),
                                        ("copy to device", "copy"), ("FSDP::all_gather_copy_out (0)", "copy"), ("Memcpy HtoD (Pageable -> Device)", "copy"),
                                        ("aten::mm", "other")])
def test_kind_of(name, kind):
    assert trace.kind_of(name) == kind


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="steps"):
        trace.record(lambda: None, steps=0)
    with pytest.raises(ValueError, match="warmup"):
        trace.record(lambda: None, warmup=-1)
