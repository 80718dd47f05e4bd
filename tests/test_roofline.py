import matplotlib
import pytest
import torch

from course_lib import roofline
from course_lib.flops import training_flops_per_image
from course_lib.models import Net
from course_lib.roofline import KernelPoint, attainable, course_kernels, layer_bound, measure_kernel, plot_roofline

matplotlib.use("Agg")


def test_attainable_is_the_lower_roof():
    assert attainable(1.0, peak_flops=100.0, bandwidth=10.0) == 10.0        # memory-bound
    assert attainable(50.0, peak_flops=100.0, bandwidth=10.0) == 100.0      # compute-bound
    grid = torch.tensor([1.0, 10.0, 100.0])
    assert torch.equal(attainable(grid, 100.0, 10.0), torch.tensor([10.0, 100.0, 100.0]))
    with pytest.raises(ValueError, match="peak_flops and bandwidth"):
        attainable(1.0, 0.0, 10.0)


def test_kernel_point_intensity_and_rate():
    p = KernelPoint("k", flops=200.0, bytes=100.0, seconds=0.5)
    assert p.intensity == 2.0 and p.flops_per_second == 400.0


def test_measure_kernel_pairs_time_with_bytes_of_the_tensors(monkeypatch):
    monkeypatch.setattr(roofline, "time_fn", lambda fn, device, repeats, warmup: 0.125)
    a = torch.zeros(10)                          # 40 bytes
    b = torch.zeros(5, dtype=torch.float64)      # 40 bytes
    p = measure_kernel("k", lambda: None, flops=80, tensors=(a, b))
    assert (p.bytes, p.seconds, p.intensity) == (80.0, 0.125, 1.0)
    with pytest.raises(ValueError, match="flops"):
        measure_kernel("k", lambda: None, flops=0, tensors=(a,))


def test_course_kernels_have_their_formula_intensities():
    n, batch, numel = 64, 4, 1024
    points = {p.name.split(",")[0].split(" ")[0]: p
              for p in course_kernels(matmul_n=n, batch=batch, add_numel=numel, repeats=1)}
    assert points["matmul"].flops == 2 * n**3 and points["matmul"].bytes == 3 * n * n * 4
    assert points["Net.conv1"].flops == batch * 2 * 10 * 24 * 24 * 25             # Net's conv1, per image x batch
    conv1_bytes = 4 * (batch * 28 * 28 + 10 * 25 + 10 + batch * 10 * 24 * 24)     # input, weight, bias, output
    assert points["Net.conv1"].bytes == conv1_bytes
    assert points["Net.conv2"].flops == batch * 2 * 20 * 8 * 8 * 250
    assert points["add"].intensity == pytest.approx(1 / 12)                          # 1 FLOP per 3 floats moved
    assert all(p.seconds > 0 for p in points.values())


@pytest.mark.parametrize("memory_format", ["channels_last", "contiguous"])
def test_layer_bound_times_every_flop_of_nets_training_step_once(memory_format, monkeypatch):
    batch = 8
    torch.manual_seed(1)
    before = torch.random.get_rng_state()
    points, bound = layer_bound(batch=batch, memory_format=memory_format, repeats=1)
    assert torch.equal(torch.random.get_rng_state(), before)        # the caller's random stream is untouched
    assert [p.name.split()[0] for p in points] == ["Net.conv1", "Net.conv2", "Net.fc1", "Net.fc2"]
    # the layers' forward + backward FLOPs are exactly the training step's (conv1: no input gradient)
    assert sum(p.flops for p in points) == training_flops_per_image(Net(), batch) * batch
    assert points[0].flops == 2 * batch * 2 * 10 * 24 * 24 * 25                      # conv1: forward + weight grad
    assert points[1].flops == 3 * batch * 2 * 20 * 8 * 8 * 250                       # conv2: + input grad
    assert bound == pytest.approx(sum(p.flops for p in points) / sum(p.seconds for p in points))
    # the bound is flops over the SUM of the times, not a mean of rates: checked with made-up times
    monkeypatch.setattr(roofline, "time_fn", lambda fn, device, repeats, warmup: 0.5)
    points, bound = layer_bound(batch=batch, memory_format=memory_format, repeats=1)
    assert bound == sum(p.flops for p in points) / 2.0
    with pytest.raises(ValueError, match="memory_format"):
        layer_bound(memory_format="nhwc")
    with pytest.raises(ValueError, match="batch"):
        layer_bound(batch=0)


def test_plot_roofline_draws_the_roof_and_every_point():
    points = [KernelPoint("a", 1e6, 1e6, 1e-3), KernelPoint("b", 1e9, 1e6, 1e-2)]
    ax = plot_roofline(points, peak_flops=1e11, bandwidth=1e10, other_peaks={"estimated": 2e11}, title="t")
    assert len(ax.lines) == 1 + 1 + 2 + 1 and ax.get_title() == "t"      # roof, extra peak, points, ridge
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"


def test_bad_arguments_are_refused_by_name():
    for kwargs, name in (({"matmul_n": 0}, "matmul_n"), ({"batch": 0}, "batch"), ({"add_numel": -1}, "add_numel")):
        with pytest.raises(ValueError, match=name):
            course_kernels(**kwargs)
