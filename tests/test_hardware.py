import pytest
import torch

from course_lib import hardware
from course_lib.env import DeviceUnavailableError
from course_lib.hardware import (CpuFacts, PeakEstimate, cpu_peak_gflops, estimate_peak_gflops, flops_per_cycle,
                                 gpu_peak_from_name, loop_vs_vectorised, measure_matmul_gflops)


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
    assert flops_per_cycle({"avx512f", "avx2", "fma"})[0] == 64          # 16 lanes x 2 FMA units x 2
    assert flops_per_cycle({"avx2", "fma"})[0] == 32                      # 8 lanes x 2 x 2
    assert flops_per_cycle({"avx2"})[0] == 8  # AVX2 without FMA: SSE rule, 4 lanes x (a multiply + an add)
    assert flops_per_cycle(set())[0] == 8
    assert flops_per_cycle({"avx2", "fma"}, torch.float64)[0] == 16       # fp64: half the lanes
    assert flops_per_cycle({"asimd"}, machine="aarch64")[0] == 16         # NEON: 4 lanes x 2 x 2
    assert flops_per_cycle({"asimd"}, torch.float64, machine="arm64")[0] == 8
    value, reason = flops_per_cycle(set(), machine="riscv64")             # no SSE fallback off x86
    assert value is None and "riscv64" in reason
    value, reason = flops_per_cycle({"avx512f"}, torch.bfloat16)
    assert value is None and "bfloat16" in reason
    with pytest.raises(ValueError, match="dtype"):
        flops_per_cycle(set(), torch.int8)


@pytest.mark.parametrize("facts, dtype, gflops", [
    (CpuFacts(2, 3000.0, "hand", frozenset({"avx512f"}), "x86_64"), torch.float32, 2 * 16 * 2 * 2 * 3.0),   # 384
    (CpuFacts(2, 3000.0, "hand", frozenset({"avx512f"}), "x86_64"), torch.float64, 2 * 8 * 2 * 2 * 3.0),
    (CpuFacts(4, 2500.0, "hand", frozenset({"avx2", "fma"}), "x86_64"), torch.float32, 4 * 8 * 2 * 2 * 2.5),
    (CpuFacts(8, 3200.0, "hand", frozenset({"asimd", "fp"}), "aarch64"), torch.float32, 8 * 4 * 2 * 2 * 3.2),
    (CpuFacts(1, 2000.0, "hand", frozenset({"sse2"}), "x86_64"), torch.float32, 1 * 4 * 1 * 2 * 2.0),
], ids=["avx512-fp32", "avx512-fp64", "avx2", "neon", "sse"])
def test_cpu_peak_is_cores_x_lanes_x_fma_units_x_2_x_clock(facts, dtype, gflops):
    estimate = cpu_peak_gflops(facts, dtype)
    assert estimate.gflops == pytest.approx(gflops)
    assert f"{facts.cores} core(s)" in estimate.explanation and "FLOPs/cycle" in estimate.explanation
    assert "hand" in estimate.explanation                                # says where the clock came from


def test_cpu_peak_is_none_with_the_reason_when_it_cannot_be_derived():
    no_clock = cpu_peak_gflops(CpuFacts(2, None, "", frozenset({"asimd"}), "arm64"))     # macOS: no clock
    assert no_clock.gflops is None and "clock" in no_clock.explanation
    other = cpu_peak_gflops(CpuFacts(2, 2000.0, "hand", frozenset(), "riscv64"))
    assert other.gflops is None and "riscv64" in other.explanation
    bf16 = cpu_peak_gflops(CpuFacts(2, 2000.0, "hand", frozenset({"avx512f"}), "x86_64"), torch.bfloat16)
    assert bf16.gflops is None and "bfloat16" in bf16.explanation


LSCPU = """Architecture:            x86_64
CPU(s):                  16
Core(s) per socket:      4
Socket(s):               2
CPU max MHz:             3500.0000
Flags:                   fpu sse2 avx2 fma avx512f
"""


@pytest.mark.parametrize("lscpu, cpuinfo, threads, facts", [
    (LSCPU, "", 16, (8, 3500.0, "lscpu", {"avx512f"})),                          # 8 physical cores, boost clock
    (LSCPU, "", 3, (3, 3500.0, "lscpu", {"avx512f"})),                           # torch uses 3 of them
    ("", "processor : 0\ncpu MHz : 2445.406\nflags : sse2 avx2 fma\n", 8, (1, 2445.406, "cpuinfo", {"avx2"})),
    ("", "processor : 0\nFeatures : fp asimd\n", 1, (1, None, "", {"asimd"})),  # ARM Linux without a clock
    ("", "", 4, (1, None, "", set())),                                            # macOS: neither source
    ("CPU max MHz: -\n", "cpu MHz : unknown\n", 1, (1, None, "", set())),        # unreadable: no crash
], ids=["lscpu", "threads", "cpuinfo", "arm-no-clock", "nothing", "garbage"])
def test_cpu_facts_from_lscpu_and_cpuinfo(monkeypatch, lscpu, cpuinfo, threads, facts):
    monkeypatch.setattr(hardware, "_lscpu", lambda: lscpu)
    monkeypatch.setattr(hardware, "_cpuinfo", lambda: cpuinfo)
    monkeypatch.setattr(hardware.torch, "get_num_threads", lambda: threads)
    monkeypatch.setattr(hardware.os, "cpu_count", lambda: 1)       # the fallback without lscpu's core count
    got = hardware.cpu_facts()
    cores, clock, source, flags = facts
    assert (got.cores, got.clock_mhz) == (cores, clock) and source in got.clock_source and flags <= got.flags
    assert isinstance(cpu_peak_gflops(got), PeakEstimate)                   # a value or a reason, never a crash


