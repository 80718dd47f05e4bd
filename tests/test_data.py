"""course_lib.data: TensorLoader, normalize, shards, the data root and the offline failure.

Tiny tensors made here stand in for MNIST wherever possible; samples carry their own index
as the label, so "every sample exactly once" is a check on a list of integers.
"""
import math
import re
import socket
import time
import urllib.error

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import needs_mnist
from course_lib import data
from course_lib.data import (MNISTNotFoundError, ShardStream, TensorLoader, data_root, find_mnist, load_tensors,
                             mnist_dataset, mnist_loaders, normalize, write_shards)


def indexed(n):
    """x[i] = [i, i] (float), y[i] = i: a batch tells which samples it holds."""
    y = torch.arange(n)
    return torch.stack([y, y], 1).float(), y


def epoch_labels(loader):
    return torch.cat([yb for _, yb in loader]).tolist()


# --- TensorLoader ------------------------------------------------------------------------------

@pytest.mark.parametrize("n,bs,expected,expected_drop", [(10, 3, 4, 3), (9, 3, 3, 3), (2, 5, 1, 0), (64, 64, 1, 1)])
def test_tensorloader_len(n, bs, expected, expected_drop):
    x, y = indexed(n)
    assert len(TensorLoader(x, y, batch_size=bs)) == expected == len(list(TensorLoader(x, y, batch_size=bs)))
    dropped = TensorLoader(x, y, batch_size=bs, drop_last=True)
    assert len(dropped) == expected_drop == len(list(dropped))


def test_tensorloader_every_sample_once_per_epoch_and_pairs_kept():
    x, y = indexed(23)
    loader = TensorLoader(x, y, batch_size=5)
    for _ in range(3):
        batches = list(loader)
        assert [len(b[1]) for b in batches] == [5, 5, 5, 5, 3]
        assert sorted(epoch_labels(batches)) == list(range(23))
        for xb, yb in batches:
            assert torch.equal(xb[:, 0].long(), yb) and xb.shape[1:] == (2,)


def test_tensorloader_drop_last_drops_only_the_partial_batch():
    x, y = indexed(23)
    labels = epoch_labels(TensorLoader(x, y, batch_size=5, drop_last=True))
    assert len(labels) == 20 and len(set(labels)) == 20


def test_tensorloader_reshuffles_each_epoch_and_repeats_with_the_same_seed():
    x, y = indexed(50)
    a, b = TensorLoader(x, y, batch_size=8, seed=1), TensorLoader(x, y, batch_size=8, seed=1)
    first, second = epoch_labels(a), epoch_labels(a)
    assert first != second, "a new epoch must bring a new permutation"
    assert first != list(range(50))
    assert [first, second] == [epoch_labels(b), epoch_labels(b)], "same seed, same orders"
    assert epoch_labels(TensorLoader(x, y, batch_size=8, seed=2)) != first


def test_tensorloader_set_epoch_fixes_the_permutation():
    x, y = indexed(40)
    loader = TensorLoader(x, y, batch_size=7, seed=3)
    orders = [epoch_labels(loader) for _ in range(3)]
    loader.set_epoch(1)
    assert epoch_labels(loader) == orders[1]
    loader.set_epoch(0)
    assert epoch_labels(loader) == orders[0]
    other = TensorLoader(x, y, batch_size=7, seed=3)
    other.set_epoch(2)
    assert epoch_labels(other) == orders[2]


def test_tensorloader_without_shuffle_keeps_order():
    x, y = indexed(11)
    assert epoch_labels(TensorLoader(x, y, batch_size=4, shuffle=False)) == list(range(11))


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_tensorloader_device_placement(device):
    x, y = indexed(10)
    loader = TensorLoader(x, y, batch_size=4, device=device)
    for xb, yb in loader:
        assert xb.device.type == "cpu" and yb.device.type == "cpu"
    assert sorted(epoch_labels(loader)) == list(range(10))


