import pytest
import torch

from course_lib import hardware
from course_lib.env import DeviceUnavailableError
from course_lib.hardware import (PeakEstimate, estimate_peak_gflops, flops_per_cycle, gpu_peak_from_name,
                                 loop_vs_vectorised, measure_matmul_gflops)


def test_measure_matmul_gflops_counts_2n3_flops(monkeypatch):
    monkeypatch.setattr(hardware, "time_fn", lambda fn, device, repeats, warmup: 0.5)
    assert measure_matmul_gflops(n=100, repeats=1) == pytest.approx(2 * 100**3 / 0.5 / 1e9)


def test_measure_matmul_gflops_runs_small():
    assert measure_matmul_gflops(n=64, repeats=2) > 0
    assert measure_matmul_gflops(n=32, dtype=torch.float64, repeats=1) > 0


@pytest.mark.parametrize("kwargs, name", [({"n": 0}, "n"), ({"repeats": 0}, "repeats"),
                                          ({"dtype": torch.int32}, "dtype"), ({"device": "tpu"}, "device")])
def test_measure_matmul_gflops_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        measure_matmul_gflops(**{"n": 8, **kwargs})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_measure_matmul_gflops_missing_cuda_is_an_error():
    with pytest.raises(DeviceUnavailableError):
        measure_matmul_gflops(n=8, device="cuda")


def test_flops_per_cycle_from_isa_flags():
    assert flops_per_cycle({"avx512f", "avx2", "fma"})[0] == 64
    assert flops_per_cycle({"avx2", "fma"})[0] == 32
    assert flops_per_cycle({"avx2"})[0] == 8  # AVX2 without FMA: SSE rule
    assert flops_per_cycle(set())[0] == 8
    assert flops_per_cycle({"avx2", "fma"}, torch.float64)[0] == 16
    value, reason = flops_per_cycle({"avx512f"}, torch.bfloat16)
    assert value is None and "bfloat16" in reason
    with pytest.raises(ValueError, match="dtype"):
        flops_per_cycle(set(), torch.int8)


def test_estimate_peak_cpu_is_value_and_explanation():
    est = estimate_peak_gflops("cpu")
    assert isinstance(est, PeakEstimate) and est.explanation
    if est.gflops is not None:  # x86 Linux: the explanation shows every factor
        assert est.gflops > 0 and "GHz" in est.explanation and "FLOPs/cycle" in est.explanation


def test_estimate_peak_cpu_formula(monkeypatch):
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(hardware, "_cpu_clock_and_flags", lambda: (2000.0, "test", {"avx2", "fma"}))
    monkeypatch.setattr(hardware.torch, "get_num_threads", lambda: 4)
    monkeypatch.setattr(hardware.os, "cpu_count", lambda: 8)
    assert estimate_peak_gflops("cpu").gflops == pytest.approx(4 * 2.0 * 32)


def test_estimate_peak_cpu_honest_when_unknown(monkeypatch):
    monkeypatch.setattr(hardware.platform, "machine", lambda: "arm64")
    est = estimate_peak_gflops("cpu")
    assert est.gflops is None and "arm64" in est.explanation
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(hardware, "_cpu_clock_and_flags", lambda: (None, "", set()))
    est = estimate_peak_gflops("cpu")
    assert est.gflops is None and "clock" in est.explanation


def test_estimate_peak_bad_input():
    with pytest.raises(ValueError, match="dtype"):
        estimate_peak_gflops("cpu", dtype="fp32")
    with pytest.raises(ValueError, match="device"):
        estimate_peak_gflops("gpu")


def test_gpu_peak_table():
    assert gpu_peak_from_name("NVIDIA H100 80GB HBM3").gflops == pytest.approx(66_900)
    assert gpu_peak_from_name("NVIDIA H100 PCIe", torch.bfloat16).gflops == pytest.approx(756_000)
    assert gpu_peak_from_name("NVIDIA A100-SXM4-80GB", torch.float16).gflops == pytest.approx(312_000)
    assert gpu_peak_from_name("Tesla T4", torch.bfloat16).gflops is None
    unknown = gpu_peak_from_name("Imaginary GPU 9000")
    assert unknown.gflops is None and "not in" in unknown.explanation


