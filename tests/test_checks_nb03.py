"""The lecture-03 checks pass the reference solutions and fail stubs and plausible wrong answers."""
import math

import pytest
import torch

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
    (everyone_reads_everything, "more than one worker"),
    (drops_the_remainder, "remainder"),
    (overlapping_blocks, "more than one worker"),
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
