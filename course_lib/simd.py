"""SIMD lanes, measured: the same torch kernel built for wider and narrower vector registers.

PyTorch compiles its elementwise and reduction kernels several times (plain C++ "default", AVX2,
AVX-512 on x86) and picks the widest the CPU supports at start-up. The environment variable
ATEN_CPU_CAPABILITY caps that choice, so running the same op in child processes with
ATEN_CPU_CAPABILITY=default and =avx2 compares vector widths with everything else equal.
A register holds register_bits / (8 * bytes per number) lanes: AVX2 (256 bit) 8 fp32 or 32 int8,
AVX-512 16 fp32 or 64 int8. Matmuls go to MKL/oneDNN, which dispatch on their own and ignore
ATEN_CPU_CAPABILITY: we measure an elementwise multiply and a sum.

    python -m course_lib.simd                      # ns per element of mul and sum, one thread, as JSON
    from course_lib import simd
    simd.by_capability(["default", "avx2"])        # {"default": Timing(...), "avx2": Timing(...)}
    simd.int8_vs_fp32_matmul(256)                  # seconds for torch._int_mm and an fp32 matmul
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import NamedTuple

import torch

from .validate import one_of, positive_int

REGISTER_BITS = {"default": 128, "avx2": 256, "avx512": 512}   # "default": the compiler's baseline, SSE2 on x86-64
CAPABILITIES = tuple(REGISTER_BITS)


class Timing(NamedTuple):
    """What a process reported for itself: its capability and ns per element of each op."""

    capability: str
    ns_per_element: dict


class MatmulTiming(NamedTuple):
    fp32_s: float
    int8_s: float

    @property
    def speedup(self) -> float:
        return self.fp32_s / self.int8_s


def lanes(register_bits: int, dtype: torch.dtype) -> int:
    """How many numbers of `dtype` one vector register of `register_bits` holds."""
    positive_int("register_bits", register_bits)
    return register_bits // (8 * torch.empty(0, dtype=dtype).element_size())


def supported() -> list[str]:
    """The capabilities this CPU and torch build can run, narrowest first (ends at the native one)."""
    native = torch.backends.cpu.get_cpu_capability().lower()
    return list(CAPABILITIES[:CAPABILITIES.index(native) + 1]) if native in CAPABILITIES else ["default", native]


def _best_seconds(fn, inner: int, rounds: int = 7) -> float:
    """Best of `rounds` averages over `inner` calls, on one thread: lanes, not cores, are compared,
    and one thread is not stalled waiting for a sibling thread on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fn()
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            best = min(best, (time.perf_counter() - start) / inner)
        return best
    finally:
        torch.set_num_threads(threads)


def elementwise_ns(n: int = 16384) -> dict:
    """ns per element of x * y and of x.sum() on n fp32 numbers, one thread, best of 7 rounds.

    16384 floats (64 KiB) stay in the L2 cache, so the time is the arithmetic's, not DRAM's."""
    positive_int("n", n)
    x, y, out = torch.rand(n), torch.rand(n), torch.empty(n)
    return {"mul": _best_seconds(lambda: torch.mul(x, y, out=out), 50) / n * 1e9,
            "sum": _best_seconds(lambda: x.sum(), 50) / n * 1e9}


def by_capability(capabilities=None, timeout: float = 60) -> dict:
    """{capability: Timing}: the native capability measured in this process (torch already chose it),
    each narrower one in a child process started with ATEN_CPU_CAPABILITY set to it (~1-2 s each)."""
    capabilities = supported() if capabilities is None else list(capabilities)
    native = torch.backends.cpu.get_cpu_capability()
    results = {}
    for cap in capabilities:
        one_of("capabilities", cap, CAPABILITIES)
        if cap == native.lower() and os.environ.get("ATEN_CPU_CAPABILITY", cap) == cap:
            results[cap] = Timing(native, elementwise_ns())
            continue
        env = {**os.environ, "ATEN_CPU_CAPABILITY": cap}
        out = subprocess.run([sys.executable, "-m", "course_lib.simd"], env=env, capture_output=True,
                             text=True, timeout=timeout, check=True).stdout
        report = json.loads(out)
        results[cap] = Timing(report["capability"], report["ns_per_element"])
    return results


def int8_vs_fp32_matmul(n: int = 256) -> MatmulTiming | None:
    """Seconds of an (n, n) int8 matmul (torch._int_mm, int32 results) and of the same fp32 matmul, one thread.

    None where this torch has no CPU int8 matmul. Checks both give the same integers first."""
    positive_int("n", n)
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (n, n), dtype=torch.int8, generator=gen)
    b = torch.randint(-128, 128, (n, n), dtype=torch.int8, generator=gen)
    fa, fb = a.float(), b.float()
    try:
        exact = torch._int_mm(a, b)
    except (AttributeError, RuntimeError, NotImplementedError):
        return None
    if not torch.equal(exact, (fa @ fb).to(torch.int32)):   # |sums| < 2**24: exact in fp32 too
        raise AssertionError("torch._int_mm and the fp32 matmul disagree")
    inner = max(1, 2**24 // n**3)
    return MatmulTiming(_best_seconds(lambda: fa @ fb, inner, 5), _best_seconds(lambda: torch._int_mm(a, b), inner, 5))


if __name__ == "__main__":
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "ns_per_element": elementwise_ns()}))
