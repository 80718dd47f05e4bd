import time

import pytest
import torch

from course_lib import gpu
from course_lib.env import DeviceUnavailableError

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")


def test_time_fn_measures_the_call_and_skips_warmup(monkeypatch):
    """On a clock that only the work advances (a busy machine cannot move it): the median timed call."""
    clock, calls = [0.0], []
    monkeypatch.setattr(gpu.time, "perf_counter", lambda: clock[0])

    def work():
        calls.append(1)
        clock[0] += [0.2, 0.2, 0.01, 0.03, 0.02][len(calls) - 1]   # the two warm-up calls are slow

    seconds = gpu.time_fn(work, "cpu", repeats=3, warmup=2)
    assert len(calls) == 5
    assert seconds == pytest.approx(0.02)


@pytest.mark.parametrize("kwargs, error", [
    ({"fn": 3}, TypeError),
    ({"device": 0}, TypeError),
    ({"repeats": 0}, ValueError),
    ({"repeats": 2.0}, ValueError),
    ({"warmup": -1}, ValueError),
])
def test_time_fn_rejects_bad_input(kwargs, error):
    args = {"fn": lambda: None, "device": "cpu", **kwargs}
    with pytest.raises(error, match=next(iter(kwargs))):
        gpu.time_fn(**args)


def test_synchronize_is_a_no_op_on_cpu():
    gpu.synchronize("cpu")
    gpu.synchronize(torch.device("cpu"))
    with pytest.raises(TypeError, match="device"):
        gpu.synchronize(None)


def test_host_buffer_size_and_bad_input():
    buf = gpu.host_buffer(1000, pinned=False)
    assert buf.dtype == torch.uint8 and buf.numel() == 1000 and not buf.is_pinned()
    for bad in (0, -5, 1.5, True):
        with pytest.raises(ValueError, match="nbytes"):
            gpu.host_buffer(bad, pinned=False)


@no_cuda
def test_pinned_memory_needs_cuda():
    with pytest.raises(DeviceUnavailableError, match="pinned"):
        gpu.host_buffer(1000, pinned=True)
    with pytest.raises(DeviceUnavailableError, match="cuda"):
        gpu.measure_copy_bandwidth(1000, pinned=False, device="cuda")
    with pytest.raises(DeviceUnavailableError, match="cuda"):
        gpu.overlap_copy_with_host_work(1000, "cuda", lambda: None)


def test_cpu_copy_bandwidth_is_a_positive_host_memcpy_rate():
    gbs = gpu.measure_copy_bandwidth(4 * 2**20, pinned=False, device="cpu", repeats=3)
    assert 0.05 < gbs < 1000  # GB/s: any real memory system lies in here


def test_copy_bandwidth_rejects_bad_input():
    with pytest.raises(TypeError, match="pinned"):
        gpu.measure_copy_bandwidth(1000, pinned=1, device="cpu")
    with pytest.raises(ValueError, match="device"):
        gpu.measure_copy_bandwidth(1000, pinned=False, device="meta")
    with pytest.raises(ValueError, match="nbytes"):
        gpu.measure_copy_bandwidth(0, pinned=False, device="cpu")
    with pytest.raises(DeviceUnavailableError, match="cpu"):
        gpu.overlap_copy_with_host_work(1000, "cpu", lambda: None)


@needs_cuda
def test_pinned_copy_to_gpu():
    pageable = gpu.measure_copy_bandwidth(64 * 2**20, pinned=False, device="cuda")
    pinned = gpu.measure_copy_bandwidth(64 * 2**20, pinned=True, device="cuda")
    assert pageable > 0 and pinned > 0
    assert gpu.host_buffer(10, pinned=True).is_pinned()


@needs_cuda
def test_non_blocking_copy_returns_before_the_copy_is_done():
    r = gpu.overlap_copy_with_host_work(256 * 2**20, "cuda", lambda: time.sleep(0.02))
    assert r["copy_s"] > 0
    assert r["call_returns_after_s"][True] < r["call_returns_after_s"][False]
    with pytest.raises(TypeError, match="host_work"):
        gpu.overlap_copy_with_host_work(1000, "cuda", None)