def test_tensorloader_single_tensor():
    x, _ = indexed(6)
    batches = list(TensorLoader(x, batch_size=4, shuffle=False))
    assert [len(b) for b in batches] == [1, 1] and torch.equal(batches[0][0], x[:4])


@pytest.mark.parametrize("bs", [0, -1, 2.5, "8", None])
def test_tensorloader_rejects_bad_batch_size(bs):
    x, y = indexed(10)
    with pytest.raises(ValueError, match="batch_size"):
        TensorLoader(x, y, batch_size=bs)


def test_tensorloader_rejects_mismatched_lengths_and_no_tensors():
    x, y = indexed(10)
    with pytest.raises(ValueError, match="same length"):
        TensorLoader(x, y[:9])
    with pytest.raises(ValueError, match="at least one tensor"):
        TensorLoader()


# --- normalize ---------------------------------------------------------------------------------

def test_normalize_matches_torchvision_totensor_normalize():
    from PIL import Image
    from torchvision import transforms

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (3, 28, 28), dtype=torch.uint8, generator=g)
    images[0, 0, :2] = torch.tensor([0, 255], dtype=torch.uint8)  # both ends of the range
    tv = transforms.Compose([transforms.ToTensor(), transforms.Normalize((data.MNIST_MEAN,), (data.MNIST_STD,))])
    expected = torch.stack([tv(Image.fromarray(img.numpy(), mode="L")) for img in images])
    ours = normalize(images)
    assert ours.dtype == torch.float32 and ours.shape == (3, 1, 28, 28)
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-6)
    assert images.dtype == torch.uint8, "the input is left alone"


# --- write_shards / ShardStream ----------------------------------------------------------------

def make_shards(tmp_path, n=23, shard_size=4):
    """Images whose pixels all equal (i % 256), labels i; returns (paths, images, labels)."""
    labels = torch.arange(n)
    images = (labels % 256).to(torch.uint8).view(n, 1, 1).expand(n, 5, 5).contiguous()
    return write_shards(images, labels, tmp_path / "shards", shard_size=shard_size), images, labels


def test_write_shards_files_and_round_trip(tmp_path):
    paths, images, labels = make_shards(tmp_path, n=23, shard_size=4)
    assert len(paths) == math.ceil(23 / 4) and all(p.is_file() for p in paths)
    assert [p.name for p in paths] == sorted(p.name for p in paths), "names sort in write order"
    sizes = [len(torch.load(p, weights_only=True)["labels"]) for p in paths]
    assert sizes == [4, 4, 4, 4, 4, 3]
    stored = torch.load(paths[0], weights_only=True)["images"]
    assert stored.dtype == torch.uint8, "shards keep the compact uint8 form"
    samples = list(ShardStream(paths))
    assert [int(lbl) for _, lbl in samples] == list(range(23)), "no shuffle: file order, sample order"
    torch.testing.assert_close(torch.stack([img for img, _ in samples]), normalize(images))


def loader_labels(stream, num_workers, batch_size=3):
    loader = DataLoader(stream, batch_size=batch_size, num_workers=num_workers)
    return torch.cat([yb for _, yb in loader]).tolist()


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core machine
@pytest.mark.parametrize("num_workers", [0, 2, 3])
@pytest.mark.parametrize("n,shard_size", [(23, 4), (10, 5)])  # 6 shards; 2 shards (fewer than 3 workers)
def test_shardstream_dataloader_workers_read_every_sample_once(tmp_path, num_workers, n, shard_size):
    paths, _, _ = make_shards(tmp_path, n=n, shard_size=shard_size)
    labels = loader_labels(ShardStream(paths), num_workers)
    assert len(labels) == len(set(labels)) == n, f"duplicates or gaps with {num_workers} workers"
    assert sorted(labels) == list(range(n))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shardstream_two_ranks_split_the_data(tmp_path, num_workers):
    paths, _, _ = make_shards(tmp_path, n=23, shard_size=4)
    per_rank = [loader_labels(ShardStream(paths, rank=r, world_size=2, shuffle=True, seed=5), num_workers)
                for r in range(2)]
    assert per_rank[0] and per_rank[1], "both ranks get work"
    assert not set(per_rank[0]) & set(per_rank[1]), "ranks must not share samples"
    assert sorted(per_rank[0] + per_rank[1]) == list(range(23))


