"""course_lib.profiling_demos: the traces lectures 01, 03 and 04 draw hold the phases they teach, and their
Chrome files parse (tiny random data, no MNIST; no timing is asserted)."""
import json

import matplotlib
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from course_lib import profiling_demos as pd
from course_lib import trace

matplotlib.use("Agg")


class PerSample(Dataset):
    """Like torchvision's MNIST: one Python call (and a transform) per sample."""

    def __init__(self, n=64):
        self.x, self.y = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,))

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return (self.x[i] - 0.1307) / 0.3081, int(self.y[i])


def chrome_names(timeline, path):
    data = json.loads(timeline.save_chrome(path).read_text())
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert spans and all(e["dur"] >= 0 for e in spans)
    return [e["name"] for e in spans]


def top_level(timeline, row=None):
    row = row or pd.main_row(timeline)
    return [s for s in timeline.spans if s.row == row and s.depth == 0]


@pytest.mark.parametrize("batch_size", [4, 16])
def test_lecture01_seed_step_names_each_phase_once_per_step(tmp_path, batch_size):
    timeline = pd.trace_seed_steps(PerSample(), batch_size, images=32, warmup=1, label=f"batch {batch_size}")
    phases = [s.name for s in top_level(timeline) if s.name in pd.PHASES]
    assert phases == list(pd.PHASES) * (32 // batch_size)
    names = chrome_names(timeline, tmp_path / f"01_batch{batch_size}.json")
    assert {"data", "forward", "backward", "optimizer"} <= set(names)
    per_image = pd.ms_per_image(timeline, 32)
    assert list(per_image) == list(pd.KIND_ORDER) and all(per_image[p] > 0 for p in pd.PHASES)
    assert per_image["copy"] == 0.0


@pytest.mark.filterwarnings("ignore:Implicit dimension choice")
def test_seed_step_trains_like_the_seed_loop():
    torch.manual_seed(0)
    step = pd.seed_step(PerSample(), batch_size=8, lr=0.05)
    losses = [step() for _ in range(40)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-8:]) < sum(losses[:8])       # the same 64 samples, seen 5 times: the loss falls


def test_trace_seed_steps_rejects_images_that_are_not_whole_batches():
    with pytest.raises(ValueError, match="images must be a multiple of batch_size=4"):
        pd.trace_seed_steps(PerSample(), 4, images=30)


@pytest.mark.parametrize("workers", [0, 1])
def test_lecture03_dataloader_fetches_are_data_spans(tmp_path, workers):
    loader = DataLoader(PerSample(160), batch_size=16, shuffle=True, num_workers=workers,
                        **({"prefetch_factor": 2} if workers else {}))
    timeline = pd.trace_loader_steps(loader, steps=5, warmup=1, label=f"workers={workers}")
    fetches = [s for s in top_level(timeline) if s.name.startswith("enumerate(DataLoader)")]
    assert len(fetches) == 5 and {s.kind for s in fetches} == {"data"}     # one fetch per step
    names = set(chrome_names(timeline, tmp_path / "03_loader.json"))
    assert {"copy to device", "forward", "backward", "optimizer"} <= names
    assert any(n.startswith("enumerate(DataLoader)#") for n in names)
    assert 0 < pd.share(timeline, "data") < 1


def test_side_by_side_starts_every_timeline_at_zero_in_the_given_order(tmp_path):
    a = trace.Timeline([trace.Span("forward", "main", 5, 10, "forward")], label="a", start_ns=10**9)
    b = trace.Timeline([trace.Span("data", "main", 0, 30, "data"),
                        trace.Span("pin_memory", "thread 9", 2, 3, "copy")], label="b", start_ns=5)
    both = pd.side_by_side({"workers=2": b, "workers=0": a})
    assert both.rows == ["workers=2 · main", "workers=2 · thread 9", "workers=0 · main"]
    assert [s.start_us for s in both.spans] == [0, 2, 5]
    assert pd.share(both, "data", row="workers=2 · main") == 1.0
    assert pd.share(both, "data", row="workers=0 · main") == 0.0
    with pytest.raises(ValueError, match="row must be one of"):
        pd.share(both, "data", row="nope")
    with pytest.raises(ValueError, match="at least one"):
        pd.side_by_side({})
    assert set(chrome_names(both, tmp_path / "both.json")) == {"forward", "data", "pin_memory"}


def test_lecture04_copy_phase_is_traced_on_this_device(tmp_path):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    timeline = pd.trace_copy_steps(x, y, device, batch_size=32, steps=3, warmup=1, label="copies")
    copies = [s for s in top_level(timeline) if s.name == "copy to device"]
    assert len(copies) == 3 and {s.kind for s in copies} == {"copy"}
    names = set(chrome_names(timeline, tmp_path / "04_copies.json"))
    assert {"copy to device", "forward", "backward", "optimizer"} <= names
    if device.type == "cuda":
        assert any("Memcpy HtoD" in n for n in names)
        pinned = pd.trace_copy_steps(x, y, device, pinned=True, batch_size=32, steps=3, warmup=1)
        assert any("Memcpy HtoD" in n for n in pinned.names())


def test_trace_copy_steps_rejects_pinned_without_cuda_and_short_data():
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="pinned=True needs a CUDA device"):
            pd.trace_copy_steps(x, y, "cpu", pinned=True, batch_size=4)
    with pytest.raises(ValueError, match="at least batch_size=16"):
        pd.trace_copy_steps(x, y, "cpu", batch_size=16)


def test_draw_ms_per_image_stacks_only_the_kinds_present():
    per_image = {"batch 4": dict.fromkeys(pd.KIND_ORDER, 0.0) | {"forward": 1.0, "data": 0.5},
                 "batch 64": dict.fromkeys(pd.KIND_ORDER, 0.0) | {"forward": 0.2, "data": 0.5}}
    ax = pd.draw_ms_per_image(per_image)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["data", "forward"]
    widths = sorted(round(p.get_width(), 6) for p in ax.patches)
    assert widths == [0.2, 0.5, 0.5, 1.0]


def test_forever_restarts_the_loader_and_refuses_an_empty_one():
    batches = pd.forever(DataLoader(TensorDataset(torch.arange(3)), batch_size=2))
    assert [len(next(batches)[0]) for _ in range(4)] == [2, 1, 2, 1]
    with pytest.raises(ValueError, match="yields no batch"):
        next(pd.forever([]))
