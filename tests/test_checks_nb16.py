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