def test_shardstream_shuffle_changes_with_set_epoch(tmp_path):
    paths, _, _ = make_shards(tmp_path, n=40, shard_size=5)
    stream = ShardStream(paths, shuffle=True, seed=1)
    first = [int(lbl) for _, lbl in stream]
    assert [int(lbl) for _, lbl in stream] == first, "without set_epoch the order repeats"
    stream.set_epoch(1)
    second = [int(lbl) for _, lbl in stream]
    assert second != first and sorted(second) == sorted(first) == list(range(40))
    assert first != list(range(40))
    again = ShardStream(paths, shuffle=True, seed=1)
    again.set_epoch(1)
    assert [int(lbl) for _, lbl in again] == second, "same seed and epoch, same order"
    # set_epoch reaches a worker: it gets a fresh copy of the dataset with each new iterator
    stream.set_epoch(2)
    in_process = [int(lbl) for _, lbl in stream]
    assert in_process != second and loader_labels(stream, 1) == in_process


def test_fit_trains_on_a_shardstream_dataloader(tmp_path):
    """A DataLoader over an IterableDataset has no len(): fit must still train and advance epochs."""
    from torch import nn

    from course_lib.loop import fit

    paths, _, _ = make_shards(tmp_path, n=40, shard_size=8)
    stream = ShardStream(paths, shuffle=True, seed=0)
    loader = DataLoader(stream, batch_size=8, num_workers=0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(25, 40))
    history = fit(model, loader, epochs=2, lr=1e-2, progress=True, log=None)
    assert len(history.train_loss) == 2 and len(history.step_loss) == 2 * 5
    assert stream.epoch == 1, "fit called set_epoch on the stream each epoch"


def test_shards_bad_inputs(tmp_path):
    images, labels = torch.zeros(4, 2, 2, dtype=torch.uint8), torch.arange(4)
    for bad in (0, -3, 1.5):
        with pytest.raises(ValueError, match="shard_size"):
            write_shards(images, labels, tmp_path, shard_size=bad)
    with pytest.raises(ValueError, match="differ in length"):
        write_shards(images, labels[:3], tmp_path)
    with pytest.raises(ValueError, match="at least one shard"):
        ShardStream([])
    paths = write_shards(images, labels, tmp_path, shard_size=2)
    for rank, world in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(ValueError, match="rank"):
            ShardStream(paths, rank=rank, world_size=world)


# --- data root, offline failure -----------------------------------------------------------------

