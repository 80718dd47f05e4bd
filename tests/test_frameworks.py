"""course_lib.frameworks: the LightningModule trains as course_lib.train does; counting code lines; flag mappings."""
import copy
import inspect

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning.pytorch")

from conftest import needs_mnist  # noqa: E402
from course_lib import frameworks  # noqa: E402
from course_lib.data import TensorLoader  # noqa: E402
from course_lib.loop import fit  # noqa: E402

SAMPLE = '''
def outer(a):
    """Docstring,
    two lines."""
    # a comment

    if a:                      # header mentions a
        b = a + 1
        c = b * 2
    for i in range(3):
        print("checkpoint", i)
    def inner():
        return 1
    return inner
'''


def test_code_lines_skip_blank_lines_comments_and_docstrings():
    lines = frameworks.code_lines(SAMPLE)
    assert [ln.strip().split()[0] for ln in lines] == ["def", "if", "b", "c", "for", "print(\"checkpoint\",", "def",
                                                       "return", "return"]


def test_engineering_table_finds_every_job_in_course_lib():
    rows = frameworks.engineering_table()
    assert len(rows) == len(frameworks.ENGINEERING_JOBS) == 5
    assert all(r["lines"] > 0 and r["course_lib"] and r["lightning"] for r in rows)
    by_job = {r["job"]: r["lines"] for r in rows}
    assert by_job["process group, backend, one device per rank"] >= 10
    assert "`strategy.setup_strategy`" in rows[0]["course_lib"]


def test_engineering_table_counts_whole_objects_so_a_renamed_local_changes_nothing():
    from course_lib import strategy

    counted = len(frameworks.code_lines(inspect.getsource(strategy.DDP)))
    assert {r["job"]: r["lines"] for r in frameworks.engineering_table()}[
        "wrap the model in DDP; gather, sum and wait across ranks"] == counted


def tiny_data(n=7 * 16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_lit_classifier_trains_exactly_like_course_lib_fit():
    """One device, the same batches: Lightning's loop == course_lib.loop.fit (Adam + one-cycle per step)."""
    x, y = tiny_data()
    torch.manual_seed(0)
    lit = frameworks.LitClassifier("lenet300", lr=1e-2)
    model = copy.deepcopy(lit.model)
    frameworks.fit_quietly(lit, DataLoader(TensorDataset(x, y), batch_size=16))

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=7)
    fit(model, TensorLoader(x, y, batch_size=16, shuffle=False), epochs=1, optimizer=optimizer, scheduler=schedule,
        progress=False, log=None)
    for a, b in zip(lit.model.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("accumulate,clip", [(1, None), (2, 0.05), (3, None), (3, 0.01)])
def test_manual_accumulate_and_clip_matches_the_trainer_flags(accumulate, clip):
    x, y = tiny_data()
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    torch.manual_seed(1)
    base = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    manual = frameworks.manual_accumulate_and_clip(copy.deepcopy(base), loader, lr=0.3, accumulate=accumulate,
                                                   clip=clip)
    probe = frameworks.FlagProbe(copy.deepcopy(base), lr=0.3)
    frameworks.fit_quietly(probe, loader, accumulate_grad_batches=accumulate, gradient_clip_val=clip)
    assert probe.steps == -(-7 // accumulate)
    for a, b in zip(manual.parameters(), probe.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    if clip is not None:     # the clip really acted: without it the weights differ
        unclipped = frameworks.manual_accumulate_and_clip(copy.deepcopy(base), loader, lr=0.3, accumulate=accumulate)
        assert any(not torch.allclose(a, b) for a, b in zip(manual.parameters(), unclipped.parameters()))


def test_flag_probe_sees_bf16_autocast():
    x, y = tiny_data(32)
    probe = frameworks.FlagProbe(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10)))
    frameworks.fit_quietly(probe, DataLoader(TensorDataset(x, y), batch_size=16), precision="bf16-mixed")
    assert probe.dtypes == [torch.bfloat16] * 2 and probe.autocast == [True, True] and probe.steps == 2
    assert all(p.dtype == torch.float32 for p in probe.parameters())


@needs_mnist
def test_mnist_dataloaders():
    train, val = frameworks.mnist_dataloaders(batch_size=32, train_subset=96, val_subset=50)
    x, y = next(iter(train))
    assert x.shape == (32, 1, 28, 28) and y.dtype == torch.int64 and len(train) == 3
    assert isinstance(train.sampler, torch.utils.data.RandomSampler) and len(val.dataset) == 50
