"""Hardware profiles for `replay`: one device's roofs, its per-op overhead, and the network between devices.

Copy one and change a number (`dataclasses.replace(h100_node(), gpus_per_node=4)`) to ask "what if?".
Every figure says where it comes from: a datasheet (via `hardware.CHIPS` and `network.FABRICS`, which
carry their sources), a measurement on this machine (`cpu_this_machine`), or "assumption" — the
efficiency factors, per-op overheads and link latencies α are rough, illustrative choices, not data.
The network of a profile is a `network.Fabric` (`Profile.fabric`): collectives cost what
`network.collective_seconds` says, the same function lectures 05 and 08 use.

GPU peaks are dense bf16 tensor-core FLOP/s (a GPU would train this model in mixed precision); the
recorded bytes stay as recorded (fp32 on the CPU: an upper bound on the traffic, and DDP all-reduces
fp32 gradients under autocast anyway).
"""
from __future__ import annotations

import functools
import os
import re
import statistics
import time
from dataclasses import dataclass, field, replace

import torch

from .. import recorded
from ..distributed.network import FABRICS, Fabric, Link
from ..hardware import CHIPS
from ..validate import one_of, positive_int, positive_number


@dataclass(frozen=True)
class Profile:
    name: str
    peak_flops: float          # FLOP/s of one device
    mem_GBps: float            # memory bandwidth of one device, GB/s
    gpus_per_node: int         # devices joined by `intra`; beyond them `inter`
    intra: Link                # NVLink: α, GB/s per direction per device
    inter: Link                # ONE network card: α between nodes, GB/s per direction per card
    eff_flops: float = 0.6     # share of peak a real kernel reaches (assumption)
    eff_bw: float = 0.8        # share of memory bandwidth a real kernel reaches (assumption)
    host_s: float = 5e-6       # per kernel: the host's work to issue it (Python, autograd, dispatcher, launch)
    async_launch: bool = False  # a GPU: the host issues kernels ahead of the device (`issue_seconds`)
    view_s: float = 0.0        # per view/metadata op on a CPU (on a GPU: none, no kernel)
    cuda_graph: bool = False   # a GPU step captured as one CUDA graph: replayed without per-op host cost
    kernel_min_s: float = 0.0  # a kernel's shortest time on the device, however little it does
    source: str = ""
    op_scale: dict = field(default_factory=dict)   # op name -> measured / roofline time (`calibrate`)
    nics_per_node: int | None = None   # network cards per node; None: one per device, as on a DGX

    @property
    def fabric(self) -> Fabric:
        """The network of this profile as a `network.Fabric`, what collectives are priced on."""
        return Fabric(self.name, self.gpus_per_node, self.intra, self.nics_per_node or self.gpus_per_node,
                      self.inter, self.source)

    def op_seconds(self, flops: float, nbytes: float, view: bool = False, name: str = "") -> float:
        """One op on the device: its roofline time, max(compute, memory) x its calibrated factor (a kernel at
        least kernel_min_s). A CPU also issues it, in turn: + host_s (a view: view_s). On a GPU (async_launch)
        the host's work runs on its own clock, ahead of the kernels (`issue_seconds`); a view launches nothing."""
        if view:
            return 0.0 if self.async_launch else self.view_s
        roof = max(flops / (self.peak_flops * self.eff_flops), nbytes / (self.mem_GBps * 1e9 * self.eff_bw))
        roof = max(roof * self.op_scale.get(name, 1.0), self.kernel_min_s)
        return roof if self.async_launch else roof + self.host_s

    def issue_seconds(self, view: bool = False) -> float:
        """A GPU's host time to issue one op: host_s per kernel (Python, autograd, dispatcher, launch). A kernel
        cannot start before the host has issued it, nor before the one ahead ends, so a step of kernels shorter
        than host_s is host-bound. 0 for a view, under cuda_graph (the whole step is one graph launch, a few
        µs, not counted) and on a CPU (op_seconds counts it)."""
        return 0.0 if view or self.cuda_graph or not self.async_launch else self.host_s