def test_data_root_follows_course_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    assert data_root() == tmp_path
    monkeypatch.delenv("COURSE_DATA_DIR")
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path / "cache"))
    assert data_root() == tmp_path / "cache" / "data"     # never inside the installed package
    monkeypatch.delenv("COURSE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_root() == tmp_path / "xdg" / "course_lib" / "data"
    status = find_mnist(tmp_path)
    assert not status.ok and len(status.missing) == 4 and "0/4" in status.summary


def assert_helpful(exc_info, root):
    msg = str(exc_info.value)
    assert "COURSE_DATA_DIR" in msg and "MNIST/raw" in msg and str(root) in msg, msg
    assert "t10k-images-idx3-ubyte" in msg
    assert isinstance(exc_info.value, FileNotFoundError)


def test_offline_without_download_fails_fast_with_instructions(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("COURSE_DOWNLOAD", "0")
    t0 = time.perf_counter()
    with pytest.raises(MNISTNotFoundError) as exc_info:
        mnist_dataset("train")
    assert time.perf_counter() - t0 < 5
    assert_helpful(exc_info, tmp_path)
    assert "COURSE_DOWNLOAD=0" in str(exc_info.value)
    with pytest.raises(MNISTNotFoundError, match="COURSE_DOWNLOAD=0"):
        load_tensors("test")                              # the tensor path reads the files itself
    assert not list(tmp_path.iterdir()), "nothing is created when downloads are off"


def test_failed_download_becomes_a_clear_error(monkeypatch, tmp_path):
    import torchvision.datasets.mnist as tv_mnist

    def no_network(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(tv_mnist, "download_and_extract_archive", no_network)
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("COURSE_DOWNLOAD", "1")
    t0 = time.perf_counter()
    with pytest.raises(MNISTNotFoundError) as exc_info:
        mnist_dataset("test")
    assert time.perf_counter() - t0 < 30
    assert_helpful(exc_info, tmp_path)
    assert "download failed" in str(exc_info.value) and "name resolution" in str(exc_info.value)
    assert exc_info.value.__cause__ is None and exc_info.value.__suppress_context__, "no urllib traceback chained"


@pytest.mark.parametrize("error", [socket.gaierror(-2, "Name or service not known"), TimeoutError("timed out")],
                         ids=["dns", "blackhole"])
def test_download_at_socket_level_uses_a_timeout_and_fails_cleanly(monkeypatch, tmp_path, error):
    """No network at all: every connection attempt fails; it must run under the download timeout."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(socket.getdefaulttimeout())
        raise error

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("COURSE_DOWNLOAD", raising=False)
    before = socket.getdefaulttimeout()
    t0 = time.perf_counter()
    with pytest.raises(MNISTNotFoundError) as exc_info:
        mnist_dataset("train")
    assert time.perf_counter() - t0 < 30
    assert_helpful(exc_info, tmp_path)
    assert attempts and all(t == data.DOWNLOAD_TIMEOUT_S for t in attempts), attempts
    assert socket.getdefaulttimeout() == before, "the global socket timeout is restored"


def test_worst_case_offline_wait_is_under_30_seconds(monkeypatch, tmp_path):
    """On a network that silently drops packets every attempt waits the full timeout."""
    attempts = []

    def blackhole(*args, **kwargs):
        attempts.append(socket.getdefaulttimeout())
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", blackhole)
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("COURSE_DOWNLOAD", raising=False)
    with pytest.raises(MNISTNotFoundError):
        mnist_dataset("train")
    assert sum(attempts) < 30, f"{len(attempts)} attempts x {data.DOWNLOAD_TIMEOUT_S} s"


def test_mnist_dataset_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="split"):
        mnist_dataset("validation", root=tmp_path)
    with pytest.raises(ValueError, match="transform"):
        mnist_dataset("train", root=tmp_path, transform="resize")


# --- the real (stand-in) data ------------------------------------------------------------------

@needs_mnist
def test_load_tensors_on_the_data_in_use():
    x, y = load_tensors("train")
    xt, yt = load_tensors("test")
    assert x.shape[1:] == (1, 28, 28) and xt.shape == (10000, 1, 28, 28) and yt.shape == (10000,)
    assert len(x) == len(y) and len(x) in (5000, 60000)  # the 5k stand-in or full MNIST
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert abs(x.mean().item()) < 0.1 and abs(x.std().item() - 1) < 0.1, "normalised with MNIST's mean/std"
    assert sorted(y.unique().tolist()) == list(range(10))


@needs_mnist
def test_load_tensors_limit_and_fresh_copies():
    x, y = load_tensors("test")
    xs, ys = load_tensors("test", limit=100)
    assert xs.shape == (100, 1, 28, 28) and torch.equal(xs, x[:100]) and torch.equal(ys, y[:100])
    xs.zero_()
    ys.zero_()
    x2, y2 = load_tensors("test", limit=100)
    assert torch.equal(x2, x[:100]) and torch.equal(y2, y[:100]), "callers may modify what they get"


@needs_mnist
@pytest.mark.parametrize("limit", [0, -5, 2.5, "100"])
def test_load_tensors_rejects_bad_limit(limit):
    with pytest.raises(ValueError, match="limit"):
        load_tensors("test", limit=limit)


@needs_mnist
def test_dataset_and_tensor_paths_agree():
    ds = mnist_dataset("test")
    x, y = load_tensors("test", limit=3)
    for i in range(3):
        img, label = ds[i]
        torch.testing.assert_close(img, x[i], atol=1e-6, rtol=1e-6)
        assert label == y[i].item()


@needs_mnist
@pytest.mark.parametrize("split", data.SPLITS)
def test_the_idx_reader_gives_torchvisions_tensors(split):
    ds = mnist_dataset(split, transform=None)
    images, labels = data._raw_tensors(split, str(data_root()))
    assert images.dtype == ds.data.dtype and labels.dtype == ds.targets.dtype
    assert torch.equal(images, ds.data) and torch.equal(labels, ds.targets)


@pytest.mark.parametrize("content, message", [
    (b"", "header is empty"),
    (b"\x00\x00\x0d\x01" + (2).to_bytes(4, "big") + bytes(8), "not an MNIST IDX file of unsigned bytes"),
    (b"\x00\x00\x08\x02" + (2).to_bytes(4, "big") * 2 + bytes(4), "not an MNIST IDX file"),
    (b"\x00\x00\x08\x01" + (5).to_bytes(4, "big") + bytes(3), "says [5] (5 bytes) but 3 bytes follow"),
    (b"\x00\x00\x08\x03" + (2).to_bytes(4, "big") * 3 + bytes(9), "truncated or padded"),
], ids=["empty", "float32", "2-D", "short labels", "long images"])
def test_a_broken_idx_file_is_named_with_what_is_wrong(tmp_path, content, message):
    path = tmp_path / "t10k-labels-idx1-ubyte"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(message)) as exc_info:
        data.read_idx(path)
    assert str(path) in str(exc_info.value)


def test_idx_shapes_come_from_the_header(tmp_path):
    path = tmp_path / "images"
    path.write_bytes(b"\x00\x00\x08\x03" + b"".join(n.to_bytes(4, "big") for n in (2, 3, 4)) + bytes(range(24)))
    x = data.read_idx(path)
    assert x.dtype == torch.uint8 and x.shape == (2, 3, 4) and x.flatten().tolist() == list(range(24))


@needs_mnist
def test_mnist_loaders():
    train, test = mnist_loaders(batch_size=32, train_subset=100, seed=0)
    assert train.dataset_size == 100 and len(train) == 4 and train.shuffle
    assert test.dataset_size == 10000 and not test.shuffle and len(test) == 10


def test_shard_inputs_are_checked(tmp_path):
    with pytest.raises(TypeError, match="uint8"):
        write_shards(torch.zeros(4, 28, 28), torch.zeros(4, dtype=torch.long), tmp_path)
    with pytest.raises(TypeError, match="list of shard files"):
        ShardStream(str(tmp_path))
    with pytest.raises(ValueError, match="batch_size"):
        TensorLoader(torch.zeros(4), batch_size=True)


def test_naive_stream_duplicates_across_workers(tmp_path):
    """shard_by_worker=False is the naive IterableDataset: each of 2 workers reads everything."""
    labels = torch.arange(40)
    paths = write_shards(torch.zeros(40, 28, 28, dtype=torch.uint8), labels, tmp_path, shard_size=10)
    seen = [int(y) for _, ys in DataLoader(ShardStream(paths, shard_by_worker=False), batch_size=10, num_workers=2)
            for y in ys]
    assert sorted(seen) == sorted(labels.tolist() * 2)
