"""What the hardware can do: measured matmul FLOP/s and memory bandwidth against estimated peaks.

A matmul of two n x n matrices costs 2*n^3 floating-point operations (n^3 multiply-adds), so
timing one gives the achieved FLOP/s. Comparing it with the peak (cores x clock x FLOPs per
cycle on a CPU, the datasheet on a GPU) says how much of the machine a program really uses.
Copying a tensor far larger than the caches gives the memory bandwidth, the other roof of the
roofline (`course_lib.roofline`).

    from course_lib.hardware import measure_matmul_gflops, estimate_peak_gflops, measure_bandwidth_gbs
    measure_matmul_gflops(n=1024)            # e.g. 120.0 (GFLOP/s, median of repeats)
    peak, why = estimate_peak_gflops("cpu")  # value (or None) and how it was found
    measure_bandwidth_gbs()                  # e.g. 12.0 (GB/s, a 64 MiB copy)
    peak_flops("cpu")                        # Peak(flops=1.2e11, source="measured: ...") for MFU
"""
from __future__ import annotations

import functools
import os
import platform
import subprocess
from typing import NamedTuple

import torch

from .env import get_device
from .gpu import time_fn
from .validate import positive_int

FLOAT_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


class PeakEstimate(NamedTuple):
    """A peak FLOP/s estimate in GFLOP/s (None when it cannot be found) and how it was made."""

    gflops: float | None
    explanation: str


class Peak(NamedTuple):
    """The FLOP/s that MFU divides by, and where the figure came from."""

    flops: float
    source: str


class LoopVsVector(NamedTuple):
    """Seconds for a Python loop and for one vectorised torch op doing the same work."""

    loop_s: float
    vector_s: float

    @property
    def speedup(self) -> float:
        return self.loop_s / self.vector_s


def _check_dtype(dtype) -> None:
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype must be one of {FLOAT_DTYPES}; got {dtype!r}")


def measure_matmul_gflops(n: int = 1024, dtype=torch.float32, device="cpu", repeats: int = 5) -> float:
    """Achieved GFLOP/s of an (n, n) @ (n, n) matmul: 2*n^3 / median seconds / 1e9.

    One untimed warm-up call, then the median of `repeats` timed calls (course_lib.gpu.time_fn).

    device: "cpu", "cuda", "cuda:N", "mps" or "auto" (a missing device is an error, not a
    silent CPU figure).
    """
    positive_int("n", n)
    positive_int("repeats", repeats)
    _check_dtype(dtype)
    device = get_device(str(device))
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    seconds = time_fn(lambda: a @ b, device, repeats=repeats, warmup=1)  # synchronizes on a GPU
    return 2 * n**3 / seconds / 1e9


