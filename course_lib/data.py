"""MNIST for the course: where it lives, three ways to feed it to a model.

1. `mnist_dataset` — torchvision's MNIST with per-sample ToTensor/Normalize: the classic
   DataLoader path (flexible, but every sample goes through Python).
2. `TensorLoader` — the whole split as one normalised tensor, sliced into batches: no
   per-sample work at all, optionally resident on the GPU (MNIST: 188 MB as float32, 47 MB as uint8).
3. `ShardStream` — an IterableDataset over shard files on disk, for data larger than
   memory; each DataLoader worker (and each distributed rank) reads its own shards.

The data root is `$COURSE_DATA_DIR`, else `data/` in the cache (`cache_dir()`). Where files are missing the
loader downloads them unless COURSE_DOWNLOAD=0; offline it fails fast and says what to do.
"""
from __future__ import annotations

import functools
import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .validate import positive_int

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
RAW_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
SPLITS = tuple(RAW_FILES)
DOWNLOAD_TIMEOUT_S = 10  # per connection; torchvision tries two mirrors


class MNISTNotFoundError(FileNotFoundError):
    """MNIST is not on disk and could not be downloaded; the message says how to fix it."""


def cache_dir() -> Path:
    """Where course_lib keeps what it downloads or computes once: $COURSE_CACHE_DIR, else
    $XDG_CACHE_HOME/course_lib, else ~/.cache/course_lib (never inside the installed package)."""
    if os.environ.get("COURSE_CACHE_DIR"):
        return Path(os.environ["COURSE_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "course_lib"


def data_root() -> Path:
    """`$COURSE_DATA_DIR` if set, else `data/` in the cache (`make lab`/`make test` set it to the clone's data/)."""
    env = os.environ.get("COURSE_DATA_DIR")
    return Path(env).expanduser() if env else cache_dir() / "data"


def _resolve_root(root) -> Path:
    return Path(root).expanduser() if root is not None else data_root()


@dataclass(frozen=True)
class MNISTStatus:
    ok: bool
    missing: tuple[str, ...]
    summary: str


def find_mnist(root=None) -> MNISTStatus:
    """Which of the four raw MNIST files torchvision needs exist under `root`."""
    raw = _resolve_root(root) / "MNIST" / "raw"
    names = [n for pair in RAW_FILES.values() for n in pair]
    missing = tuple(n for n in names if not (raw / n).is_file())
    summary = f"{len(names) - len(missing)}/{len(names)} raw files in {raw}"
    return MNISTStatus(not missing, missing, summary)


def missing_message(root, missing) -> str:
    raw = _resolve_root(root) / "MNIST" / "raw"
    return (
        f"MNIST was not found under {_resolve_root(root)} (missing: {', '.join(missing)}).\n"
        "  Either connect to the internet once (the course downloads it on first use), or copy the\n"
        "  four uncompressed MNIST files into this layout and point COURSE_DATA_DIR at the top folder:\n"
        f"    $COURSE_DATA_DIR/MNIST/raw/train-images-idx3-ubyte   (and train-labels-idx1-ubyte,\n"
        f"    $COURSE_DATA_DIR/MNIST/raw/t10k-images-idx3-ubyte     t10k-labels-idx1-ubyte)\n"
        f"  e.g. `export COURSE_DATA_DIR=/path/to/folder` (currently looking in {raw})."
    )


def _download_allowed() -> bool:
    return os.environ.get("COURSE_DOWNLOAD", "1").strip().lower() not in ("0", "false", "no", "off")


def mnist_dataset(split: str = "train", root=None, transform="normalize"):
    """torchvision's MNIST for `split` ("train" or "test"), downloading if allowed.

    transform: "normalize" (ToTensor + Normalize, the classic recipe), None (PIL images) or
    any callable. Raises MNISTNotFoundError with instructions when the files cannot be had.
    """
    from torchvision import datasets, transforms

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}; got {split!r}")
    if isinstance(transform, str):
        if transform != "normalize":
            raise ValueError(f"transform must be 'normalize', None or a callable; got {transform!r}")
        transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))])
    root = _resolve_root(root)
    status = find_mnist(root)
    if not status.ok:
        _download(root, status.missing)
    return datasets.MNIST(str(root), train=(split == "train"), transform=transform, download=False)


def _download(root: Path, missing) -> None:
    """Download through torchvision with a socket timeout, so an offline machine fails in seconds."""
    from torchvision import datasets

    if not _download_allowed():
        raise MNISTNotFoundError(missing_message(root, missing) + "\n  (COURSE_DOWNLOAD=0: not downloading.)")
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        root.mkdir(parents=True, exist_ok=True)
        datasets.MNIST(str(root), train=True, download=True)
    except Exception as exc:  # urllib, DNS and torchvision errors all mean the same thing here
        reason = [line.strip() for line in str(exc).splitlines() if line.strip() not in ("", ")")]
        raise MNISTNotFoundError(
            missing_message(root, missing) + f"\n  (download failed: {reason[-1] if reason else type(exc).__name__})"
        ) from None
    finally:
        socket.setdefaulttimeout(old)


