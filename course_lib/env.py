"""Where the course runs: device choice, seeding, quick mode, and the `doctor` report.

Every notebook and script asks this module for its device and seed, so that "which GPU?"
and "why did my numbers change?" have one answer.

    python -m course_lib doctor        # what this machine can do, and what is missing
"""
from __future__ import annotations

import contextlib
import os
import platform
import random
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .validate import non_negative_int

DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")


class DeviceUnavailableError(RuntimeError):
    """A device was asked for by name but this machine does not have it."""


def get_device(name: str = "auto") -> torch.device:
    """Return the torch.device to use.

    name: "auto" (CUDA, then Apple MPS, then CPU), "cpu", "cuda", "cuda:N", "mps", or a torch.device.
    Asking for a device this machine lacks is an error rather than a silent CPU fallback, so
    a timing never claims to be a GPU figure when it is not.
    """
    if isinstance(name, torch.device):
        name = str(name)
    if not isinstance(name, str):
        raise TypeError(f"device must be a string, one of {DEVICE_CHOICES} or 'cuda:N'; got {name!r}")
    kind, _, index = name.partition(":")
    if kind not in DEVICE_CHOICES or (index and (kind != "cuda" or not index.isdigit())):
        raise ValueError(f"device must be one of {DEVICE_CHOICES} or 'cuda:N'; got {name!r}")
    if kind == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                f"device={name!r} was asked for, but torch sees no CUDA GPU on this machine "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}). "
                "Use device='auto' or 'cpu', or run `python -m course_lib doctor`."
            )
        if index and int(index) >= torch.cuda.device_count():
            raise DeviceUnavailableError(f"device={name!r}: only {torch.cuda.device_count()} CUDA device(s) exist")
    if kind == "mps" and not _mps_available():
        raise DeviceUnavailableError(f"device={name!r} was asked for, but Apple MPS is not available here")
    return torch.device(name)


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps and mps.is_available())


def seed_everything(seed: int, rank: int = 0) -> int:
    """Seed Python, NumPy and torch (all devices) with `seed + rank`; return that value.

    Ranks get different seeds so their dropout masks and augmentations differ, while a run is
    still reproducible from one number. Data order is seeded separately by the loaders.
    """
    non_negative_int("seed", seed)
    non_negative_int("rank", rank)
    value = seed + rank
    random.seed(value)
    try:
        import numpy as np

        np.random.seed(value % 2**32)
    except ImportError:  # numpy is optional for the library itself
        pass
    torch.manual_seed(value)  # seeds CUDA and MPS generators too
    return value


def quick_mode() -> bool:
    """True when COURSE_QUICK=1: heavy cells use fewer epochs/samples (same code path)."""
    return os.environ.get("COURSE_QUICK", "0").strip().lower() in ("1", "true", "yes", "on")


def pick(normal, quick):
    """`quick` in quick mode, else `normal`: keeps notebook cells free of if/else clutter."""
    return quick if quick_mode() else normal


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in a (torchrun or SLURM) launch; 0/1/0 for plain python."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@contextlib.contextmanager
def torch_threads(n: int):
    """Run the block with torch.set_num_threads(n), then restore the previous count."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _env_int(var: str, default: int) -> int:
    raw = os.environ.get(var, str(default))
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {var} must be an integer; got {raw!r}") from None


def dist_info() -> DistInfo:
    """Read RANK / WORLD_SIZE / LOCAL_RANK as torchrun sets them (defaults: a single process)."""
    info = DistInfo(_env_int("RANK", 0), _env_int("WORLD_SIZE", 1), _env_int("LOCAL_RANK", 0))
    if info.world_size < 1 or not 0 <= info.rank < info.world_size or info.local_rank < 0:
        raise ValueError(f"inconsistent launch environment: RANK={info.rank}, WORLD_SIZE={info.world_size}, "
                         f"LOCAL_RANK={info.local_rank} (need 0 <= RANK < WORLD_SIZE, LOCAL_RANK >= 0)")
    return info


def rank_device() -> torch.device:
    """This process's device inside a process group: cuda:LOCAL_RANK under nccl, else the CPU.

    LOCAL_RANK (set by torchrun and by course_lib's `launch`) numbers the GPUs of one machine; the
    global rank does not: on two nodes of 4 GPUs, rank 5 is LOCAL_RANK 1, so cuda:1. Without
    LOCAL_RANK, the global rank stands in. Either is taken modulo the visible GPUs, so a process
    that sees only its own GPU (SLURM with one GPU per task) gets cuda:0.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_backend() != "nccl":
        return torch.device("cpu")
    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise RuntimeError("the process group uses nccl, but torch sees no CUDA GPU in this process")
    index = _env_int("LOCAL_RANK", -1)
    return torch.device("cuda", (dist.get_rank() if index < 0 else index) % gpus)


def bf16_supported(device: torch.device | str = "cpu") -> bool:
    """Whether bf16 matmuls run on `device` (CPU: always in current torch, maybe slowly)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        a = torch.ones(2, 2, dtype=torch.bfloat16, device=device)
        return bool((a @ a).float().sum().item() == 8.0)
    except (RuntimeError, TypeError):
        return False


def describe() -> dict:
    """Facts about this machine that the course cares about (for `doctor` and notebook 00)."""
    import torchvision

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda_build": torch.version.cuda,
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpus": gpus,
        "mps": _mps_available(),
        "bf16": bf16_supported("cuda" if gpus else "cpu"),
        "default_device": str(get_device("auto")),
        "quick_mode": quick_mode(),
    }


def doctor(out=sys.stdout) -> int:
    """Print an environment report; return 0 if the course can run here, 1 otherwise."""
    from . import data, versions

    problems: list[str] = []
    if sys.version_info < (3, 10):
        problems.append(f"Python {platform.python_version()} is too old: the course needs Python >= 3.10.")
    facts = describe()
    for key, value in facts.items():
        print(f"{key:>15}: {value}", file=out)
    root = data.data_root()
    status = data.find_mnist(root)
    print(f"{'data root':>15}: {root}  (from {'COURSE_DATA_DIR' if os.environ.get('COURSE_DATA_DIR') else 'default'})", file=out)
    if status.ok:
        print(f"{'MNIST':>15}: found ({status.summary})", file=out)
    else:
        problems.append(data.missing_message(root, status.missing))
    versions.report(out)
    if not facts["gpus"]:
        print(f"{'note':>15}: no CUDA GPU: every notebook runs on the CPU; GPU cells say so and fall back.", file=out)
    if problems:
        print("\nThe course cannot run yet:", file=out)
        for p in problems:
            print(f"- {p}", file=out)
        return 1
    print("\nAll good: the course can run on this machine.", file=out)
    return 0