@functools.lru_cache(maxsize=1)
def gpu_host_seconds() -> tuple[float, str]:
    """(seconds of host work per kernel of an eager GPU step, where that figure comes from).

    Calibrated on lecture 04's shipped GPU measurement: Net trained at batch 64 with the data on the GPU
    (64 / images per second = one step), divided by the kernels of that step (`record_single("net")`: its
    ops that are not views). That step is host-bound (its kernels take microseconds), so the quotient is the
    host's work per kernel: Python, the nn.Module calls, autograd, the dispatcher, the launch. It depends on
    the host CPU and the software, not on the GPU: every GPU profile uses it. Without the recording: 5 µs
    (assumption)."""
    from .record import record_single

    record = recorded.load("04_single_gpu")
    rate = (recorded.values("04_single_gpu", "rates") or {}).get("TensorLoader on device")
    if not (record and rate):
        return 5e-6, "host 5 µs per kernel (assumption: no GPU recording ships)"
    kernels = sum(e.stream == "compute" and not e.view for e in record_single("net", batch=64, steps=1).ranks[0].events)
    seconds = 64 / rate / kernels
    return seconds, (f"host {seconds * 1e6:.0f} µs per kernel (calibrated: Net's step, batch 64, {1e3 * 64 / rate:.2f} ms "
                     f"/ its {kernels} kernels, {recorded.label(record)})")


def _gpu(profile: Profile) -> Profile:
    """A GPU profile with the recorded host cost per op (gpu_host_seconds) and its source."""
    host, source = gpu_host_seconds()
    return replace(profile, host_s=host, async_launch=True, kernel_min_s=2e-6,
                   source=f"{profile.source}; {source}; a kernel at least 2 µs (assumption)")


def _chip(name: str):
    return next(c for c in CHIPS if c.name == name)


def _network(fabric: str) -> dict:
    """The Profile fields that describe network.FABRICS[fabric]: the one set of link figures."""
    f = FABRICS[fabric]
    return {"gpus_per_node": f.gpus_per_node, "intra": f.intra, "inter": f.inter, "nics_per_node": f.nics_per_node}


def h100_node() -> Profile:
    """DGX/HGX H100: 8 x H100 SXM (989 TFLOP/s bf16 dense, 3.35 TB/s HBM3: NVIDIA H100 datasheet, 2023,
    via hardware.CHIPS); its network is network.FABRICS["DGX H100"]: NVLink4 450 GB/s per direction per GPU,
    8 InfiniBand NDR cards of 50 GB/s per direction (NVIDIA DGX H100 datasheet, 2023); α assumed."""
    chip = _chip("NVIDIA H100 SXM")
    return _gpu(Profile("h100_node", chip.bf16_tflops * 1e12, chip.bandwidth_gbs, **_network("DGX H100"),
                        source=f"{chip.source}; network.FABRICS['DGX H100']"))


def h200_node() -> Profile:
    """HGX H200: as h100_node with H200 SXM chips (same 989 TFLOP/s bf16 dense; 141 GB HBM3e at 4.8 TB/s:
    NVIDIA H200 datasheet, 2024, via hardware.CHIPS) and the same network (DGX H200 = DGX H100's)."""
    chip = _chip("NVIDIA H200 SXM")
    return _gpu(replace(h100_node(), name="h200_node", peak_flops=chip.bf16_tflops * 1e12, mem_GBps=chip.bandwidth_gbs,
                        source=f"{chip.source}; network.FABRICS['DGX H100']"))