def normalize(images_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 [N, 28, 28] -> float32 [N, 1, 28, 28], scaled as ToTensor + Normalize would."""
    return ((images_uint8.float() / 255.0) - MNIST_MEAN).div_(MNIST_STD).unsqueeze(1)


def read_idx(path) -> torch.Tensor:
    """One MNIST file in the IDX format as a uint8 tensor: a big-endian header (two zero bytes, the type
    0x08 for unsigned bytes, the number of dimensions), one 4-byte size per dimension, then the bytes.

    What torchvision's MNIST reads too, without importing torchvision (seconds per process: it loads
    torch._dynamo through its detection ops) in every training run and launched rank.
    """
    data = Path(path).read_bytes()
    ndim = data[3] if len(data) >= 4 else 0
    if data[:3] != b"\x00\x00\x08" or ndim not in (1, 3) or len(data) < 4 + 4 * ndim:
        raise ValueError(f"{path} is not an MNIST IDX file of unsigned bytes (its header is {data[:4].hex() or 'empty'})")
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    body = 4 + 4 * ndim
    if len(data) - body != math.prod(shape):
        raise ValueError(f"{path} is truncated or padded: its header says {shape} ({math.prod(shape):,} bytes) "
                         f"but {len(data) - body:,} bytes follow")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8, offset=body).view(shape)


@functools.lru_cache(maxsize=4)
def _raw_tensors(split: str, root: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(images uint8 [N, 28, 28], labels int64 [N]) of `split`: the same tensors as torchvision's MNIST
    `.data` and `.targets` (tests/test_data.py compares them)."""
    status = find_mnist(root)
    if not status.ok:
        _download(Path(root), status.missing)
    raw = Path(root) / "MNIST" / "raw"
    images_file, labels_file = RAW_FILES[split]
    images, labels = read_idx(raw / images_file), read_idx(raw / labels_file)
    if images.dim() != 3 or labels.dim() != 1 or len(images) != len(labels):
        raise ValueError(f"{raw}: {images_file} and {labels_file} do not match: images {list(images.shape)}, "
                         f"labels {list(labels.shape)}")
    return images, labels.long()


