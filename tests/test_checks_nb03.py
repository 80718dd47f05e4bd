"""The lecture-03 checks pass the reference solutions and fail stubs and plausible wrong answers."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from course_lib.checks.nb03 import check_batches, check_shard_for_worker
from nbtools import ROOT, notebook_namespace

NS = notebook_namespace(ROOT / "solutions" / "03_data_loading_exercises.ipynb")


def stub(*args, **kwargs):
    raise NotImplementedError()


# --- shard_for_worker --------------------------------------------------------------------------

def everyone_reads_everything(n, workers, worker_id):
    return list(range(n))


def drops_the_remainder(n, workers, worker_id):
    size = n // workers
    return list(range(worker_id * size, (worker_id + 1) * size))


def overlapping_blocks(n, workers, worker_id):
    size = math.ceil(n / workers)
    start = worker_id * (n // workers)
    return list(range(start, min(start + size, n)))


def unbalanced_blocks(n, workers, worker_id):
    if not 0 <= worker_id < workers:
        raise ValueError("worker_id")
    size = math.ceil(n / workers)
    return list(range(worker_id * size, min((worker_id + 1) * size, n)))


def no_argument_check(n, workers, worker_id):
    return list(range(worker_id, n, workers))


def test_shard_reference_passes(capsys):
    check_shard_for_worker(NS["shard_for_worker"])
    assert "all checks passed" in capsys.readouterr().out


def test_shard_stub_fails():
    with pytest.raises(NotImplementedError):
        check_shard_for_worker(stub)


@pytest.mark.parametrize("wrong,message", [
    (everyone_reads_everything, "every worker reads every index"),
    (drops_the_remainder, "indices \\[9\\] are read by no worker.*the remainder 10 % 3"),
    (overlapping_blocks, "indices \\[3, 6\\] are read more than once \\(3 by workers \\[0, 1\\]"),
    (unbalanced_blocks, "unbalanced"),
    (no_argument_check, "ValueError"),
], ids=lambda v: getattr(v, "__name__", v))
def test_shard_wrong_answers_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_shard_for_worker(wrong)


# --- batches -----------------------------------------------------------------------------------

def no_shuffle(x, y, batch_size, generator):
    for s in range(0, len(x), batch_size):
        yield x[s:s + batch_size], y[s:s + batch_size]


def drops_last(x, y, batch_size, generator):
    perm = torch.randperm(len(x), generator=generator)
    for s in range(0, len(x) - batch_size + 1, batch_size):
        idx = perm[s:s + batch_size]
        yield x[idx], y[idx]


def two_permutations(x, y, batch_size, generator):
    px, py = torch.randperm(len(x), generator=generator), torch.randperm(len(y), generator=generator)
    for s in range(0, len(x), batch_size):
        yield x[px[s:s + batch_size]], y[py[s:s + batch_size]]


def global_rng(x, y, batch_size, generator):
    perm = torch.randperm(len(x))
    for s in range(0, len(x), batch_size):
        yield x[perm[s:s + batch_size]], y[perm[s:s + batch_size]]


def sampling_with_replacement(x, y, batch_size, generator):
    idx_all = torch.randint(0, len(x), (len(x),), generator=generator)
    for s in range(0, len(x), batch_size):
        idx = idx_all[s:s + batch_size]
        yield x[idx], y[idx]


def blocks_shuffled_inside(x, y, batch_size, generator):
    for s in range(0, len(x), batch_size):
        idx = s + torch.randperm(min(batch_size, len(x) - s), generator=generator)
        yield x[idx], y[idx]


def _block_starts(n, batch_size, generator):
    """Full blocks in a random order, the partial block last (as the batch sizes must be)."""
    full = n // batch_size
    starts = (torch.randperm(full, generator=generator) * batch_size).tolist()
    return starts + ([full * batch_size] if n % batch_size else [])


def block_order_shuffled(x, y, batch_size, generator):
    for s in _block_starts(len(x), batch_size, generator):
        yield x[s:s + batch_size], y[s:s + batch_size]


def both_levels_of_blocks(x, y, batch_size, generator):
    for s in _block_starts(len(x), batch_size, generator):
        idx = s + torch.randperm(min(batch_size, len(x) - s), generator=generator)
        yield x[idx], y[idx]


def reseeds_every_epoch(x, y, batch_size, generator):
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(generator.initial_seed()))
    for s in range(0, len(x), batch_size):
        yield x[perm[s:s + batch_size]], y[perm[s:s + batch_size]]


def fixed_seed_inside(x, y, batch_size, generator):
    generator.manual_seed(0)                      # "for reproducibility": every epoch the same order
    perm = torch.randperm(len(x), generator=generator)
    for s in range(0, len(x), batch_size):
        yield x[perm[s:s + batch_size]], y[perm[s:s + batch_size]]


def test_batches_reference_passes(capsys):
    check_batches(NS["batches"])
    assert "all checks passed" in capsys.readouterr().out


def test_batches_stub_fails():
    with pytest.raises(NotImplementedError):
        check_batches(stub)


@pytest.mark.parametrize("wrong,message", [
    (no_shuffle, "stored order"),
    (drops_last, "partial batch"),
    (two_permutations, "SAME permutation"),
    (global_rng, "generator"),
    (sampling_with_replacement, "twice"),
    (blocks_shuffled_inside, "consecutive samples"),
    (block_order_shuffled, "consecutive samples"),
    (both_levels_of_blocks, "consecutive samples"),
    (reseeds_every_epoch, "set_epoch"),
    (fixed_seed_inside, "different seeds"),
], ids=lambda v: getattr(v, "__name__", v))
def test_batches_wrong_answers_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_batches(wrong)


def test_check_batches_leaves_the_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    check_batches(NS["batches"])
    assert torch.equal(torch.rand(3), expected)


def argsort_of_random_keys(x, y, batch_size, generator):
    perm = torch.rand(len(x), generator=generator).argsort()
    for s in range(0, len(x), batch_size):
        yield x[perm][s:s + batch_size], y[perm][s:s + batch_size]


def returns_a_list(x, y, batch_size, generator):
    perm = torch.randperm(len(x), generator=generator)
    return [(x[i], y[i]) for i in perm.split(batch_size)]


@pytest.mark.parametrize("right", [argsort_of_random_keys, returns_a_list])
def test_batches_other_right_answers_pass(right):
    check_batches(right)


def balanced_contiguous_blocks(n, workers, worker_id):
    if workers < 1 or not 0 <= worker_id < workers:
        raise ValueError(f"bad worker_id {worker_id} of {workers}")
    return list(range(worker_id * n // workers, (worker_id + 1) * n // workers))


def test_shard_other_right_answer_passes():
    check_shard_for_worker(balanced_contiguous_blocks)


# --- every input the text allows, and messages that name what the answer did (issue 34) ----------------------

def validated(rule):
    """Round-robin after the argument check `rule(workers, worker_id)` (True: accept)."""
    def shard_for_worker(n, workers, worker_id):
        if not rule(workers, worker_id):
            raise ValueError("bad arguments")
        return list(range(worker_id, n, workers))
    return shard_for_worker


def asserts_arguments(n, workers, worker_id):
    assert workers >= 1 and 0 <= worker_id < workers, "bad arguments"
    return list(range(worker_id, n, workers))


def blocks_dividing_by_zero(n, workers, worker_id):
    if not 0 <= worker_id < max(workers, 1):
        raise ValueError("worker_id")
    return list(range(worker_id * n // workers, (worker_id + 1) * n // workers))


def slices_a_list(n, workers, worker_id):
    if worker_id >= workers or workers < 1:
        raise ValueError("bad arguments")
    return list(range(n))[worker_id::workers]              # worker_id = -1 reads from the end


@pytest.mark.parametrize("wrong, words", [
    (lambda n, w, k: torch.arange(k, n, w), "returned a tensor.*tolist"),
    (lambda n, w, k: set(range(k, n, w)), "a set has no order"),
    (lambda n, w, k: [torch.tensor(i) for i in range(k, n, w)], "element tensor\\(0\\) of type Tensor"),
    (asserts_arguments, "(?s)raised AssertionError \\(bad arguments.*it should raise ValueError"),
    (validated(lambda w, k: w >= 1 and 0 <= k <= w),               # off by one: accepts worker_id = num_workers
     "shard_for_worker\\(10, 2, 2\\) returned \\[2, 4, 6, 8\\].*= num_workers"),
    (blocks_dividing_by_zero, "raised ZeroDivisionError .*num_workers = 0"),
    (slices_a_list, "shard_for_worker\\(10, 2, -1\\) returned \\[9\\].*negative worker_id"),
    (lambda n, w, k: list(range(k * (n // w), (k + 1) * (n // w))) + ([n - 1] * (k == w - 1) * (n % w > 0)),
     "are read by no worker"),
])
def test_shard_wrong_answers_named(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_shard_for_worker(wrong)


def _checked(split):
    def shard_for_worker(n, workers, worker_id):
        if workers < 1 or not 0 <= worker_id < workers:
            raise ValueError(f"bad worker_id {worker_id} of {workers}")
        return split(n, workers, worker_id)
    return shard_for_worker


@pytest.mark.parametrize("right", [
    _checked(lambda n, w, k: range(k, n, w)),
    _checked(lambda n, w, k: torch.tensor_split(torch.arange(n), w)[k].tolist()),
    _checked(lambda n, w, k: __import__("numpy").array_split(range(n), w)[k].tolist()),
    _checked(lambda n, w, k: [i for i in range(n) if i % w == k]),
], ids=["range", "tensor_split", "array_split", "modulo"])
def test_shard_more_right_answers(right):
    check_shard_for_worker(right)


def with_dataloader(x, y, batch_size, generator):
    from torch.utils.data import DataLoader, TensorDataset
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, generator=generator)


def with_tensorloader(x, y, batch_size, generator):
    from course_lib.data import TensorLoader
    return TensorLoader(x, y, batch_size=batch_size, seed=int(torch.randint(0, 2**30, (), generator=generator)))


def shuffles_in_place(x, y, batch_size, generator):
    perm = torch.randperm(len(x), generator=generator)
    x[:], y[:] = x[perm], y[perm]                           # the caller's dataset, reordered
    for s in range(0, len(x), batch_size):
        yield x[s:s + batch_size], y[s:s + batch_size]


def shuffles_only_y(x, y, batch_size, generator):
    perm = torch.randperm(len(x), generator=generator)
    for s in range(0, len(x), batch_size):
        yield x[s:s + batch_size], y[perm[s:s + batch_size]]


def flattens_samples(x, y, batch_size, generator):
    perm = torch.randperm(len(x), generator=generator)
    flat = x.reshape(len(x), -1)
    for idx in perm.split(batch_size):
        yield flat[idx], y[idx]


def squeezes_labels(x, y, batch_size, generator):
    perm = torch.randperm(len(x), generator=generator)
    for idx in perm.split(batch_size):
        yield x[idx], y[idx].squeeze()


def two_d_indexing(x, y, batch_size, generator):
    perm = torch.randperm(len(x), generator=generator)
    for idx in perm.split(batch_size):
        yield x[idx, :], y[idx]


@pytest.mark.parametrize("wrong, words", [
    (with_dataloader, "uses DataLoader"),
    (with_tensorloader, "uses TensorLoader"),
    (shuffles_in_place, "x or y changed during the epoch"),
    (shuffles_only_y, "y was shuffled but x comes in its stored order"),
    (flattens_samples, "must keep the sample shape \\(1, 2, 2\\)"),
    (squeezes_labels, "batch_size=1.*y_batch \\(\\): keep the batch dimension"),
    (two_d_indexing, "x \\[6\\].*raised IndexError while yielding"),
], ids=lambda v: getattr(v, "__name__", v))
def test_batches_wrong_answers_named(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_batches(wrong)


def multinomial_order(x, y, batch_size, generator):
    perm = torch.multinomial(torch.ones(len(x)), len(x), replacement=False, generator=generator)
    for idx in torch.split(perm, batch_size):
        yield x.index_select(0, idx), y.index_select(0, idx)


def test_batches_another_right_answer():
    check_batches(multinomial_order)


# --- property tests: the solutions agree with PyTorch on drawn inputs ------------------------------------------

@settings(max_examples=60)
@given(n=st.integers(0, 200), workers=st.integers(1, 20))
def test_solution_shards_partition_like_a_strided_slice(n, workers):
    parts = [NS["shard_for_worker"](n, workers, k) for k in range(workers)]
    assert all(p == torch.arange(n)[k::workers].tolist() for k, p in enumerate(parts))
    assert sorted(i for p in parts for i in p) == list(range(n))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@settings(max_examples=40)
@given(n=st.integers(1, 40), batch_size=st.integers(1, 12), seed=st.integers(0, 2**16), image=st.booleans())
def test_solution_batches_equal_pytorchs_shuffling_sampler(n, batch_size, seed, image):
    """From the same generator state, the batches of PyTorch's RandomSampler + BatchSampler (what
    DataLoader(shuffle=True) uses): any n, batch size and sample shape, x and y still paired."""
    from torch.utils.data import BatchSampler, RandomSampler
    x, y = torch.randn(n, *((1, 2, 2) if image else (3,))), torch.arange(n)
    ours = list(NS["batches"](x, y, batch_size, torch.Generator().manual_seed(seed)))
    theirs = list(BatchSampler(RandomSampler(range(n), generator=torch.Generator().manual_seed(seed)), batch_size,
                               drop_last=False))
    assert [yb.tolist() for _, yb in ours] == theirs
    assert all(torch.equal(xb, x[yb]) for xb, yb in ours)
