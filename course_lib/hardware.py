"""What the hardware can do: measured matmul FLOP/s and memory bandwidth against theoretical peaks.

A matmul of two n x n matrices costs 2*n^3 floating-point operations (n^3 multiply-adds), so
timing one gives the achieved FLOP/s. The theoretical peak is what the hardware could do at most:
cores x SIMD lanes x FMA units x 2 FLOPs per FMA x clock on a CPU, the datasheet on a GPU. MFU
divides by it (PaLM, Chowdhery et al. 2022, Appendix B); the best measured matmul is the
*achievable* peak, what a well-tuned kernel reaches here. Copying a tensor far larger than the
caches gives the memory bandwidth, the other roof of the roofline (`course_lib.roofline`).

    from course_lib.hardware import measure_matmul_gflops, estimate_peak_gflops, measure_bandwidth_gbs
    measure_matmul_gflops(n=1024)            # e.g. 120.0 (GFLOP/s, median of repeats)
    peak, why = estimate_peak_gflops("cpu")  # theoretical GFLOP/s (or None) and how it was found
    measure_bandwidth_gbs()                  # e.g. 12.0 (GB/s, a 64 MiB copy)
    peak_flops("cpu")                        # Peak(flops=1.6e11, source="theoretical: ...") for MFU
    achievable_flops("cpu")                  # Peak(flops=1.2e11, source="measured: ...")
    print(chips_table())                     # CHIPS: datasheet memory, bandwidth, peaks, with sources
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
    """A peak in FLOP/s and where it came from: "theoretical: ..." or "measured: ..."."""

    flops: float
    source: str


class CpuFacts(NamedTuple):
    """What a CPU's theoretical peak is derived from (`cpu_facts` reads this machine's; tests inject them).

    cores: cores torch computes on; clock_mhz: None where it cannot be read (some VMs, macOS);
    flags: ISA flags (x86 "flags", ARM "Features"); machine: as platform.machine() names it.
    """

    cores: int
    clock_mhz: float | None
    clock_source: str
    flags: frozenset
    machine: str


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
    """The theoretical peak FLOP/s that MFU divides by (PaLM, Chowdhery et al. 2022, Appendix B).

    `estimate_peak_gflops`: a known GPU's datasheet, a CPU's cores x lanes x FMA units x 2 x clock.
    Where no theoretical figure exists (an unknown GPU, an unreadable clock, bf16 on a CPU) it falls
    back to `achievable_flops`, and `source` says so: "theoretical: ..." or "measured: ... (no
    theoretical peak: why)". On a CPU the matmul is measured too: where it beats the clock's peak (a VM
    reports its base clock while the cores boost), the peak is taken at the clock the measurement implies.
    Cached per process, device and dtype.
    """
    _check_dtype(dtype)
    return _peak_flops(get_device(str(device)), dtype)


def achievable_flops(device="cpu", dtype=torch.float32) -> Peak:
    """The achievable peak: the best of 3 timed n x n matmuls (n = 1024 on a CPU, 4096 on a GPU).

    What a well-tuned kernel reaches on this machine now, below the theoretical peak; MFU against
    it says how far a run is from that kernel, not from the hardware's limit. The best of 3: a
    peak is what the device reaches when nothing disturbs it. Cached per process, device and dtype
    (about 0.1-0.3 s on a laptop).
    """
    _check_dtype(dtype)
    return _achievable_flops(get_device(str(device)), dtype)


@functools.lru_cache(maxsize=None)
def _peak_flops(device: torch.device, dtype) -> Peak:
    estimate = estimate_peak_gflops(device, dtype)
    if estimate.gflops is not None and device.type != "cpu":
        return Peak(estimate.gflops * 1e9, f"theoretical: {estimate.explanation}")
    achievable = _achievable_flops(device, dtype)
    if estimate.gflops is not None:
        if achievable.flops <= estimate.gflops * 1e9:
            return Peak(estimate.gflops * 1e9, f"theoretical: {estimate.explanation}")
        # A VM often reports its base clock while the cores boost above it: a peak below a measurement is wrong,
        # so the clock is raised to the one the measurement implies (the peak is then the measured FLOP/s).
        ratio = achievable.flops / (estimate.gflops * 1e9)
        return Peak(achievable.flops, f"theoretical: {estimate.explanation}; but {achievable.source} reached "
                                      f"{achievable.flops / 1e9:,.0f} GFLOP/s, so the cores run {ratio:.2f}x faster "
                                      "than that clock: the peak is taken at the clock the measurement implies")
    return Peak(achievable.flops, f"{achievable.source} (no theoretical peak: {estimate.explanation})")


@functools.lru_cache(maxsize=None)
def _achievable_flops(device: torch.device, dtype) -> Peak:
    n = _cpu_matmul_size(dtype) if device.type == "cpu" else 4096   # a GPU needs a larger matmul to fill its cores
    gflops = max(measure_matmul_gflops(n, dtype, device, repeats=1) for _ in range(3))
    where = f"the CPU with {torch.get_num_threads()} torch thread(s)" if device.type == "cpu" else str(device)
    return Peak(gflops * 1e9, f"measured: the best of 3 {n}x{n} {dtype} matmuls on {where}")


def _cpu_matmul_size(dtype, budget_s: float = 0.05) -> int:
    """1024 for fp32/fp64 (every CPU has SIMD for them). bf16/fp16: 1024, or 512 or 256 where a 1024
    matmul would take longer than `budget_s`: a CPU without bf16/fp16 instructions computes them in
    software at ~1 GFLOP/s (seconds per 1024 matmul, in every training run that reports MFU)."""
    if dtype in (torch.float32, torch.float64):
        return 1024
    n = 256
    gflops = measure_matmul_gflops(n, dtype, "cpu", repeats=1)
    while n < 1024 and 2 * (2 * n) ** 3 / (gflops * 1e9) <= budget_s:
        n *= 2
        gflops = measure_matmul_gflops(n, dtype, "cpu", repeats=1)
    return n


def _lscpu() -> str:
    try:
        return subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def _fields(text: str) -> list[tuple[str, str]]:
    """'key : value' lines as (key, value) pairs, in order (/proc/cpuinfo repeats keys per CPU)."""
    return [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in text.splitlines())]


def _mhz(text) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def cpu_facts() -> CpuFacts:
    """This machine's CpuFacts from lscpu and /proc/cpuinfo (Linux); elsewhere the clock stays None.

    cores = min(torch threads, physical cores): two hardware threads of one core share its FMA units.
    Clock: lscpu's "CPU max MHz" (the highest boost clock), else /proc/cpuinfo's current "cpu MHz".
    """
    lscpu = dict(_fields(_lscpu()))
    cpuinfo = _fields(_cpuinfo())
    clock, source = _mhz(lscpu.get("CPU max MHz")), "lscpu 'CPU max MHz' (highest boost clock)"
    if clock is None:
        clock = next((_mhz(v) for k, v in cpuinfo if k == "cpu MHz" and _mhz(v)), None)
        source = "/proc/cpuinfo 'cpu MHz' (current clock; boost may be higher)" if clock else ""
    flags = lscpu.get("Flags") or next((v for k, v in cpuinfo if k in ("flags", "Features")), "")
    try:
        physical = int(lscpu["Core(s) per socket"]) * int(lscpu["Socket(s)"])
    except (KeyError, ValueError):
        physical = os.cpu_count() or 1          # no lscpu (or no such lines): logical CPUs
    cores = max(1, min(torch.get_num_threads(), physical))
    return CpuFacts(cores, clock, source, frozenset(flags.split()), platform.machine().lower())


X86 = ("x86_64", "amd64", "i686", "i386")
# (flags that must all be present, ISA, fp32 lanes per vector register, FMA units per core), widest first.
# FMA units: 2 on recent x86 desktop and server cores (some Xeons and Zen 4 run AVX-512 at half that rate);
# ARM cores vary: Cortex-A76..A78, Neoverse N1/N2 have 2 x 128-bit, Apple M and Neoverse V1/V2 4.
SIMD_ISAS = (({"avx512f"}, "AVX-512", 16, 2), ({"avx2", "fma"}, "AVX2+FMA", 8, 2), ({"asimd"}, "NEON", 4, 2))


def flops_per_cycle(flags, dtype=torch.float32, machine: str = "x86_64") -> tuple[int | None, str]:
    """FLOPs one core can finish per cycle for fp32/fp64, from its ISA flags: lanes x FMA units x 2.

    An FMA unit does a multiply and an add (2 FLOPs) on every SIMD lane each cycle; fp64 has half
    the lanes of fp32. An x86 core without FMA (SSE) has one multiply and one add unit of 4 lanes.
    (None, why) where no rule applies: bf16/fp16 (AVX512-BF16, AMX), unknown flags off x86.
    """
    _check_dtype(dtype)
    if dtype not in (torch.float32, torch.float64):
        return None, f"no simple ISA rule for {dtype} on a CPU (it depends on AVX512-BF16/AMX support)"
    found = next((isa for isa in SIMD_ISAS if isa[0] <= set(flags)), None)
    if found is None and machine not in X86:
        return None, (f"no SIMD flags the course knows (AVX-512, AVX2+FMA, NEON 'asimd') on this {machine!r} "
                      "CPU: see its vendor's documentation")
    _, isa, lanes_fp32, units = found or ((), "SSE (no FMA: a multiply and an add unit)", 4, 1)
    lanes = lanes_fp32 if dtype == torch.float32 else lanes_fp32 // 2
    per_cycle = lanes * units * 2
    return per_cycle, f"{isa}: {lanes} {dtype} lanes x {units} FMA unit(s) x 2 FLOPs = {per_cycle} FLOPs/cycle"


def cpu_peak_gflops(facts: CpuFacts, dtype=torch.float32) -> PeakEstimate:
    """Theoretical peak of a CPU in GFLOP/s: cores x FLOPs/cycle x clock (GHz), from `facts`.

    E.g. 2 cores x (16 AVX-512 fp32 lanes x 2 FMA units x 2) x 3.0 GHz = 384 GFLOP/s. An upper bound
    (some cores lower their clock under AVX-512); PeakEstimate(None, why) where clock or ISA is unknown.
    """
    _check_dtype(dtype)
    if facts.clock_mhz is None:
        return PeakEstimate(None, "no clock frequency could be read (no lscpu 'CPU max MHz' or /proc/cpuinfo "
                                  "'cpu MHz': macOS has neither, some VMs hide them)")
    per_cycle, isa_text = flops_per_cycle(facts.flags, dtype, facts.machine)
    if per_cycle is None:
        return PeakEstimate(None, isa_text)
    gflops = facts.cores * per_cycle * facts.clock_mhz / 1000
    return PeakEstimate(gflops, f"{facts.cores} core(s) x ({isa_text}) x "
                                f"{facts.clock_mhz / 1000:.2f} GHz ({facts.clock_source}) = {gflops:,.0f} GFLOP/s")


# Dense datasheet peaks in TFLOP/s (no sparsity). fp32 is the non-tensor-core figure, which
# is what torch uses for fp32 matmuls unless TF32 is switched on. Order matters: most specific first.
GPU_PEAKS_TFLOPS = (
    ("H100 PCIe", "NVIDIA H100 PCIe", {torch.float32: 51.2, torch.bfloat16: 756.0, torch.float16: 756.0}),
    ("H100", "NVIDIA H100 SXM", {torch.float32: 66.9, torch.bfloat16: 989.4, torch.float16: 989.4}),
    ("H200", "NVIDIA H200 SXM", {torch.float32: 66.9, torch.bfloat16: 989.4, torch.float16: 989.4}),
    ("B200", "NVIDIA B200 (HGX)", {torch.bfloat16: 2250.0, torch.float16: 2250.0}),   # no fp32 row used here
    ("MI300X", "AMD Instinct MI300X", {torch.float32: 163.4, torch.bfloat16: 1307.4, torch.float16: 1307.4}),
    ("A100", "NVIDIA A100", {torch.float32: 19.5, torch.bfloat16: 312.0, torch.float16: 312.0}),
    ("V100", "NVIDIA V100 SXM2", {torch.float32: 15.7, torch.float16: 125.0}),
    ("T4", "NVIDIA T4", {torch.float32: 8.1, torch.float16: 65.0}),
    ("RTX 4090", "NVIDIA GeForce RTX 4090", {torch.float32: 82.6, torch.bfloat16: 165.2, torch.float16: 165.2}),
    ("L4", "NVIDIA L4", {torch.float32: 30.3, torch.bfloat16: 121.0, torch.float16: 121.0}),
)


class Chip(NamedTuple):
    """Datasheet figures of one processor: memory (GB, None for DIMMs), bandwidth (GB/s), dense
    peaks (TFLOP/s, no sparsity; None where the vendor gives none) and the datasheet they come from
    (FP4 from the same datasheet)."""

    name: str
    kind: str
    memory_gb: float | None
    bandwidth_gbs: float
    bf16_tflops: float | None
    fp8_tflops: float | None
    source: str
    fp4_tflops: float | None = None      # dense FP4 (NVFP4/MXFP4): Blackwell and MI355X only


def ddr_bandwidth_gbs(channels: int, mega_transfers: int) -> float:
    """Peak DRAM bandwidth of a CPU socket: channels x MT/s x 8 bytes per 64-bit transfer."""
    positive_int("channels", channels)
    positive_int("mega_transfers", mega_transfers)
    return channels * mega_transfers * 8 / 1000


# Per chip (a GPU package, one TPU chip, one CPU socket). Dense = without 2:4 sparsity; vendors
# often print the sparse figure, twice as large. B200's package has 192 GB of HBM3e of which NVIDIA
# exposes 180 GB; GB200 figures are the GB200 NVL72 rack's divided by its 72 GPUs. FP8 is OCP
# E4M3/E5M2 except on MI300X (CDNA3): FNUZ, E4M3 max 240 (course_lib.fp8.HARDWARE).
CHIPS = (
    Chip("NVIDIA H100 SXM", "GPU", 80, 3350, 989, 1979, "NVIDIA H100 Tensor Core GPU datasheet (2023)"),
    Chip("NVIDIA H200 SXM", "GPU", 141, 4800, 989, 1979, "NVIDIA H200 Tensor Core GPU datasheet (2024)"),
    Chip("NVIDIA B200 (HGX)", "GPU", 180, 8000, 2250, 4500, "NVIDIA HGX B200 / DGX B200 datasheets (2024)",
         fp4_tflops=9000),
    Chip("NVIDIA GB200 (per GPU)", "GPU", 186, 8000, 2500, 5000, "NVIDIA GB200 NVL72 datasheet (2024), / 72",
         fp4_tflops=10000),
    Chip("NVIDIA L40S (Ada)", "GPU", 48, 864, 362, 733, "NVIDIA L40S datasheet (2023)"),
    Chip("AMD Instinct MI300X", "GPU", 192, 5300, 1307, 2615, "AMD Instinct MI300X data sheet (2023)"),
    Chip("AMD Instinct MI355X", "GPU", 288, 8000, 2500, 5000, "AMD Instinct MI355X data sheet (2025)",
         fp4_tflops=10000),
    Chip("Google TPU v5p", "TPU", 95, 2765, 459, None, "Google Cloud TPU v5p documentation (2023)"),
    Chip("Google TPU v6e (Trillium)", "TPU", 32, 1640, 918, None, "Google Cloud TPU v6e documentation (2024)"),
    Chip("Google TPU v7 (Ironwood)", "TPU", 192, 7370, None, 4614, "Google Cloud Ironwood announcement (Apr 2025)"),
    Chip("AMD EPYC 9965, 192 cores", "CPU", None, ddr_bandwidth_gbs(12, 6400), None, None,
         "AMD EPYC 9005 series product page (2024): 12 x DDR5-6400 per socket"),
    Chip("Intel Xeon 6980P, 128 cores", "CPU", None, ddr_bandwidth_gbs(12, 6400), None, None,
         "Intel Xeon 6900P series product brief (2024): 12 x DDR5-6400 per socket"),
    Chip("a laptop, 2 x DDR5-5600", "CPU", None, ddr_bandwidth_gbs(2, 5600), None, None,
         "JEDEC DDR5-5600: 5600 MT/s x 8 bytes per channel"),
)


def chips_table() -> str:
    """CHIPS as aligned text, one row per chip, for printing."""
    def fmt(v, width):
        return f"{'-' if v is None else f'{v:,.0f}':>{width}}"
    lines = [f"{'chip':29} {'kind':4} {'memory GB':>9} {'GB/s':>6} {'bf16 TF/s':>9} {'fp8 TF/s':>8} "
             f"{'fp4 TF/s':>8}  source"]
    for c in CHIPS:
        memory = "DIMMs" if c.memory_gb is None else f"{c.memory_gb:,.0f}"
        lines.append(f"{c.name:29} {c.kind:4} {memory:>9} {fmt(c.bandwidth_gbs, 6)} {fmt(c.bf16_tflops, 9)} "
                     f"{fmt(c.fp8_tflops, 8)} {fmt(c.fp4_tflops, 8)}  {c.source}")
    return "\n".join(lines)


def gpu_peak_from_name(name: str, dtype=torch.float32) -> PeakEstimate:
    """Datasheet peak for a GPU whose name contains a known model, e.g. 'NVIDIA H100 80GB HBM3'."""
    _check_dtype(dtype)
    for pattern, label, peaks in GPU_PEAKS_TFLOPS:
        if pattern in name:
            if dtype not in peaks:
                return PeakEstimate(None, f"the course's table has no {dtype} matmul peak for the {label} "
                                          "(its tensor cores lack the format, or the datasheet gives none)")
            kind = "dense, CUDA cores" if dtype == torch.float32 else "dense, tensor cores"
            return PeakEstimate(peaks[dtype] * 1000, f"datasheet peak of the {label} for {dtype} "
                                                     f"({kind}): {peaks[dtype]} TFLOP/s")
    known = ", ".join(label for _, label, _ in GPU_PEAKS_TFLOPS)
    return PeakEstimate(None, f"GPU {name!r} is not in the course's table of datasheet peaks ({known})")


def estimate_peak_gflops(device="cpu", dtype=torch.float32) -> PeakEstimate:
    """Theoretical peak GFLOP/s of `device` for matmuls in `dtype`, with an explanation.

    CPU: `cpu_peak_gflops(cpu_facts())`, cores x lanes x FMA units x 2 x clock. GPU: datasheet table.
    Returns PeakEstimate(None, reason) when no honest figure can be found.
    """
    _check_dtype(dtype)
    device = get_device(str(device))
    if device.type == "cuda":
        return gpu_peak_from_name(torch.cuda.get_device_name(device), dtype)
    if device.type != "cpu":
        return PeakEstimate(None, f"no peak estimate for device type {device.type!r}")
    return cpu_peak_gflops(cpu_facts(), dtype)


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
