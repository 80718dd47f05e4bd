"""The checks of exercise notebook 16 pass the reference solutions and fail stubs and wrong answers."""
import functools
import importlib.util

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.checks.nb16 import check_horovod_loop, check_like_trainer, check_trainer_flags
from nbtools import ROOT, notebook_namespace

# lightning and the solution (which imports it) are loaded by the first test, not at collection (seconds per worker)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning is not installed")
solution = functools.cache(lambda: notebook_namespace(ROOT / "solutions" / "16_frameworks_exercises.ipynb"))


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_like_trainer(solution()["train_epoch_like_trainer"])
    check_trainer_flags(solution()["trainer_flags"])


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


def by_group_size(model, loader, lr, accumulate, clip):
    """Divides the short last group by its own length: a 'true mean', but not what the Trainer does."""
    optimizer, n = torch.optim.SGD(model.parameters(), lr=lr), len(loader)
    for i, (x, y) in enumerate(loader):
        group = min(accumulate, n - (i // accumulate) * accumulate)
        (F.cross_entropy(model(x), y) / group).backward()
        if (i + 1) % accumulate == 0 or i + 1 == n:
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad()
    return model


def steps_first(model, loader, lr, accumulate, clip):
    """Off by one: steps after batches 0, k, 2k, ... (i % k == 0)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for i, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x), y) / accumulate).backward()
        if i % accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
    return model


def trains_a_copy(model, loader, lr, accumulate, clip):
    """Trains a deep copy and returns the untouched argument."""
    import copy
    epoch(copy.deepcopy(model), loader, lr, accumulate, clip)
    return model


@pytest.mark.parametrize("wrong, words", [
    (by_group_size, "divided the short last group \\(1 batch\\) by its own length"),
    (steps_first, "changed after batches \\[0, 2, 4, 6\\].*stepped after batches \\[1, 3, 5, 6\\]"),
    (trains_a_copy, "not the one your loop ran"),
])
def test_more_wrong_train_epoch_like_trainer_fails(wrong, words):
    with pytest.raises(AssertionError, match=f"differ from the Trainer.*{words}"):
        check_like_trainer(wrong)


def test_returning_nothing_fails():
    with pytest.raises(AssertionError, match="return the trained model"):
        check_like_trainer(lambda *args: (epoch(*args), None)[1])


def grads_scaled_at_the_step(model, loader, lr, accumulate, clip):
    """Correct, written differently: sums the losses' gradients, divides the gradients once before the step,
    zero_grad(set_to_none=False), and counts the batches itself instead of len(loader)."""
    optimizer, batches = torch.optim.SGD(model.parameters(), lr=lr), list(loader)
    for i, (x, y) in enumerate(batches, start=1):
        F.cross_entropy(model(x), y).backward()
        if i % accumulate == 0 or i == len(batches):
            for p in model.parameters():
                p.grad /= accumulate
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip, norm_type=2.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
    return model


def test_a_different_correct_epoch_passes():
    check_like_trainer(grads_scaled_at_the_step)
    check_like_trainer(grads_scaled_at_the_step, cases=[(5, 0.03), (7, None)])


@pytest.mark.parametrize("mistake, words", [
    (dict(scale=False), "2 times as far.*sum over the 2 micro-batches"),
    (dict(last_step=False), "also steps after the LAST batch"),
    (dict(clip_each=True), "Before batch 1 your accumulated gradient had norm 0.05 \\(clipped already\\)"),
    (dict(clip_value=True), "clipping by value"),
], ids=lambda m: next(iter(m)) if isinstance(m, dict) else "")
def test_wrong_train_epoch_like_trainer_fails(mistake, words):
    with pytest.raises(AssertionError, match=f"differ from the Trainer.*{words}"):
        check_like_trainer(lambda *args: epoch(*args, **mistake))


def zero_grad_every_batch(model, loader, lr, accumulate, clip):
    """Steps every `accumulate` batches, but zeroes the gradient before every backward: only the last micro-batch
    counts."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        (F.cross_entropy(model(x), y) / accumulate).backward()
        if (i + 1) % accumulate == 0 or i + 1 == len(loader):
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
    return model


def clips_before_averaging(model, loader, lr, accumulate, clip):
    """Clips the summed (unscaled) gradient, then divides: the clip bites at accumulate times the Trainer's norm."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for i, (x, y) in enumerate(loader):
        F.cross_entropy(model(x), y).backward()
        if (i + 1) % accumulate == 0 or i + 1 == len(loader):
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            for p in model.parameters():
                p.grad /= accumulate
            optimizer.step()
            optimizer.zero_grad()
    return model


def with_lightning(model, loader, lr, accumulate, clip):
    import lightning as L

    from course_lib.frameworks import FlagProbe
    L.Trainer(max_epochs=1, accumulate_grad_batches=accumulate, gradient_clip_val=clip, logger=False,
              enable_checkpointing=False, enable_progress_bar=False).fit(FlagProbe(model, lr), loader)
    return model


@pytest.mark.parametrize("wrong, words", [
    (zero_grad_every_batch, "differ from the Trainer.*Step 1 \\(after batch 1\\) went another way"),
    (clips_before_averaging, "differ from the Trainer.*Step 1 \\(after batch 2\\) moved the weights 0.333 times "
                             "as far.*clipped this step's gradient to norm 0.05, yours had norm 0.0167"),
    (with_lightning, "uses lightning"),
])
def test_wrong_epochs_name_what_they_did(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_like_trainer(wrong)


def steps_the_rest_after_the_loop(model, loader, lr, accumulate, clip):
    """Correct: steps on full groups inside the loop, and once more after it when a short group is left."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def step():
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad()

    for i, (x, y) in enumerate(loader, start=1):
        (F.cross_entropy(model(x), y) / accumulate).backward()
        if i % accumulate == 0:
            step()
    if i % accumulate:
        step()
    return model


def test_stepping_the_rest_after_the_loop_passes():
    check_like_trainer(steps_the_rest_after_the_loop)


SOLUTION_FLAGS = {"precision": "bf16-mixed", "accumulate_grad_batches": 4, "gradient_clip_val": 0.05}


@pytest.mark.parametrize("extra", [
    {"enable_progress_bar": False, "logger": False, "enable_model_summary": False},   # what a careful learner adds
    {"deterministic": True, "max_epochs": 1, "devices": 1, "accelerator": "cpu"},      # the defaults, spelled out
    {"default_root_dir": "runs/nb16", "enable_checkpointing": True, "logger": True},   # files: the check's own folder
    {"max_steps": 2, "max_epochs": -1, "num_sanity_val_steps": 0, "log_every_n_steps": 1},   # 2 steps = the epoch
    {"gradient_clip_algorithm": "norm", "limit_train_batches": 8, "strategy": "auto", "benchmark": False},
])
def test_harmless_extra_flags_pass(extra, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_trainer_flags(lambda: {**SOLUTION_FLAGS, **extra})
    assert not any(tmp_path.iterdir()), "the check wrote into the current folder"


def test_bf16_alias_passes():
    check_trainer_flags(lambda: {"precision": "bf16", "accumulate_grad_batches": 4, "gradient_clip_val": 0.05})


@pytest.mark.parametrize("flags,message", [
    ({"accumulate_grad_batches": 4, "gradient_clip_val": 0.05}, "bf16 autocast"),          # no precision
    ({"precision": "bf16-true", "accumulate_grad_batches": 4, "gradient_clip_val": 0.05}, "fp32 weights"),
    ({"precision": "bf16-mixed", "gradient_clip_val": 0.05}, "twice"),                     # no accumulation
    ({"precision": "bf16-mixed", "accumulate_grad_batches": 4}, "do not clip"),            # no clipping
    ({"precision": "bf16-mixed", "accumulate_grad_batches": 4, "gradient_clip_val": 0.05,
      "gradient_clip_algorithm": "value"}, "clip by 'value'"),
    ({**SOLUTION_FLAGS, "max_epochs": 2}, "one pass"),                                      # two epochs
    ({**SOLUTION_FLAGS, "max_steps": 1}, "one pass"),
    ({**SOLUTION_FLAGS, "limit_train_batches": 4}, "one pass"),
    ({**SOLUTION_FLAGS, "fast_dev_run": True}, "one pass"),
    ({**SOLUTION_FLAGS, "devices": 2}, "ONE process"),                                   # would split the batches
    ({**SOLUTION_FLAGS, "strategy": "ddp"}, "ONE process"),
    ({**SOLUTION_FLAGS, "accelerator": "gpu"}, "ONE process"),
    ({"precision": "16-mixed", "accumulate_grad_batches": 4, "gradient_clip_val": 0.05}, "fp16 autocast"),
    ({**SOLUTION_FLAGS, "gradient_clip_val": 0.5}, "clip at 0.5"),                        # a clip that never bites
    ({**SOLUTION_FLAGS, "accumulate_grad_batches": 2}, "twice"),
    ({**SOLUTION_FLAGS, "max_epochs": 1, "precision": "32-true"}, "bf16 autocast"),
    ({**SOLUTION_FLAGS, "grad_clip": 0.05}, "does not run"),                              # no such flag
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


@pytest.mark.slow
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
                       "BEFORE optimizer.step\\(\\), not after"),
        "copy_reduced": (_variant(solution, "            dist.all_reduce(p.grad)\n            p.grad /= dist.get_world_size()",
                                  "            total = p.grad.clone()\n            dist.all_reduce(total)\n"
                                  "            total /= dist.get_world_size()"), "not p.grad \\(a copy"),
        "never_reduced": (_variant(solution, "dist.all_reduce(p.grad)\n            p.grad /= dist.get_world_size()",
                                   "pass"), "never calls dist.all_reduce"),
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


def test_a_deterministic_trainer_leaves_the_process_as_it_found_it():
    """Lightning's deterministic=True turns torch's deterministic mode on process-wide; the check puts it back
    (it once broke every later int8 test in the suite)."""
    from course_lib.checks import nb16
    before = torch.are_deterministic_algorithms_enabled()
    model, loader = nb16._setup(7)
    nb16._trainer(loader, model, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled() == before


def test_a_horovod_loop_that_wraps_the_model_in_ddp_is_refused_before_any_launch():
    def wraps_in_ddp(model, optimizer, batches, root_rank):
        with torch.no_grad():
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, src=root_rank)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        for x, y in batches:
            optimizer.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            optimizer.step()
        return model

    with pytest.raises(AssertionError, match="DistributedDataParallel"):
        check_horovod_loop(wraps_in_ddp)


def test_a_graded_answer_gets_a_model_it_can_receive(monkeypatch):
    """Graded, the answer runs in the sandbox and the model goes there pickled: it must carry no hook of the check's
    (a local function does not pickle), and the message says what the weights alone show."""
    import pickle

    import course_lib.grading.remote as remote
    from course_lib.checks import nb16
    monkeypatch.setattr(remote, "is_remote", lambda fn: True)
    monkeypatch.setattr(nb16, "answer_source", lambda fn: "")      # a proxy's .source: here, no answer cells
    hooks = []

    def as_the_sandbox_gets_it(model, *args):
        hooks.append(len(model._forward_pre_hooks))
        return solution()["train_epoch_like_trainer"](pickle.loads(pickle.dumps(model)), *args)

    with pytest.raises(AssertionError, match="differ from the Trainer.*Look at after which batches"):
        check_like_trainer(lambda model, *args: as_the_sandbox_gets_it(model, *args) if args[2] == 1
                           else epoch(model, *args, scale=False))
    assert hooks and not any(hooks)
