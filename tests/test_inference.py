"""course_lib.compression.inference: what is timed and how (never how fast), autograd modes, the frontier."""
import itertools
import random

import matplotlib
import pytest
import torch
from torch import nn

from course_lib.compression import inference as I
from course_lib.compression.measure import csr_model_bytes, example_batch, model_size_bytes, serialized_bytes
from course_lib.compression.pruning import magnitude_prune
from course_lib.models import LeNet300, Net

matplotlib.use("Agg")


class Recorder(nn.Module):
    """Counts calls per batch size and remembers the modes it ran under."""

    def __init__(self, dropout: bool = False):
        super().__init__()
        self.lin = nn.Linear(784, 10)
        self.drop = nn.Dropout(0.5) if dropout else nn.Identity()
        self.calls, self.seen = {}, set()

    def forward(self, x):
        self.calls[len(x)] = self.calls.get(len(x), 0) + 1
        self.seen.add((self.training, torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
        return self.lin(self.drop(x.flatten(1)))


def test_throughput_times_each_batch_size_with_repeats_scaled_to_the_batch():
    a, b = Recorder(), Recorder()
    table = I.throughput({"a": a, "b": b}, [1, 8, 64], images_per_point=64, min_repeats=2, max_repeats=10, warmup=1)
    assert list(table) == ["a", "b"] and list(table["a"]) == [1, 8, 64]
    assert all(rate > 0 for rates in table.values() for rate in rates.values())
    # 64 // b calls, clamped to [2, 10], plus one warm-up call each
    assert a.calls == b.calls == {1: 10 + 1, 8: 8 + 1, 64: 2 + 1}
    assert a.seen == {(False, False, True)}          # eval, inference_mode


def test_throughput_refuses_bad_batch_sizes_and_repeats():
    m = {"m": Recorder()}
    for bad in ([0, 1], [], [1.5], 4, [True]):
        with pytest.raises(ValueError, match="batch_sizes must be a non-empty list of positive ints"):
            I.throughput(m, bad)
    with pytest.raises(ValueError, match="images_per_point"):
        I.throughput(m, [1], images_per_point=0)
    with pytest.raises(ValueError, match="min_repeats .* <= max_repeats"):
        I.throughput(m, [1], min_repeats=5, max_repeats=2)


def test_plot_throughput_draws_one_line_per_model():
    ax = I.plot_throughput({"a": {1: 10.0, 2: 30.0}, "b": {1: 5.0, 2: 6.0}})
    assert len(ax.get_lines()) == 2 and ax.get_xscale() == "log"


@pytest.mark.parametrize("mode, expected", [
    ("train", (True, True, False)), ("eval", (False, True, False)),
    ("no_grad", (False, False, False)), ("inference_mode", (False, False, True)),
])
def test_autograd_mode_overrides_the_timer_context(mode, expected):
    rec = Recorder()
    runner = I.AutogradMode(rec, mode).eval()
    x = torch.zeros(2, 784)                          # made outside: an inference tensor cannot enter autograd
    with torch.inference_mode():                     # what measure's timer sets
        out = runner(x)
    assert rec.seen == {expected}
    assert out.requires_grad == (mode in ("train", "eval"))
    assert out.is_inference() == (mode == "inference_mode")


def test_compare_modes_times_every_mode_and_restores_the_model():
    rec = Recorder(dropout=True).train()
    seconds = I.compare_modes(rec, batch_size=8, repeats=3, warmup=1)
    assert list(seconds) == list(I.MODES) and all(s > 0 for s in seconds.values())
    assert rec.training                               # restored
    assert rec.calls == {8: 3 * 4}                    # the shared model runs the three eval modes
    assert rec.seen == {(False, True, False), (False, False, False), (False, False, True)}
    with pytest.raises(ValueError, match="mode must be one of"):
        I.compare_modes(rec, modes=["fast"])


def test_saved_tensor_bytes_counts_activations_only_under_grad():
    model = nn.Sequential(nn.Linear(784, 300), nn.ReLU(), nn.Linear(300, 10)).train()
    x = torch.randn(32, 784)
    saved = {mode: I.saved_tensor_bytes(model, x, mode) for mode in I.MODES}
    assert saved["no_grad"] == saved["inference_mode"] == 0
    # Linear saves its input; ReLU saves its output (which is the next Linear's input: one storage).
    assert saved["train"] == saved["eval"] == (32 * 784 + 32 * 300) * 4
    assert model.training


def test_saved_tensor_bytes_sees_dropout_masks_in_train_mode_only():
    model = Net()
    x = example_batch(16)
    assert I.saved_tensor_bytes(model, x, "train") > I.saved_tensor_bytes(model, x, "eval") > 0


def test_variant_sizes_follow_the_storage_rule():
    dense = LeNet300()
    pruned = LeNet300()
    magnitude_prune(pruned, 0.9, scope="global")
    assert I.variant("d", "dense", dense, 0.9).size_bytes == model_size_bytes(dense)
    assert I.variant("p", "pruned", pruned, 0.9, storage="csr").size_bytes == csr_model_bytes(pruned)
    assert I.variant("f", "file", dense, 0.9, storage="file").size_bytes == serialized_bytes(dense)
    v = I.variant("d", "dense", dense, 0.5)
    assert v.size_kb == v.size_bytes / 1e3 and v.storage == "fp32"
    with pytest.raises(ValueError, match="storage must be one of"):
        I.variant("x", "x", dense, 0.5, storage="zip")
    with pytest.raises(ValueError, match="accuracy must be a fraction"):
        I.variant("x", "x", dense, 95.0)


def test_shared_weight_bytes_counts_indices_codebooks_and_biases():
    from course_lib.compression.kmeans import share_weights

    shared = share_weights(LeNet300(), bits=4)
    weights = 784 * 300 + 300 * 100 + 100 * 10
    biases = (300 + 100 + 10) * 4
    assert I.shared_weight_bytes(shared) == weights * 4 // 8 + 3 * 16 * 4 + biases


def dominated(p, q):
    """q beats p."""
    return q[0] <= p[0] and q[1] >= p[1] and q != p


@pytest.mark.parametrize("seed", range(20))
def test_pareto_front_properties(seed):
    rng = random.Random(seed)
    pts = [(rng.choice([1, 2, 3, 5, 8, 13]), rng.choice([0.9, 0.95, 0.97, 0.99])) for _ in range(rng.randint(1, 12))]
    front = I.pareto_front(pts)
    assert front == sorted(front, key=lambda i: pts[i][0])
    for i in front:
        assert not any(dominated(pts[i], q) for q in pts)
    for i in set(range(len(pts))) - set(front):
        assert any(dominated(pts[i], q) for q in pts) or pts.index(pts[i]) in front   # beaten, or a duplicate
    assert len({pts[i] for i in front}) == len(front)


def test_pareto_front_examples_and_bad_input():
    assert I.pareto_front([]) == []
    assert I.pareto_front([(10, 0.9), (5, 0.95), (20, 0.99), (5, 0.9), (30, 0.99)]) == [1, 2]
    assert I.pareto_front([(1, 0.5), (1, 0.5)]) == [0]
    for bad in ([(1, 2, 3)], [(1, float("nan"))], [("a", 0.5)]):
        with pytest.raises(ValueError, match="points must be"):
            I.pareto_front(bad)


def test_plot_frontier_draws_every_variant_and_the_front():
    vs = [I.Variant(f"v{i}", fam, size, acc, "fp32")
          for i, (fam, size, acc) in enumerate(itertools.product(["a", "b"], [1000, 50000], [0.9, 0.97]))]
    ax = I.plot_frontier(vs)
    points = sum(len(c.get_offsets()) for c in ax.collections)
    assert points == len(vs)
    assert {t.get_text() for t in ax.texts} == {v.name for v in vs}
    assert ax.get_xscale() == "log"
    (front,) = [line for line in ax.get_lines() if line.get_label() == "Pareto front"]
    assert list(front.get_xdata()) == [1.0]            # (1 KB, 97%) beats every other point
    with pytest.raises(ValueError, match="variants must be a non-empty list"):
        I.plot_frontier([])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_throughput_and_modes_on_the_gpu():
    model = LeNet300().cuda()
    table = I.throughput({"m": model}, [1, 64], images_per_point=64, warmup=1)
    assert all(rate > 0 for rate in table["m"].values())
    assert set(I.compare_modes(model, batch_size=8, repeats=2, warmup=1)) == set(I.MODES)
    assert I.saved_tensor_bytes(model, torch.randn(4, 784, device="cuda"), "eval") == (4 * 784 + 4 * 300 + 4 * 100) * 4