def measure_bandwidth_gbs(nbytes: int = 64 * 2**20, device="cpu", repeats: int = 5) -> float:
    """Memory bandwidth in GB/s (1e9 bytes/s): copy an fp32 tensor of `nbytes` bytes into another.

    A copy reads `nbytes` and writes `nbytes` and does no arithmetic, so 2*nbytes / median seconds
    is the rate at which memory feeds the cores (STREAM's "copy" convention). The default 64 MiB
    is far larger than a CPU's caches: smaller tensors measure the cache instead.
    """
    positive_int("nbytes", nbytes)
    positive_int("repeats", repeats)
    device = get_device(str(device))
    src = torch.ones(max(nbytes // 4, 1), device=device)
    dst = torch.empty_like(src)
    seconds = time_fn(lambda: dst.copy_(src), device, repeats=repeats, warmup=1)
    return 2 * src.numel() * 4 / seconds / 1e9


def peak_flops(device="cpu", dtype=torch.float32) -> Peak:
    """The peak FLOP/s to divide by for MFU: a known GPU's datasheet figure, else a measured matmul.

    A CPU's peak is measured (1024 x 1024 matmuls, as `measure_matmul_gflops`): the ISA estimate
    is an upper bound that the CPU rarely reaches. Measured once per process, device and dtype
    (about 0.1-0.3 s on a laptop), then cached. `source` says "measured: ..." or "estimated: ...".
    """
    _check_dtype(dtype)
    return _peak_flops(get_device(str(device)), dtype)


@functools.lru_cache(maxsize=None)
def _peak_flops(device: torch.device, dtype) -> Peak:
    if device.type == "cuda":
        sheet = gpu_peak_from_name(torch.cuda.get_device_name(device), dtype)
        if sheet.gflops is not None:
            return Peak(sheet.gflops * 1e9, f"estimated: {sheet.explanation}")
    n = 1024 if device.type == "cpu" else 4096     # a GPU needs a larger matmul to fill its cores
    # the best of 3 single timings: a peak is what the device reaches when nothing disturbs it
    gflops = max(measure_matmul_gflops(n, dtype, device, repeats=1) for _ in range(3))
    where = f"the CPU with {torch.get_num_threads()} torch thread(s)" if device.type == "cpu" else str(device)
    return Peak(gflops * 1e9, f"measured: the best of 3 {n}x{n} {dtype} matmuls on {where}")


def _lscpu() -> str:
    try:
        return subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu_clock_and_flags() -> tuple[float | None, str, set[str]]:
    """(clock in MHz or None, where it came from, ISA flags) from lscpu and /proc/cpuinfo."""
    clock, source, flags = None, "", set()
    for line in _lscpu().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "CPU max MHz" and value.strip():
            clock, source = float(value), "lscpu 'CPU max MHz' (highest boost clock)"
        if key.strip() == "Flags":
            flags = set(value.split())
    try:
        with open("/proc/cpuinfo") as f:
            cpuinfo = f.read()
    except OSError:
        cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if clock is None and key.strip() == "cpu MHz":
            clock, source = float(value), "/proc/cpuinfo 'cpu MHz' (current clock; boost may be higher)"
        if not flags and key.strip() == "flags":
            flags = set(value.split())
    return clock, source, flags


def flops_per_cycle(flags: set[str], dtype=torch.float32) -> tuple[int | None, str]:
    """FLOPs one core can finish per cycle for fp32/fp64 FMA, from its x86 ISA flags.

    An FMA unit does a multiply and an add (2 FLOPs) on every SIMD lane each cycle; recent
    x86 cores have 2 FMA units. AVX-512 has 16 fp32 lanes, AVX2 has 8, SSE has 4.
    """
    _check_dtype(dtype)
    if dtype not in (torch.float32, torch.float64):
        return None, f"no simple ISA rule for {dtype} on a CPU (it depends on AVX512-BF16/AMX support)"
    lanes_fp32, units, isa = 4, 1, "SSE (4 fp32 lanes, multiply + add, no FMA)"
    if "avx512f" in flags:
        lanes_fp32, units, isa = 16, 2, "AVX-512 (16 fp32 lanes, 2 FMA units)"
    elif "avx2" in flags and "fma" in flags:
        lanes_fp32, units, isa = 8, 2, "AVX2+FMA (8 fp32 lanes, 2 FMA units)"
    lanes = lanes_fp32 if dtype == torch.float32 else lanes_fp32 // 2
    return units * lanes * 2, f"{isa}: {units} x {lanes} lanes x 2 = {units * lanes * 2} {dtype} FLOPs/cycle"


# Dense datasheet peaks in TFLOP/s (no sparsity). fp32 is the non-tensor-core figure, which
# is what torch uses for fp32 matmuls unless TF32 is switched on. Order matters: most specific first.
GPU_PEAKS_TFLOPS = (
    ("H100 PCIe", "NVIDIA H100 PCIe", {torch.float32: 51.2, torch.bfloat16: 756.0, torch.float16: 756.0}),
    ("H100", "NVIDIA H100 SXM", {torch.float32: 66.9, torch.bfloat16: 989.4, torch.float16: 989.4}),
    ("H200", "NVIDIA H200 SXM", {torch.float32: 66.9, torch.bfloat16: 989.4, torch.float16: 989.4}),
    ("A100", "NVIDIA A100", {torch.float32: 19.5, torch.bfloat16: 312.0, torch.float16: 312.0}),
    ("V100", "NVIDIA V100 SXM2", {torch.float32: 15.7, torch.float16: 125.0}),
    ("T4", "NVIDIA T4", {torch.float32: 8.1, torch.float16: 65.0}),
    ("RTX 4090", "NVIDIA GeForce RTX 4090", {torch.float32: 82.6, torch.bfloat16: 165.2, torch.float16: 165.2}),
    ("L4", "NVIDIA L4", {torch.float32: 30.3, torch.bfloat16: 121.0, torch.float16: 121.0}),
)


def gpu_peak_from_name(name: str, dtype=torch.float32) -> PeakEstimate:
    """Datasheet peak for a GPU whose name contains a known model, e.g. 'NVIDIA H100 80GB HBM3'."""
    _check_dtype(dtype)
    for pattern, label, peaks in GPU_PEAKS_TFLOPS:
        if pattern in name:
            if dtype not in peaks:
                return PeakEstimate(None, f"{label} has no {dtype} matmul peak on its datasheet "
                                          "(the format is not supported by its tensor cores)")
            kind = "dense, CUDA cores" if dtype == torch.float32 else "dense, tensor cores"
            return PeakEstimate(peaks[dtype] * 1000, f"datasheet peak of the {label} for {dtype} "
                                                     f"({kind}): {peaks[dtype]} TFLOP/s")
    known = ", ".join(label for _, label, _ in GPU_PEAKS_TFLOPS)
    return PeakEstimate(None, f"GPU {name!r} is not in the course's table of datasheet peaks ({known})")


def estimate_peak_gflops(device="cpu", dtype=torch.float32) -> PeakEstimate:
    """Peak GFLOP/s of `device` for matmuls in `dtype`, with an explanation of the estimate.

    CPU: cores used by torch x clock x FLOPs/cycle (from ISA flags). GPU: datasheet table.
    Returns PeakEstimate(None, reason) when no honest figure can be found.
    """
    _check_dtype(dtype)
    device = get_device(str(device))
    if device.type == "cuda":
        return gpu_peak_from_name(torch.cuda.get_device_name(device), dtype)
    if device.type != "cpu":
        return PeakEstimate(None, f"no peak estimate for device type {device.type!r}")
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64", "i686", "i386"):
        return PeakEstimate(None, f"CPU architecture {machine!r} is not x86: FLOPs/cycle cannot be "
                                  "read from x86 ISA flags (e.g. Apple/ARM cores: see the vendor's documentation)")
    clock_mhz, clock_source, flags = _cpu_clock_and_flags()
    if clock_mhz is None:
        return PeakEstimate(None, f"no clock frequency found (no lscpu 'CPU max MHz' and no /proc/cpuinfo) "
                                  f"on {platform.system()}")
    per_cycle, isa_text = flops_per_cycle(flags, dtype)
    if per_cycle is None:
        return PeakEstimate(None, isa_text)
    cores = min(torch.get_num_threads(), os.cpu_count() or 1)
    gflops = cores * clock_mhz / 1000 * per_cycle
    explanation = (f"{cores} core(s) (torch.get_num_threads()={torch.get_num_threads()}, "
                   f"os.cpu_count()={os.cpu_count()}) x {clock_mhz / 1000:.2f} GHz from {clock_source} "
                   f"x {isa_text} = {gflops:.0f} GFLOP/s. An upper bound: some cores run 512-bit "
                   "instructions as two 256-bit halves (e.g. AMD Zen 4) or lower their clock under AVX-512.")
    return PeakEstimate(gflops, explanation)


def loop_vs_vectorised(n: int = 100_000, repeats: int = 3) -> LoopVsVector:
    """Time y = a*x + b over n floats as a Python loop and as one torch expression, on one core.

    The vectorised version runs one compiled loop that uses SIMD lanes, instead of n trips
    through the interpreter with a boxed float each time. torch runs single-threaded here so
    that the gain is not from extra cores (and a busy neighbour core cannot stall it).
    """
    positive_int("n", n)
    positive_int("repeats", repeats)
    x = torch.rand(n)
    xs = x.tolist()

    def loop():
        return [2.0 * v + 1.0 for v in xs]

    def vector():
        return 2.0 * x + 1.0

    expected = torch.tensor(loop())
    if not torch.allclose(vector(), expected):
        raise AssertionError("loop and vectorised results differ")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return LoopVsVector(time_fn(loop, "cpu", repeats=repeats), time_fn(vector, "cpu", repeats=repeats))
    finally:
        torch.set_num_threads(threads)
