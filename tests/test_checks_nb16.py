"""The checks of exercise notebook 16 pass the reference solutions and fail stubs and wrong answers."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("lightning")

from course_lib.checks.nb16 import check_like_trainer, check_trainer_flags  # noqa: E402
from nbtools import ROOT, notebook_namespace  # noqa: E402

NS = notebook_namespace(ROOT / "solutions" / "16_frameworks_exercises.ipynb")


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_like_trainer(NS["train_epoch_like_trainer"])
    check_trainer_flags(NS["trainer_flags"])


def test_stubs_fail():
    for check in (check_like_trainer, check_trainer_flags):
        with pytest.raises(NotImplementedError):
            check(stub)


def epoch(model, loader, lr, accumulate, clip, scale=True, last_step=True, clip_each=False, clip_value=False):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y)
        (loss / accumulate if scale else loss).backward()
        if clip is not None and clip_each:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if (i + 1) % accumulate == 0 or (last_step and i + 1 == len(loader)):
            if clip is not None and not clip_each:
                clipper = torch.nn.utils.clip_grad_value_ if clip_value else torch.nn.utils.clip_grad_norm_
                clipper(model.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad()
    return model


@pytest.mark.parametrize("mistake", [dict(scale=False), dict(last_step=False), dict(clip_each=True),
                                     dict(clip_value=True)], ids=lambda m: next(iter(m)))
def test_wrong_train_epoch_like_trainer_fails(mistake):
    with pytest.raises(AssertionError, match="differ from the Trainer"):
        check_like_trainer(lambda *args: epoch(*args, **mistake))


@pytest.mark.parametrize("flags,message", [
    ({"accumulate_grad_batches": 4, "gradient_clip_val": 0.05}, "bf16 autocast"),          # no precision
    ({"precision": "bf16-true", "accumulate_grad_batches": 4, "gradient_clip_val": 0.05}, "fp32 weights"),
    ({"precision": "bf16-mixed", "gradient_clip_val": 0.05}, "twice"),                     # no accumulation
    ({"precision": "bf16-mixed", "accumulate_grad_batches": 4}, "before optimizer.step"),  # no clipping
    ({"precision": "bf16-mixed", "accumulate_grad_batches": 4, "gradient_clip_val": 0.05,
      "gradient_clip_algorithm": "value"}, "before optimizer.step"),
    ({"precision": "bf16-mixed", "max_epochs": 2}, "does not run"),
])
def test_wrong_trainer_flags_fail(flags, message):
    with pytest.raises(AssertionError, match=message):
        check_trainer_flags(lambda: flags)


# --- exercise 3: Horovod by hand. ONE launch of 3 gloo processes runs every answer below. --------------------

def _solution_source() -> str:
    import nbformat
    nb = nbformat.read(str(ROOT / "solutions" / "16_frameworks_exercises.ipynb"), as_version=4)
    return next(c.source for c in nb.cells if c.cell_type == "code" and "def train_like_horovod" in c.source)


def _variant(source: str, old: str, new: str) -> str:
    assert old in source, old
    return source.replace(old, new)


def test_horovod_check_passes_the_solution_and_rejects_wrong_answers():
    from course_lib.checks.nb16 import judge_horovod
    from course_lib.distributed.launch import launch
    from nb16_workers import horovod_cases_many

    solution = _solution_source()
    loop = solution[solution.index("        for p in model.parameters():"):solution.index("        optimizer.step()\n")]
    answers = {   # name: (source, the message the check must give)
        "solution": (solution, None),
        "stub": ("def stub(model, optimizer, batches, root_rank):\n    raise NotImplementedError()\n", None),
        "summed": (_variant(solution, "            p.grad /= dist.get_world_size()\n", ""), "SUM"),
        "no_broadcast": (_variant(solution, "dist.broadcast(tensor, src=root_rank)", "pass"), "own random weights"),
        "root_zero": (_variant(solution, "src=root_rank", "src=0"), "not from 0"),
        "halved": (_variant(solution, "p.grad /= dist.get_world_size()", "p.grad /= 2"), "fixed number"),
        "after_step": (_variant(solution, loop + "        optimizer.step()\n", "        optimizer.step()\n" + loop),
                       "BEFORE optimizer.step"),
    }
    names = {"solution": "train_like_horovod", "stub": "stub"}
    runs = launch(horovod_cases_many, 3, [(src, names.get(k, "train_like_horovod")) for k, (src, _) in answers.items()],
                  timeout=120)
    for i, (key, (_, message)) in enumerate(answers.items()):
        results = [rank_runs[i][1] for rank_runs in runs]
        assert key == "stub" or not isinstance(results[0], str), (key, results)
        if key == "solution":
            judge_horovod(3, results)
        elif key == "stub":
            assert all(r.startswith("NotImplementedError") for r in results)  # run_on_ranks says: the stub
        else:
            with pytest.raises(AssertionError, match=message):
                judge_horovod(3, results)