def test_estimate_peak_cpu_is_value_and_explanation():
    est = estimate_peak_gflops("cpu")
    assert isinstance(est, PeakEstimate) and est.explanation
    if est.gflops is not None:  # x86 Linux: the explanation shows every factor
        assert est.gflops > 0 and "GHz" in est.explanation and "FLOPs/cycle" in est.explanation


def test_estimate_peak_cpu_uses_this_machines_facts(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_facts", lambda: CpuFacts(4, 2000.0, "test", frozenset({"avx2", "fma"}), "x86_64"))
    assert estimate_peak_gflops("cpu").gflops == pytest.approx(4 * 2.0 * 32)


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


HAND = CpuFacts(2, 3000.0, "hand", frozenset({"avx512f"}), "x86_64")      # 384 GFLOP/s fp32


@pytest.fixture
def fresh_peaks():
    hardware._peak_flops.cache_clear(), hardware._achievable_flops.cache_clear()
    yield
    hardware._peak_flops.cache_clear(), hardware._achievable_flops.cache_clear()


def test_peak_flops_on_a_cpu_is_the_theoretical_peak(monkeypatch, fresh_peaks):
    monkeypatch.setattr(hardware, "cpu_facts", lambda: HAND)
    monkeypatch.setattr(hardware, "measure_matmul_gflops", lambda *a, **k: 300.0)
    peak = hardware.peak_flops("cpu")
    assert peak.flops == pytest.approx(384e9) and peak.source.startswith("theoretical: 2 core(s)")
    assert hardware.peak_flops("cpu") is peak                                                  # cached


def test_a_cpu_peak_below_a_measured_matmul_takes_the_clock_the_measurement_implies(monkeypatch, fresh_peaks):
    """A VM reports its base clock (2.45 GHz here) while its cores boost: a matmul then beats the clock's peak."""
    monkeypatch.setattr(hardware, "cpu_facts", lambda: HAND._replace(clock_mhz=2000.0))     # 256 GFLOP/s
    monkeypatch.setattr(hardware, "measure_matmul_gflops", lambda *a, **k: 320.0)
    peak = hardware.peak_flops("cpu")
    assert peak.flops == pytest.approx(320e9) and peak.source.startswith("theoretical: 2 core(s)")
    assert "1.25x faster than that clock" in peak.source


@pytest.mark.parametrize("facts, dtype, why", [(HAND._replace(clock_mhz=None), torch.float32, "clock"),
                                               (HAND, torch.bfloat16, "bfloat16")], ids=["no clock", "bf16"])
def test_peak_flops_falls_back_to_the_measured_matmul_and_says_so(monkeypatch, fresh_peaks, facts, dtype, why):
    monkeypatch.setattr(hardware, "cpu_facts", lambda: facts)
    monkeypatch.setattr(hardware, "measure_matmul_gflops", lambda n, dtype, device, repeats: 50.0)
    peak = hardware.peak_flops("cpu", dtype)
    assert peak.flops == hardware.achievable_flops("cpu", dtype).flops == pytest.approx(50e9)
    assert peak.source.startswith("measured: the best of 3") and "no theoretical peak" in peak.source
    assert why in peak.source


@pytest.mark.parametrize("dtype, speed, n", [(torch.float32, 100.0, 1024), (torch.bfloat16, 1.0, 256),
                                             (torch.bfloat16, 10.0, 512), (torch.bfloat16, 100.0, 1024)],
                         ids=["fp32: 1024", "software bf16: 256", "bf16 in between: 512", "fast bf16: 1024"])
def test_achievable_flops_on_the_cpu_is_measured_once_per_process(monkeypatch, fresh_peaks, dtype, speed, n):
    calls = []

    def fake_measure(size, dtype, device, repeats):
        calls.append(size)
        return speed + len(calls)              # the last of the best of 3 is the largest
    monkeypatch.setattr(hardware, "measure_matmul_gflops", fake_measure)
    peak = hardware.achievable_flops("cpu", dtype)
    # fp32 always 1024; bf16/fp16 sizes grow while a matmul stays under 50 ms (software bf16 is slow)
    probes = [] if dtype == torch.float32 else [256, 512, 1024][: [256, 512, 1024].index(n) + 1]
    assert calls == probes + [n] * 3, calls
    assert peak.flops == pytest.approx((speed + len(calls)) * 1e9)
    assert peak.source.startswith(f"measured: the best of 3 {n}x{n}")
    assert hardware.achievable_flops("cpu", dtype) is peak and len(calls) == len(probes) + 3          # cached


def test_peak_flops_of_a_known_gpu_is_its_datasheet(monkeypatch, fresh_peaks):
    monkeypatch.setattr(hardware, "get_device", lambda name: torch.device("cuda", 0))
    monkeypatch.setattr(hardware.torch.cuda, "get_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    peak = hardware.peak_flops("cuda", torch.bfloat16)
    assert peak.flops == pytest.approx(989.4e12) and peak.source.startswith("theoretical: datasheet")


@pytest.mark.parametrize("fn", [hardware.peak_flops, hardware.achievable_flops])
def test_peak_flops_bad_input(fn):
    with pytest.raises(ValueError, match="dtype"):
        fn("cpu", dtype=torch.int8)
    with pytest.raises(ValueError, match="device"):
        fn("gpu")


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
