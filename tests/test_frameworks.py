"""course_lib.frameworks: the LightningModule trains as course_lib.train does; counting code lines; flag mappings."""
import copy
import importlib.util
import inspect

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from conftest import needs_mnist
from course_lib.data import TensorLoader
from course_lib.loop import fit

# found, not imported: lightning loads at the first test that trains with it, not at collection (seconds per worker)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning is not installed")


@pytest.fixture(scope="module")
def frameworks():
    """course_lib.frameworks, which imports lightning."""
    from course_lib import frameworks
    return frameworks

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


def test_code_lines_skip_blank_lines_comments_and_docstrings(frameworks):
    lines = frameworks.code_lines(SAMPLE)
    assert [ln.strip().split()[0] for ln in lines] == ["def", "if", "b", "c", "for", "print(\"checkpoint\",", "def",
                                                       "return", "return"]


def test_engineering_table_finds_every_job_in_course_lib(frameworks):
    rows = frameworks.engineering_table()
    assert len(rows) == len(frameworks.ENGINEERING_JOBS) == 5
    assert all(r["lines"] > 0 and r["course_lib"] and r["lightning"] for r in rows)
    by_job = {r["job"]: r["lines"] for r in rows}
    assert by_job["process group, backend, one device per rank"] >= 10
    assert "`strategy.setup_strategy`" in rows[0]["course_lib"]


def test_engineering_table_counts_whole_objects_so_a_renamed_local_changes_nothing(frameworks):
    from course_lib import strategy

    objects = (strategy.DDP, strategy.Strategy.gather, strategy.Strategy.barrier, strategy.Strategy.sum,
               strategy.Strategy.close)
    counted = sum(len(frameworks.code_lines(inspect.getsource(obj))) for obj in objects)
    assert {r["job"]: r["lines"] for r in frameworks.engineering_table()}[
        "wrap the model in DDP; gather, sum and wait across ranks"] == counted


def tiny_data(n=7 * 16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_lit_classifier_trains_exactly_like_course_lib_fit(frameworks):
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
def test_manual_accumulate_and_clip_matches_the_trainer_flags(accumulate, clip, frameworks):
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


def test_flag_probe_sees_bf16_autocast(frameworks):
    x, y = tiny_data(32)
    probe = frameworks.FlagProbe(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10)))
    frameworks.fit_quietly(probe, DataLoader(TensorDataset(x, y), batch_size=16), precision="bf16-mixed")
    assert probe.dtypes == [torch.bfloat16] * 2 and probe.autocast == [True, True] and probe.steps == 2
    assert all(p.dtype == torch.float32 for p in probe.parameters())


@needs_mnist
def test_mnist_dataloaders(frameworks):
    train, val = frameworks.mnist_dataloaders(batch_size=32, train_subset=96, val_subset=50)
    x, y = next(iter(train))
    assert x.shape == (32, 1, 28, 28) and y.dtype == torch.int64 and len(train) == 3
    assert isinstance(train.sampler, torch.utils.data.RandomSampler) and len(val.dataset) == 50


# --- the other frameworks: Ignite, Keras 3; the feature table -----------------------------------------------

def test_features_table_names_real_apis(frameworks):
    rows = frameworks.features_table()    # an API that moved raises AttributeError here
    assert [r["job"] for r in rows] == [job for job, _ in frameworks.FEATURES]
    for row in rows:
        for name in ("course_lib", "Lightning", "Ignite"):
            assert row[name] != "(not installed)", (row["job"], name)


def test_ignite_fit_trains_exactly_like_course_lib_fit():
    """Two epochs from the same seed, the same TensorLoader order (set_epoch per epoch): the same weights."""
    from course_lib.frameworks_ignite import ignite_evaluate, ignite_fit

    x, y = tiny_data(5 * 16)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    reference = copy.deepcopy(model)
    trainer, losses = ignite_fit(model, TensorLoader(x, y, batch_size=16), epochs=2, lr=1e-2)
    assert trainer.state.iteration == len(losses) == 10
    optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=10)
    fit(reference, TensorLoader(x, y, batch_size=16), epochs=2, optimizer=optimizer, scheduler=schedule,
        progress=False, log=None)
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    metrics = ignite_evaluate(model, TensorLoader(x, y, batch_size=32, shuffle=False))
    logits = model(x)
    assert metrics["accuracy"] == pytest.approx((logits.argmax(1) == y).float().mean().item())
    assert metrics["loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, y).item(), rel=1e-5)
    with pytest.raises(ValueError, match="epochs"):
        ignite_fit(model, TensorLoader(x, y), epochs=0)


def test_keras_fit_trains_the_torch_module_exactly_like_course_lib_fit():
    pytest.importorskip("keras")
    from course_lib.frameworks_keras import keras_fit

    x, y = tiny_data(5 * 16 - 3)          # a short last batch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    reference = copy.deepcopy(model)
    history = keras_fit(model, x, y, epochs=2, lr=0.1, batch_size=16)
    assert len(history["loss"]) == len(history["accuracy"]) == 2
    fit(reference, TensorLoader(x, y, batch_size=16, shuffle=False), epochs=2,
        optimizer=torch.optim.SGD(reference.parameters(), lr=0.1), progress=False, log=None)
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-4, atol=1e-5)


def test_load_keras_says_what_to_install_when_missing(monkeypatch, capsys):
    from course_lib import frameworks_keras

    monkeypatch.setattr(frameworks_keras.importlib.util, "find_spec", lambda name: None)
    assert frameworks_keras.load_keras() is None
    assert frameworks_keras.INSTALL in capsys.readouterr().out


# --- Horovod's four steps: the shim against torch DDP (one launch of 2 gloo processes) -----------------------

def test_horovod_course_lines_are_found_in_course_lib():
    from course_lib import horovod_map

    rows = horovod_map.course_lines()
    assert [r["shim"] for r in rows] == ["init", "local_rank", "DistributedOptimizer", "broadcast_parameters"]
    assert all(r["course"] and all(":" in where and line for where, line in r["course"]) for r in rows)


@pytest.mark.slow
def test_horovod_shim_trains_exactly_like_torch_ddp():
    from course_lib import horovod_map
    from course_lib.distributed.launch import launch

    x, y = tiny_data(4 * 2 * 16)
    results = launch(horovod_map.train_worker, 2, x, y, ("horovod", "ddp"), 16, 0.05, "net")
    assert [sorted(r) for r in results] == [["ddp", "horovod"]] * 2
    assert len(results[0]["horovod"]["losses"]) == 4
    assert horovod_map.agree(results) < 1e-6          # every rank, both ways: the same weights
    with pytest.raises(ValueError, match="uses"):
        horovod_map.train_worker(0, 1, x, y, ("mpi",))
