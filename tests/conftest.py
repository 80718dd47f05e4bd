import atexit
import getpass
import os
import shutil
import struct
import tempfile
from multiprocessing import util as mp_util
from pathlib import Path

import pytest
import torch
from hypothesis import settings


import fork_kernels
from course_lib.data import find_mnist

os.environ.setdefault("TQDM_DISABLE", "1")
# The suite's temporary files go to a folder of its own, removed when the run ends: nbval stops each kernel with
# a kill, so a lecture's atexit cleanup (its work folders) never runs here, nor multiprocessing's. Set once, by
# the first process (the workers, kernels and ranks inherit it). What is kept between runs stays where it was:
# pytest's tmp_path folders (the last runs', for debugging), the browser tests' screenshots and torch
# inductor's compile cache.
if "COURSE_SUITE_TMP" not in os.environ:
    kept = os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(kept, f"torchinductor_{getpass.getuser()}"))
    os.environ["COURSE_SUITE_TMP"] = os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="course-suite-")
    tempfile.tempdir = None
    # removed after multiprocessing removes its own folder inside it (its finalizer, exitpriority -100)
    mp_util.Finalize(None, shutil.rmtree, args=(os.environ["COURSE_SUITE_TMP"],), kwargs={"ignore_errors": True},
                     exitpriority=-101)
KEPT_TMP = Path(os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir())
# The learner's progress record (course_lib.learn.record): the suite's check calls, in this process and in the
# kernels it starts (they inherit it), go to a folder of their own, never the developer's home.
os.environ["COURSE_PROGRESS_DIR"] = tempfile.mkdtemp(prefix="course-progress-")
atexit.register(shutil.rmtree, os.environ["COURSE_PROGRESS_DIR"], ignore_errors=True)

# Under pytest-xdist (make test: -n auto) the workers share the cores: each worker, and the notebook kernels and
# launched ranks it starts (they inherit the variable), gets its share of threads. Without this every process
# runs OpenMP on all cores and their threads spin against each other.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // WORKERS)))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Notebook kernels (nbval's lectures, the exercise runs) forked from a template that imported torch, started with
# the kernel's own environment (after the thread settings above): tests/fork_kernels.py says what acts as in a fresh one.
fork_kernels.install()

# Property tests of the checks (tests/test_checks_*.py): drawn inputs, the same every run (derandomize, no example
# database written into the clone), no per-example deadline (a busy machine is slow, not wrong). Each test says
# its own max_examples where it needs other than this.
settings.register_profile("course", derandomize=True, database=None, deadline=None, max_examples=100,
                          print_blob=True)
settings.load_profile("course")

needs_mnist = pytest.mark.skipif(not find_mnist().ok, reason="MNIST not found: set COURSE_DATA_DIR")


def write_idx(path: Path, array: torch.Tensor) -> None:
    """Write `array` (uint8 images [N,28,28] or labels [N]) as an MNIST IDX file."""
    magic = {3: 2051, 1: 2049}[array.dim()]
    path.write_bytes(struct.pack(">i", magic) + b"".join(struct.pack(">i", d) for d in array.shape)
                     + array.to(torch.uint8).numpy().tobytes())


def fake_mnist(folder: Path, train_labels: torch.Tensor, n_test: int = 16) -> Path:
    """An MNIST folder (MNIST/raw/*-ubyte) with blank images and the given training labels."""
    raw = folder / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for split, labels in (("train", train_labels), ("t10k", torch.arange(n_test) % 10)):
        write_idx(raw / f"{split}-images-idx3-ubyte", torch.zeros(len(labels), 28, 28))
        write_idx(raw / f"{split}-labels-idx1-ubyte", labels)
    return folder


# Resumed and uninterrupted runs end with the same weights: bit for bit on the CPU; on CUDA within
# cuDNN's rounding, since its convolution backward adds in a nondeterministic order (seen on an
# H200: at most 3.9e-6 apart after 3 epochs, once the GPU's RNG was checkpointed too).
RESUME_TOLERANCE = dict(rtol=1e-3, atol=2e-5) if torch.cuda.is_available() else dict(rtol=1e-5, atol=1e-6)


def a_student(exercise: str, wanted) -> str:
    """The first id "student0", "student1", ... whose variant of `exercise` satisfies wanted(values): tests pick
    students by what their variant is, so they hold whatever variants.TERM the instructor sets."""
    from course_lib.grading.variants import variant
    return next(s for s in (f"student{i}" for i in range(10_000)) if wanted(variant(s, exercise)))


def pytest_collection_modifyitems(items):
    """The long files first: notebooks (nbval) and files with a test marked slow. pytest-xdist's loadfile
    hands out whole files in this order, so the workers end together on the short unit-test files instead of
    one waiting for the other's last notebook."""
    long = {item.nodeid.split("::")[0] for item in items
            if item.get_closest_marker("slow") or item.nodeid.split("::")[0].endswith(".ipynb")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in long)


@pytest.fixture(autouse=True)
def suite_environment():
    """Each test starts in the suite's environment: what a test, or the code it called, changed in os.environ is
    put back afterwards (course_lib.frameworks sets KERAS_BACKEND, as a learner's kernel needs). Later tests see
    the suite's, and so do their kernels: only kernels started in it are forked (tests/fork_kernels.py)."""
    def variables():
        return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}   # pytest's, changing per phase
    saved = variables()
    yield
    changed = variables()
    if changed != saved:
        for name in changed.keys() - saved.keys():
            del os.environ[name]
        os.environ.update(saved)


@pytest.fixture
def one_rank_launch(monkeypatch):
    """The environment torchrun gives one process, with a rendezvous store held by this test."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for var, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "RANK": "0", "WORLD_SIZE": "1",
                       "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(var, value)
    yield
    assert not dist.is_initialized(), "train.run left the process group open"


@pytest.fixture
def progress(tmp_path, monkeypatch):
    """A learner's progress record of its own (course_lib.learn.record), recording on: the file's path."""
    from course_lib.learn import record
    monkeypatch.setenv("COURSE_PROGRESS_DIR", str(tmp_path / "p"))
    monkeypatch.delenv("COURSE_PROGRESS", raising=False)
    record._NOTES.clear()
    return tmp_path / "p" / "progress.json"