def a100_node() -> Profile:
    """DGX A100: 8 x A100 80GB SXM, 312 TFLOP/s bf16 dense and 2,039 GB/s HBM2e (NVIDIA A100 datasheet,
    2021); network.FABRICS["DGX A100"]: NVLink3 300 GB/s per direction, 8 HDR cards of 25 GB/s per direction."""
    return _gpu(Profile("a100_node", 312e12, 2039.0, **_network("DGX A100"),
                        source="NVIDIA A100 datasheet; network.FABRICS['DGX A100']"))


def b200_node() -> Profile:
    """DGX B200: 8 x B200 (2,250 TFLOP/s bf16 dense, 8 TB/s HBM3e: NVIDIA DGX B200 datasheet, 2024, via
    hardware.CHIPS); network.FABRICS["DGX B200"]: NVLink5 900 GB/s per direction, 8 NDR cards of 50 GB/s."""
    chip = _chip("NVIDIA B200 (HGX)")
    return _gpu(Profile("b200_node", chip.bf16_tflops * 1e12, chip.bandwidth_gbs, **_network("DGX B200"),
                        source=f"{chip.source}; network.FABRICS['DGX B200']"))


def cloud_vm_25gbe() -> Profile:
    """One A100 40GB per VM (312 TFLOP/s bf16 dense, 1,555 GB/s HBM2: NVIDIA A100 datasheet, 2021), VMs
    joined by one 25 Gb/s Ethernet port each: network.FABRICS["cloud VMs, 25 GbE"] (3.125 GB/s per direction,
    α = 50 µs assumed for Ethernet with TCP)."""
    return _gpu(Profile("cloud_vm_25gbe", 312e12, 1555.0, **_network("cloud VMs, 25 GbE"),
                        source="NVIDIA A100 datasheet; network.FABRICS['cloud VMs, 25 GbE']"))


def _median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cpu_this_machine(allreduce: dict | None = None, threads: int = 1, world_size: int = 2) -> Profile:
    """This CPU as one device per rank (`threads` torch threads, as `launch` gives each rank), calibrated now.

    Peak: the best 512x512 fp32 matmul (hardware.measure_matmul_gflops); bandwidth: a 32 MiB copy
    (hardware.measure_bandwidth_gbs); per-op overhead: the median of a 1-element add and of a view;
    links: gloo's α–β fitted (costmodel.fit_alpha_beta, ring, `world_size` ranks) to `allreduce`, timings from
    costmodel.measure_allreduce ({"sizes", "times": {"torch": [...]}}; `record_ddp(calibrate=True)`
    keeps them in `Recording.allreduce`), or measured here (a 2-rank launch, a few seconds) when None.
    Efficiencies are 1: the roofs are what this machine reached. All ranks count as one node.
    """
    from ..distributed import costmodel
    from ..hardware import measure_bandwidth_gbs, measure_matmul_gflops
    positive_int("threads", threads)
    if allreduce is None:
        allreduce = costmodel.measure([2**10, 2**16, 2**20, 2**22], impls="torch", world_size=world_size, repeats=3)
    if not (isinstance(allreduce, dict) and "sizes" in allreduce and "torch" in allreduce.get("times", {})):
        raise ValueError("allreduce must be costmodel.measure_allreduce's result {'sizes', 'times': {'torch': ...}}"
                         f"; got {allreduce!r}")
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gflops = max(measure_matmul_gflops(512, repeats=3) for _ in range(2))
        gbs = measure_bandwidth_gbs(32 * 2**20, repeats=3)
        a, b = torch.ones(1), torch.ones(1)
        launch = _median_seconds(lambda: torch.add(a, b), 200)
        view = _median_seconds(lambda: a.view(-1), 200)
    finally:
        torch.set_num_threads(old)
    alpha, beta = costmodel.fit_alpha_beta(allreduce["sizes"], allreduce["times"]["torch"], "ring",
                                           positive_int("world_size", world_size))
    gloo = Link(alpha, 1 / beta / 1e9 if beta > 0 else float("inf"))
    return Profile("cpu_this_machine", gflops * 1e9, gbs, 1_000_000, gloo, gloo, eff_flops=1.0, eff_bw=1.0,
                   host_s=launch, view_s=view,
                   source=f"measured here: {gflops:.0f} GFLOP/s (512x512 matmul, {threads} thread), {gbs:.1f} GB/s "
                          f"copy, {launch * 1e6:.1f} µs/op, gloo α={alpha * 1e6:.0f} µs, {gloo.GBps:.2f} GB/s")


