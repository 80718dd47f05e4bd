"""Streaming tar shards over HTTP: datasets too big, and too changeable, for one disk.

Large training sets live in an object store as many **tar shards** — the format of WebDataset,
torchdata and Hugging Face `datasets` streaming: plain POSIX tar files whose members
`000123.npy` and `000123.cls` (same key, different extension) make up one sample. A tar file can
be read front to back as it arrives, so a trainer streams shards over HTTP without downloading
the set first, and adding data means uploading more shards.

    paths = write_tar_shards(images_uint8, labels, folder, shard_size=500)
    with ShardServer(folder) as server:                       # course_lib.shard_server
        stream = HTTPShardStream(server.urls(paths), shuffle_buffer=1000)
        loader = DataLoader(stream, batch_size=64, num_workers=2)

`HTTPShardStream` deals whole shards to the `world_size x num_workers` readers (as
`course_lib.data.ShardStream` does with files), so every sample arrives exactly once per epoch;
a shard count that is not a multiple of the readers leaves some readers with one shard more.
"""
from __future__ import annotations

import io
import random
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .data import normalize
from .validate import is_int, non_negative_int, positive_int

KEY_DIGITS = 6          # sample keys 000000 ... 999999, as in WebDataset's examples
HTTP_TIMEOUT_S = 30     # per request: a dead server fails a read instead of hanging it


def write_tar_shards(images: torch.Tensor, labels: torch.Tensor, out_dir, shard_size: int = 1000) -> list[Path]:
    """Write uint8 images [N, H, W] and labels [N] as tar shards of `shard_size` samples.

    Sample i becomes two members: `{i:06d}.npy` (the uint8 image in NumPy's .npy format) and
    `{i:06d}.cls` (the label as decimal text), WebDataset's convention. Returns the shard paths.
    """
    positive_int("shard_size", shard_size)
    if images.dtype != torch.uint8:
        raise TypeError(f"images must be uint8 raw pixels (the stream normalises when reading); got {images.dtype}")
    if len(images) != len(labels):
        raise ValueError(f"images and labels differ in length: {len(images)} vs {len(labels)}")
    if len(images) > 10 ** KEY_DIGITS:
        raise ValueError(f"at most {10 ** KEY_DIGITS:,} samples fit {KEY_DIGITS}-digit keys; got {len(images):,}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    array, targets = images.numpy(), labels.tolist()
    paths = []
    for s, start in enumerate(range(0, len(images), shard_size)):
        path = out / f"shard-{s:05d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:   # POSIX.1-1988 tar
            for i in range(start, min(start + shard_size, len(images))):
                buffer = io.BytesIO()
                np.save(buffer, array[i])
                _add(tar, f"{i:0{KEY_DIGITS}d}.npy", buffer.getvalue())
                _add(tar, f"{i:0{KEY_DIGITS}d}.cls", str(int(targets[i])).encode())
        paths.append(path)
    return paths


def _add(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


def read_tar_samples(fileobj, source: str = "shard"):
    """Yield (key, uint8 image tensor, label) from a tar stream read front to back (no seeking).

    Members with the same key (the name up to the first dot) are one sample, WebDataset's rule.
    """
    with tarfile.open(fileobj=fileobj, mode="r|") as tar:
        key, parts = None, {}
        for member in tar:
            if not member.isfile():
                continue
            name_key, _, ext = member.name.rpartition("/")[2].partition(".")
            if name_key != key:
                if key is not None:
                    yield _decode(key, parts, source)
                key, parts = name_key, {}
            parts[ext] = tar.extractfile(member).read()
        if key is not None:
            yield _decode(key, parts, source)


def _decode(key: str, parts: dict, source: str):
    if set(parts) != {"npy", "cls"}:
        raise ValueError(f"sample {key!r} in {source} has members {sorted(parts)}; expected ['cls', 'npy']")
    image = torch.from_numpy(np.load(io.BytesIO(parts["npy"])))
    return int(key), image, int(parts["cls"])


def open_url(url: str):
    """urllib's response for `url` (a file-like object to stream from); a clear error naming the URL."""
    try:
        return urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise FileNotFoundError(f"shard not found: {url} (HTTP 404 from the server)") from None
        raise OSError(f"shard {url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise ConnectionError(f"cannot reach shard {url}: {exc.reason}") from None


def shuffled(samples, buffer_size: int, rng: random.Random):
    """Shuffle a stream with a buffer of `buffer_size`: yield a random buffered sample per new one.

    The order is random within about `buffer_size` samples; 1 keeps the stream's order.
    """
    buffer = []
    for sample in samples:
        if len(buffer) < buffer_size:
            buffer.append(sample)
            continue
        j = rng.randrange(buffer_size)
        yield buffer[j]
        buffer[j] = sample
    rng.shuffle(buffer)
    yield from buffer


class HTTPShardStream(IterableDataset):
    """Stream normalised (image [1,28,28] float32, label int64) samples from tar shard URLs.

    Each reader — DataLoader worker `w` of rank `r`, reader `r * num_workers + w` — opens only its
    own shards (every `world_size * num_workers`-th one), reads each as it arrives over HTTP, and
    shuffles samples through a buffer of `shuffle_buffer`; a buffer above 1 also shuffles the
    shard list, the same way for every reader, anew each epoch. `with_keys=True` adds each
    sample's key (its index when written) as a third item, so a test can tell exactly which
    samples arrived. Call `set_epoch` every epoch (`course_lib.loop.fit` does).
    """

    def __init__(self, urls, shuffle_buffer: int = 1, seed: int = 0, rank: int = 0, world_size: int = 1,
                 with_keys: bool = False):
        if isinstance(urls, str):
            raise TypeError("urls must be a list of shard URLs (as ShardServer.urls returns), not one string")
        self.urls = list(urls)
        if not self.urls:
            raise ValueError("HTTPShardStream needs at least one shard URL")
        positive_int("shuffle_buffer", shuffle_buffer)
        non_negative_int("seed", seed)
        positive_int("world_size", world_size)
        if not (is_int(rank) and 0 <= rank < world_size):
            raise ValueError(f"rank must be an int in [0, world_size={world_size}); got {rank!r}")
        self.shuffle_buffer, self.seed, self.rank, self.world_size = shuffle_buffer, seed, rank, world_size
        self.with_keys, self.epoch = with_keys, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = non_negative_int("epoch", epoch)

    def _reader(self) -> tuple[int, int]:
        """(this reader's number, how many readers): DataLoader workers of all ranks together."""
        info = get_worker_info()
        workers, worker_id = (info.num_workers, info.id) if info else (1, 0)
        return self.rank * workers + worker_id, self.world_size * workers

    def my_urls(self) -> list[str]:
        """The shards this reader (this rank, this DataLoader worker) reads this epoch."""
        reader, readers = self._reader()
        order = list(range(len(self.urls)))
        if self.shuffle_buffer > 1:   # all readers draw the same shard order, then take their share
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return [self.urls[i] for i in order[reader::readers]]

    def _samples(self):
        for url in self.my_urls():
            with open_url(url) as response:
                yield from read_tar_samples(response, source=url)

    def __iter__(self):
        reader, _ = self._reader()
        rng = random.Random((self.seed * 1_000_003 + self.epoch) * 65_537 + reader)   # differs per reader and epoch
        for key, image, label in shuffled(self._samples(), self.shuffle_buffer, rng):
            x, y = normalize(image[None])[0], torch.tensor(label)
            yield (x, y, torch.tensor(key)) if self.with_keys else (x, y)