def test_loop_vs_vectorised():
    result = loop_vs_vectorised(n=2000, repeats=1)
    assert result.loop_s > 0 and result.vector_s > 0 and result.speedup == result.loop_s / result.vector_s
    with pytest.raises(ValueError, match="n"):
        loop_vs_vectorised(n=0)


def test_loop_vs_vectorised_restores_threads():
    before = torch.get_num_threads()
    loop_vs_vectorised(n=100, repeats=1)
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="repeats"):
        loop_vs_vectorised(n=10, repeats=0)


def test_measure_bandwidth_counts_a_read_and_a_write(monkeypatch):
    monkeypatch.setattr(hardware, "time_fn", lambda fn, device, repeats, warmup: 0.25)
    assert hardware.measure_bandwidth_gbs(nbytes=4 * 2**20, repeats=1) == pytest.approx(2 * 4 * 2**20 / 0.25 / 1e9)


def test_measure_bandwidth_runs_small_and_refuses_bad_input():
    assert hardware.measure_bandwidth_gbs(nbytes=2**16, repeats=2) > 0
    for kwargs, name in (({"nbytes": 0}, "nbytes"), ({"repeats": 0}, "repeats"), ({"device": "tpu"}, "device")):
        with pytest.raises(ValueError, match=name):
            hardware.measure_bandwidth_gbs(**kwargs)


@pytest.mark.parametrize("speed, n", [(100.0, 1024), (1.0, 256), (10.0, 512)],
                         ids=["fp32-like: 1024", "software bf16: 256", "in between: 512"])
def test_peak_flops_on_the_cpu_is_measured_once_per_process(monkeypatch, speed, n):
    calls = []

    def fake_measure(size, dtype, device, repeats):
        calls.append(size)
        return speed + len(calls)              # the last of the best of 3 is the largest
    monkeypatch.setattr(hardware, "measure_matmul_gflops", fake_measure)
    hardware._peak_flops.cache_clear()
    try:
        peak = hardware.peak_flops("cpu")
        probes = [256, 512, 1024][: [256, 512, 1024].index(n) + 1]
        assert calls == probes + [n] * 3, calls          # sizes grow while a matmul stays under 50 ms
        assert peak.flops == pytest.approx((speed + len(calls)) * 1e9)
        assert peak.source.startswith(f"measured: the best of 3 {n}x{n}")
        assert hardware.peak_flops("cpu") is peak and len(calls) == len(probes) + 3          # cached
    finally:
        hardware._peak_flops.cache_clear()


def test_peak_flops_of_a_known_gpu_is_its_datasheet(monkeypatch):
    monkeypatch.setattr(hardware, "get_device", lambda name: torch.device("cuda", 0))
    monkeypatch.setattr(hardware.torch.cuda, "get_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    hardware._peak_flops.cache_clear()
    try:
        peak = hardware.peak_flops("cuda", torch.bfloat16)
        assert peak.flops == pytest.approx(989.4e12) and peak.source.startswith("estimated: datasheet")
    finally:
        hardware._peak_flops.cache_clear()


def test_peak_flops_bad_input():
    with pytest.raises(ValueError, match="dtype"):
        hardware.peak_flops("cpu", dtype=torch.int8)
    with pytest.raises(ValueError, match="device"):
        hardware.peak_flops("gpu")


def test_chips_table_has_current_chips_and_sources():
    names = " ".join(c.name for c in hardware.CHIPS)
    for chip in ("B200", "GB200", "MI300X", "MI355X", "Ironwood", "EPYC 9965"):
        assert chip in names
    assert all(c.source and c.kind in ("CPU", "GPU", "TPU") and c.bandwidth_gbs > 0 for c in hardware.CHIPS)
    assert hardware.ddr_bandwidth_gbs(12, 6400) == pytest.approx(614.4)
    assert hardware.chips_table().count("\n") == len(hardware.CHIPS)
    with pytest.raises(ValueError, match="channels"):
        hardware.ddr_bandwidth_gbs(0, 6400)


def test_new_gpu_peaks():
    assert gpu_peak_from_name("NVIDIA B200", torch.bfloat16).gflops == 2250e3
    assert gpu_peak_from_name("NVIDIA B200", torch.float32).gflops is None
    assert gpu_peak_from_name("AMD Instinct MI300X", torch.bfloat16).gflops == pytest.approx(1307.4e3)