def calibrate(profile: Profile, recording, ranks_per_core: float = 1.0) -> Profile:
    """`profile` fitted to one measured single-process step (`record_single(time_ops=...)`): per op name,
    the factor by which this machine's kernels miss the roofline (small convolutions and max-pooling run
    far below the matmul rate), and a per-op overhead so that the replayed step takes what the step took
    (the time between ops: Python, autograd, the allocator). ranks_per_core > 1: ranks share cores, so
    every op takes that much longer (4 ranks on 2 cores: 2).
    """
    check_profile(profile)
    positive_number("ranks_per_core", ranks_per_core)
    rank = recording.ranks[0]
    ops = [e for e in rank.events if e.stream == "compute" and not e.view]
    if recording.world_size != 1 or not recording.measured_step_s or not any(e.measured_s for e in ops):
        raise ValueError("recording must be one process recorded with time_ops (record_single(time_ops=3)); "
                         f"got {recording.label!r}")
    bare = replace(profile, host_s=0.0, op_scale={})
    roof, measured = {}, {}
    for e in ops:
        roof[e.name] = roof.get(e.name, 0.0) + bare.op_seconds(e.flops, e.bytes)
        measured[e.name] = measured.get(e.name, 0.0) + e.measured_s
    # Timed one by one, ops can sum to more than the untimed step (timer and cache effects) or to less
    # (the time between ops): either way the replayed single step is made to take what the step took.
    total = sum(measured.values())
    budget = recording.measured_step_s - profile.view_s * sum(e.view for e in rank.events)
    k = min(1.0, budget / total)
    scale = {n: measured[n] / roof[n] * k * max(ranks_per_core, 1.0) for n in roof if roof[n] > 0}
    launch = max(budget - total, 0.0) / len(ops) * max(ranks_per_core, 1.0)
    shared = f", x{ranks_per_core:g} for ranks sharing cores" if ranks_per_core > 1 else ""
    return replace(profile, op_scale=scale, host_s=launch,
                   source=f"{profile.source}; calibrated on {recording.label} ({len(scale)} op kinds, "
                          f"{launch * 1e6:.1f} µs between ops{shared})")


def cores() -> int:
    """CPU cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


PROFILES = {"h100_node": h100_node, "h200_node": h200_node, "a100_node": a100_node, "b200_node": b200_node,
            "cloud_vm_25gbe": cloud_vm_25gbe, "cpu_this_machine": cpu_this_machine}


def get_profile(name: str) -> Profile:
    """A profile by name: one of PROFILES (cpu_this_machine measures, which takes a few seconds)."""
    one_of("profile", name, tuple(PROFILES))
    return PROFILES[name]()


def check_profile(profile: Profile) -> Profile:
    """Refuse a Profile with a non-positive figure, naming the field."""
    if not isinstance(profile, Profile):
        raise TypeError(f"profile must be a Profile (see PROFILES: {tuple(PROFILES)}); got {type(profile).__name__}")
    for name in ("peak_flops", "mem_GBps", "eff_flops", "eff_bw"):
        positive_number(f"profile.{name}", getattr(profile, name))
    positive_int("profile.gpus_per_node", profile.gpus_per_node)
    positive_int("profile.nics_per_node", profile.nics_per_node, allow_none=True)
    if profile.cuda_graph and not profile.async_launch:
        raise ValueError("profile.cuda_graph applies to a GPU profile (async_launch=True): a CPU has no CUDA graphs")
    return profile