def load_tensors(split: str = "train", root=None, limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole split as (images float32 [N,1,28,28] normalised, labels int64 [N]).

    limit: keep the first `limit` samples (MNIST's files are not sorted by class).
    Read once per process and cached; callers get fresh tensors they may modify.
    """
    positive_int("limit", limit, allow_none=True)
    images, labels = _raw_tensors(split, str(_resolve_root(root)))
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    return normalize(images), labels.clone()


class TensorLoader:
    """Batches sliced from tensors already in memory, with DataLoader semantics.

    Iterating yields (x, y) batches; `len()` is the number of batches; each new iteration is a
    new epoch with a fresh permutation (from `seed`, so runs repeat). With `device` the tensors
    are moved there once, so a training step does no host-to-device copy at all.
    """

    def __init__(self, *tensors: torch.Tensor, batch_size: int = 64, shuffle: bool = True,
                 drop_last: bool = False, device=None, seed: int = 0):
        if not tensors:
            raise ValueError("TensorLoader needs at least one tensor")
        n = len(tensors[0])
        if any(len(t) != n for t in tensors):
            raise ValueError(f"all tensors must have the same length; got {[len(t) for t in tensors]}")
        positive_int("batch_size", batch_size)
        self.tensors = tuple(t.to(device) for t in tensors) if device is not None else tensors
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.seed, self.epoch = seed, 0
        self.dataset_size = n

    def __len__(self) -> int:
        if self.drop_last:
            return self.dataset_size // self.batch_size
        return math.ceil(self.dataset_size / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Fix the permutation of the next iteration (as DistributedSampler.set_epoch does)."""
        self.epoch = epoch

    def __iter__(self):
        device = self.tensors[0].device
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.dataset_size, generator=g).to(device)
        else:
            order = None
        self.epoch += 1
        for b in range(len(self)):
            sl = slice(b * self.batch_size, (b + 1) * self.batch_size)
            if order is None:
                yield tuple(t[sl] for t in self.tensors)
            else:
                idx = order[sl]
                yield tuple(t[idx] for t in self.tensors)


def mnist_loaders(batch_size: int = 64, root=None, train_subset: int | None = None, device=None,
                  seed: int = 0, test_batch_size: int = 1000) -> tuple[TensorLoader, TensorLoader]:
    """Tensor-resident (train, test) loaders: the course's default way to feed MNIST."""
    x, y = load_tensors("train", root, train_subset)
    xt, yt = load_tensors("test", root)
    train = TensorLoader(x, y, batch_size=batch_size, shuffle=True, device=device, seed=seed)
    test = TensorLoader(xt, yt, batch_size=test_batch_size, shuffle=False, device=device)
    return train, test


# --- streaming from shards: data larger than memory -------------------------------------------

def write_shards(images: torch.Tensor, labels: torch.Tensor, out_dir, shard_size: int = 1000) -> list[Path]:
    """Split (uint8 images [N,...], labels [N]) into files of `shard_size` samples each.

    Stored as uint8 (4x smaller than float32); normalised on the fly when read.
    """
    positive_int("shard_size", shard_size)
    if images.dtype != torch.uint8:
        raise TypeError(f"images must be uint8 raw pixels (ShardStream normalises when reading); got {images.dtype}")
    if len(images) != len(labels):
        raise ValueError(f"images and labels differ in length: {len(images)} vs {len(labels)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, start in enumerate(range(0, len(images), shard_size)):
        path = out / f"shard-{i:05d}.pt"
        torch.save({"images": images[start:start + shard_size].clone(),
                    "labels": labels[start:start + shard_size].clone()}, path)
        paths.append(path)
    return paths


class ShardStream(IterableDataset):
    """Stream (image, label) samples from shard files, never holding more than one shard.

    Shards are dealt round-robin to the `world_size * num_workers` readers (this rank's
    DataLoader workers included), so every sample is read exactly once per epoch with any
    number of workers. With `shuffle`, shard order and the order inside each shard change with
    `set_epoch` (call it each epoch, as with DistributedSampler). `shard_by_worker=False` is the
    naive IterableDataset that every worker reads in full: notebook 03 shows its duplicates.
    """

    def __init__(self, paths, shuffle: bool = False, seed: int = 0, rank: int = 0, world_size: int = 1,
                 shard_by_worker: bool = True):
        if isinstance(paths, (str, Path)):
            raise TypeError("paths must be a list of shard files (as write_shards returns), not a single path")
        self.paths = [Path(p) for p in paths]
        if not self.paths:
            raise ValueError("ShardStream needs at least one shard path")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}); got {rank}")
        self.shuffle, self.seed, self.rank, self.world_size = shuffle, seed, rank, world_size
        self.shard_by_worker = shard_by_worker
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _my_shards(self) -> list[Path]:
        info = get_worker_info()
        workers, worker_id = (info.num_workers, info.id) if info and self.shard_by_worker else (1, 0)
        reader, readers = self.rank * workers + worker_id, self.world_size * workers
        order = list(range(len(self.paths)))
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(len(order), generator=g).tolist()
        return [self.paths[i] for i in order[reader::readers]]

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch + 1)
        for path in self._my_shards():
            shard = torch.load(path, weights_only=True)
            images, labels = normalize(shard["images"]), shard["labels"]
            order = torch.randperm(len(labels), generator=g) if self.shuffle else range(len(labels))
            for i in order:
                yield images[i], labels[i]


# MNIST's training set has these many images of each digit; the offline stand-ins have 500 each (5k)
# and 6,000 each (the same 5k in 12 pixel-shifted copies: right size for timing, not for accuracy).
MNIST_TRAIN_CLASS_COUNTS = (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949)


def training_set_name(root=None) -> str:
    """What the training split at `root` is, judged by its digits' counts (never by its size alone)."""
    labels = _train_labels(str(_resolve_root(root)))
    counts = tuple(torch.bincount(labels, minlength=10).tolist())
    if counts == MNIST_TRAIN_CLASS_COUNTS:
        return "full MNIST"
    if set(counts) == {500}:
        return "offline 5k stand-in"
    if set(counts) == {6000}:
        return "60k stand-in: the 5k stand-in in 12 shifted copies, for run time only, not accuracy"
    return "an MNIST-format set, not MNIST (its digit counts differ)"


def data_label(n_used: int, n_split: int, root=None) -> str:
    """Which training data a figure comes from: "5,000 training images (offline 5k stand-in)",
    "1,000 of the 60,000 training images (full MNIST)".

    The name comes from the training split at `root` (default: `data_root()`): `training_set_name`.
    """
    source = training_set_name(root)
    if n_used < n_split:
        return f"{n_used:,} of the {n_split:,} training images ({source})"
    return f"{n_used:,} training images ({source})"


def train_split_size(root=None) -> int:
    """How many images the training split at `root` holds (5,000 for the stand-in, 60,000 for MNIST)."""
    return len(_train_labels(str(_resolve_root(root))))


@functools.lru_cache(maxsize=8)
def _train_labels(root: str) -> torch.Tensor:
    # data_label and train_split_size are called together: read the split once per folder (not through
    # torchvision, whose import costs seconds: every lecture, kernel and training run asks for the split's size)
    return _raw_tensors("train", root)[1]
