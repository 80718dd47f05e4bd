"""course_lib.data_stream and course_lib.shard_server: tar shards streamed over real HTTP.

Tiny shards made here (sample i has label i % 10 and pixels from i), so "every sample exactly once"
is a check on a list of keys. One server per module: starting one takes a fraction of a second.
"""
import io
import random
import tarfile
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from course_lib.data import normalize
from course_lib.data_stream import HTTPShardStream, read_tar_samples, shuffled, write_tar_shards
from course_lib.shard_server import ShardServer

N, SHARD = 40, 5


def tiny(n=N):
    images = (torch.arange(n)[:, None, None] * 3 + torch.arange(28 * 28).view(1, 28, 28)) % 256
    return images.to(torch.uint8), torch.arange(n) % 10


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tar")
    images, labels = tiny()
    paths = write_tar_shards(images, labels, folder, shard_size=SHARD)
    with ShardServer(folder) as server:
        yield server, server.urls(paths), images, labels


def keys_of(loader):
    return sorted(int(k) for _, _, keys in loader for k in keys)


def test_tar_shards_follow_webdataset_layout(tmp_path):
    images, labels = tiny(7)
    paths = write_tar_shards(images, labels, tmp_path, shard_size=3)
    assert [p.name for p in paths] == ["shard-00000.tar", "shard-00001.tar", "shard-00002.tar"]
    with tarfile.open(paths[1]) as tar:
        assert tar.getnames() == ["000003.npy", "000003.cls", "000004.npy", "000004.cls", "000005.npy", "000005.cls"]
        assert tar.extractfile("000004.cls").read() == b"4"
        assert np.array_equal(np.load(io.BytesIO(tar.extractfile("000004.npy").read())), images[4].numpy())
    with open(paths[2], "rb") as f:
        (key, image, label), = read_tar_samples(f)
    assert key == 6 and label == 6 and torch.equal(image, images[6])


def test_tar_reader_rejects_incomplete_samples(tmp_path):
    path = tmp_path / "bad.tar"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("000001.cls")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"3"))
    with open(path, "rb") as f, pytest.raises(ValueError, match="000001.*bad.tar.*expected"):
        list(read_tar_samples(f, source="bad.tar"))


@pytest.mark.parametrize("kwargs, match", [
    (dict(shard_size=0), "shard_size"),
    (dict(images=torch.zeros(2, 28, 28)), "uint8"),
    (dict(labels=torch.zeros(3)), "differ in length"),
])
def test_write_tar_shards_rejects_bad_arguments(tmp_path, kwargs, match):
    images, labels = tiny(2)
    args = dict(images=images, labels=labels, out_dir=tmp_path, shard_size=1) | kwargs
    with pytest.raises((ValueError, TypeError), match=match):
        write_tar_shards(**args)


def test_streamed_samples_equal_the_tensors_in_memory(shards):
    _, urls, images, labels = shards
    got = sorted(HTTPShardStream(urls, shuffle_buffer=7, with_keys=True), key=lambda s: int(s[2]))
    assert [int(k) for _, _, k in got] == list(range(N))
    assert torch.equal(torch.stack([x for x, _, _ in got]), normalize(images))
    assert torch.equal(torch.stack([y for _, y, _ in got]), labels)
    x, y = next(iter(HTTPShardStream(urls)))
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64


@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_once_per_epoch_with_workers(shards, workers):
    _, urls, _, _ = shards
    stream = HTTPShardStream(urls, shuffle_buffer=8, with_keys=True)
    loader = DataLoader(stream, batch_size=4, num_workers=workers)
    assert keys_of(loader) == list(range(N))
    stream.set_epoch(1)
    assert keys_of(loader) == list(range(N))


def test_ranks_split_the_shards(shards):
    _, urls, _, _ = shards
    per_rank = [keys_of(DataLoader(HTTPShardStream(urls, shuffle_buffer=4, rank=r, world_size=3, with_keys=True),
                                   batch_size=4)) for r in range(3)]
    assert sorted(sum(per_rank, [])) == list(range(N))
    assert [len(k) for k in per_rank] == [15, 15, 10]          # 8 shards of 5 dealt to 3 readers
    assert all(len({k // SHARD for k in keys}) * SHARD == len(keys) for keys in per_rank), "whole shards"


def test_shuffle_changes_with_epoch_and_buffer_one_keeps_order(shards):
    _, urls, _, _ = shards
    stream = HTTPShardStream(urls, shuffle_buffer=16, seed=1, with_keys=True)
    epoch0 = [int(k) for _, _, k in stream]
    stream.set_epoch(1)
    epoch1 = [int(k) for _, _, k in stream]
    assert sorted(epoch0) == sorted(epoch1) == list(range(N)) and epoch0 != epoch1
    assert epoch0 == [int(k) for _, _, k in HTTPShardStream(urls, shuffle_buffer=16, seed=1, with_keys=True)]
    assert [int(k) for _, _, k in HTTPShardStream(urls, with_keys=True)] == list(range(N))


def test_shuffle_buffer_is_a_permutation():
    items = list(range(100))
    out = list(shuffled(iter(items), 10, random.Random(0)))
    assert sorted(out) == items and out != items
    assert list(shuffled(iter(items), 1, random.Random(0))) == items
    assert max(abs(i - pos) for pos, i in enumerate(out)) < 60, "a buffer of 10 only mixes locally"


def test_missing_shard_names_its_url(shards):
    server, urls, _, _ = shards
    missing = server.base_url + "shard-99999.tar"
    with pytest.raises(FileNotFoundError, match=f"shard not found: {missing}"):
        list(HTTPShardStream(urls[:1] + [missing]))


def test_unreachable_server_names_the_url(tmp_path):
    server = ShardServer(tmp_path)
    url = server.url("shard-00000.tar")
    server.close()
    assert not server.running
    with pytest.raises(ConnectionError, match=f"cannot reach shard {url}"):
        next(iter(HTTPShardStream([url])))


def test_server_adds_latency_per_request(tmp_path):
    images, labels = tiny(2)
    paths = write_tar_shards(images, labels, tmp_path, shard_size=1)
    with ShardServer(tmp_path, latency_ms=50) as server:
        t0 = time.perf_counter()
        assert len(list(HTTPShardStream(server.urls(paths)))) == 2
        assert time.perf_counter() - t0 >= 0.1      # two requests, each held back 50 ms (a lower bound only)
    assert not server.running and "stopped" in repr(server)


@pytest.mark.parametrize("kwargs, match", [
    (dict(urls="http://x/a.tar"), "list of shard URLs"),
    (dict(urls=[]), "at least one"),
    (dict(shuffle_buffer=0), "shuffle_buffer"),
    (dict(rank=2, world_size=2), "rank"),
    (dict(world_size=0), "world_size"),
])
def test_stream_rejects_bad_arguments(kwargs, match):
    args = dict(urls=["http://127.0.0.1:1/a.tar"]) | kwargs
    with pytest.raises((ValueError, TypeError), match=match):
        HTTPShardStream(**args)


def test_server_rejects_bad_arguments(tmp_path):
    with pytest.raises(NotADirectoryError, match="directory"):
        ShardServer(tmp_path / "nope")
    with pytest.raises(ValueError, match="latency_ms"):
        ShardServer(tmp_path, latency_ms=-1)


def test_server_urls_from_names_and_paths(tmp_path):
    with ShardServer(tmp_path) as server:
        assert server.url("a b.tar") == server.url(tmp_path / "a b.tar") == server.base_url + "a%20b.tar"
        with pytest.raises(ValueError, match="inside the served folder"):
            server.url(tmp_path.parent / "elsewhere.tar")
