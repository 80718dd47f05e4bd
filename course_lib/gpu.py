"""Single-GPU mechanics: honest timing and host<->device copies (lecture 04).

CUDA runs asynchronously: a kernel launch or a `non_blocking` copy returns to Python before
the GPU has done the work. A stopwatch around such a call measures the *launch*, not the work,
so every timer here waits for the device (`synchronize`) before reading the clock. On the CPU
every operation is synchronous and the same code simply measures the work.

    from course_lib.gpu import time_fn, measure_copy_bandwidth
    time_fn(lambda: a @ b, device)                            # seconds per call (median)
    measure_copy_bandwidth(256 * 2**20, pinned=True, device)  # host->device GB/s
"""
from __future__ import annotations

import statistics
import time

import torch

from .env import DeviceUnavailableError
from .validate import non_negative_int, positive_int


def _as_device(device) -> torch.device:
    if isinstance(device, str):
        device = torch.device(device)
    if not isinstance(device, torch.device):
        raise TypeError(f"device must be a torch.device or a string such as 'cpu' or 'cuda'; got {device!r}")
    return device


def synchronize(device) -> None:
    """Wait until all queued work on `device` has finished (a no-op on CPU, which never queues)."""
    device = _as_device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def time_fn(fn, device, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall-clock seconds of one `fn()` call, with the device synchronised around each call.

    The warm-up calls are not timed: the first call pays for CUDA context creation, kernel
    selection and memory-allocator growth, which a training loop pays only once. The median
    ignores an occasional slow call (another process, a page fault).
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable; got {fn!r}")
    device = _as_device(device)
    positive_int("repeats", repeats)
    non_negative_int("warmup", warmup)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def host_buffer(nbytes: int, pinned: bool) -> torch.Tensor:
    """A uint8 host tensor of `nbytes` bytes, page-locked ("pinned") if asked.

    Only pinned memory can be read by the GPU's copy engine directly; a copy from ordinary
    (pageable) memory is first staged through a pinned buffer by the driver, which costs a
    second memcpy. Pinning needs a CUDA driver, so `pinned=True` fails without a GPU.
    """
    positive_int("nbytes", nbytes)
    if pinned and not torch.cuda.is_available():
        raise DeviceUnavailableError("pinned=True needs a CUDA GPU (page-locking is done by the CUDA driver)")
    return torch.ones(nbytes, dtype=torch.uint8).pin_memory() if pinned else torch.ones(nbytes, dtype=torch.uint8)


def measure_copy_bandwidth(nbytes: int, pinned: bool, device, repeats: int = 5) -> float:
    """Host -> `device` copy bandwidth in GB/s (1e9 bytes/s) for a buffer of `nbytes` bytes.

    device "cuda": the PCIe/NVLink transfer a training step pays for every batch it copies.
    device "cpu": a host-to-host memcpy (with pinned=False), the baseline a CPU-only run pays.
    """
    device = _as_device(device)
    if not isinstance(pinned, bool):
        raise TypeError(f"pinned must be True or False; got {pinned!r}")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be a 'cpu' or 'cuda' device; got {str(device)!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailableError(f"device={str(device)!r} was asked for, but torch sees no CUDA GPU")
    src = host_buffer(nbytes, pinned)
    dst = torch.empty_like(src, device=device)
    seconds = time_fn(lambda: dst.copy_(src, non_blocking=pinned), device, repeats=repeats)
    return nbytes / seconds / 1e9


def overlap_copy_with_host_work(nbytes: int, device, host_work) -> dict:
    """Seconds for (copy to GPU, then `host_work()`) with blocking vs non_blocking copies.

    With `non_blocking=True` from pinned memory, `.to()` only *queues* the copy and returns, so
    the CPU can run `host_work()` (say, preparing the next batch) while the copy engine moves
    bytes: the total approaches max(copy, host work) instead of their sum. CUDA events time
    the copy on the GPU's own clock. Returns {"copy_s", "blocking_s", "non_blocking_s",
    "call_returns_after_s": {False: s, True: s}} (how long `.to()` held the CPU).
    """
    device = _as_device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise DeviceUnavailableError(f"overlap needs a CUDA device that exists; got {str(device)!r}")
    if not callable(host_work):
        raise TypeError(f"host_work must be callable; got {host_work!r}")
    src = host_buffer(nbytes, pinned=True)
    src.to(device)  # warm-up: allocator and context
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    result = {"call_returns_after_s": {}}
    for non_blocking in (False, True):
        synchronize(device)
        t0 = time.perf_counter()
        start.record()
        dst = src.to(device, non_blocking=non_blocking)
        end.record()
        result["call_returns_after_s"][non_blocking] = time.perf_counter() - t0
        host_work()
        synchronize(device)
        result["non_blocking_s" if non_blocking else "blocking_s"] = time.perf_counter() - t0
        result["copy_s"] = start.elapsed_time(end) / 1e3
        del dst
    return result
