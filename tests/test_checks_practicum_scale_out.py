"""The practicum's checks pass the reference DDP script and fail the stub and plausible wrong DDP scripts.

Every script here really runs under torchrun (2 CPU ranks); each wrong script carries mistakes that
different checks must catch, each with its own diagnosis.
"""
import os
import sys

import pytest

from conftest import a_student, needs_mnist
from course_lib.checks import practicum_scale_out as ps
from course_lib.grading import scale_out_harness
from nbtools import ROOT, notebook_namespace

pytestmark = [needs_mnist, pytest.mark.timeout(600)]
NS = notebook_namespace(ROOT / "solutions" / "practicum_scale_out.ipynb")
SCRIPT = NS["DDP_SCRIPT"]
CHECKS = (ps.check_rank_logs, ps.check_sampler, ps.check_seeding, ps.check_checkpoint, ps.check_equivalence)


@pytest.fixture(scope="module", autouse=True)
def anonymous():
    """The default variant (2 ranks, seed 3) whoever runs the tests; tests below pick other students."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COURSE_STUDENT_ID", "anonymous")
        yield


def variant(*replacements):
    script = SCRIPT
    for old, new in replacements:
        assert old in script, old
        script = script.replace(old, new)
    return ps.run_ddp(script, quiet=True)


@pytest.mark.slow
def test_stubs_fail():
    run = ps.run_ddp("raise NotImplementedError()\n", quiet=True)
    for check in CHECKS:
        with pytest.raises(AssertionError, match="NotImplementedError"):
            check(run)

    def stub(*args):
        raise NotImplementedError()
    with pytest.raises(NotImplementedError):
        ps.check_torchrun_command(stub)


@pytest.mark.slow
def test_no_set_epoch_and_every_rank_checkpoints_and_prints():
    run = variant(("        sampler.set_epoch(epoch)", "        pass"), ("        if rank == 0:", "        if True:"))
    with pytest.raises(AssertionError, match="set_epoch"):
        ps.check_sampler(run)
    with pytest.raises(AssertionError, match=r"ranks \['0', '1'\]"):
        ps.check_checkpoint(run)
    with pytest.raises(AssertionError, match="printed progress lines too"):
        ps.check_rank_logs(run)
    with pytest.raises(AssertionError, match="final weights"):
        ps.check_equivalence(run)
    ps.check_seeding(run)


@pytest.mark.slow
def test_same_seed_on_every_rank_and_no_distributed_sampler():
    run = variant(("torch.manual_seed(args.seed + rank)", "torch.manual_seed(args.seed)"),
                  ("DistributedSampler(dataset, shuffle=True, seed=args.seed)",
                   "DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=args.seed)"))
    with pytest.raises(AssertionError, match="identical noise"):
        ps.check_seeding(run)
    with pytest.raises(AssertionError, match="every rank repeats the whole dataset"):
        ps.check_sampler(run)
    with pytest.raises(AssertionError, match="final weights"):
        ps.check_equivalence(run)
    ps.check_checkpoint(run)
    ps.check_rank_logs(run)


@pytest.mark.slow
def test_sampler_without_seed_wrapper_keys_and_scaled_lr():
    run = variant(("DistributedSampler(dataset, shuffle=True, seed=args.seed)", "DistributedSampler(dataset)"),
                  ('"model": model.module.state_dict()', '"model": model.state_dict()'),
                  ("lr=args.lr,", "lr=args.lr * dist.get_world_size(),"))
    with pytest.raises(AssertionError, match="seed=args.seed"):
        ps.check_sampler(run)
    with pytest.raises(AssertionError, match="'module.'"):
        ps.check_checkpoint(run)
    with pytest.raises(AssertionError, match="final weights"):
        ps.check_equivalence(run)
    ps.check_seeding(run)


@pytest.mark.slow
def test_wrong_launch_commands_fail():
    with pytest.raises(AssertionError, match="failed"):      # plain python: no torchrun, no process group
        ps.check_torchrun_command(lambda script, nproc, port: [sys.executable, script])
    one_rank = lambda script, nproc, port: [sys.executable, "-m", "torch.distributed.run", "--standalone", script]
    with pytest.raises(AssertionError, match=r"expected 2 ranks"):
        ps.check_torchrun_command(one_rank)
    with pytest.raises(AssertionError, match="list of strings"):
        ps.check_torchrun_command(lambda script, nproc, port: " ".join([sys.executable, script]))


RACE_ONCE = '''
import sys
from pathlib import Path
marker = Path("crashed_once")                 # one for all ranks: torchrun may stop a rank before it gets here
if not marker.exists():                       # first launch: die as PyTorch's gloo shutdown race does
    marker.write_text("x")
    sys.stderr.write("terminate called without an active exception\\n")
    sys.exit(1)
'''


@pytest.mark.slow
def test_pytorchs_gloo_shutdown_race_is_retried_once_and_only_that():
    run = ps.run_ddp(RACE_ONCE, world_size=1, timeout=60, quiet=True)      # one rank: the retry is the same
    assert run.returncode == 0, run.console           # the second launch, in a fresh folder, went through
    other = ps.run_ddp(RACE_ONCE.replace("terminate called without an active exception", "my own bug"),
                       world_size=1, timeout=60, quiet=True)
    assert other.returncode != 0                       # any other failure is the script's, reported as is


def test_bad_input_and_where_the_children_find_course_lib():
    with pytest.raises(TypeError, match="text of a Python file"):
        ps.run_ddp(b"print(1)")
    with pytest.raises(ValueError, match="world_size"):
        ps.run_ddp("print(1)", world_size=0)
    root = scale_out_harness.PACKAGE_ROOT       # the folder that holds the imported course_lib, not a guess
    assert (root / "course_lib" / "__init__.py").is_file()
    assert scale_out_harness._env()["PYTHONPATH"].split(os.pathsep)[0] == str(root)


# --- per-student variants (course_lib.grading.variants): 2 or 3 ranks and the seed come from the student id ------

THREE_RANKS = a_student("practicum_scale_out", lambda v: v["world_size"] == 3 and v["seed"] != 3)


@pytest.fixture(scope="module")
def three_rank_run():
    """The solution's run for a student whose variant is 3 ranks and another seed. The default variant (2 ranks)
    is graded whole, every check and hidden test, by test_grade.py's practicum test."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COURSE_STUDENT_ID", THREE_RANKS)
        return ps.run_ddp(SCRIPT, quiet=True)


@pytest.mark.slow
def test_the_solution_passes_another_students_variant_on_3_ranks(three_rank_run, monkeypatch):
    monkeypatch.setenv("COURSE_STUDENT_ID", THREE_RANKS)
    world_size, settings = ps.student_settings()
    assert world_size == 3 and settings["samples"] % 6 == 0
    run = three_rank_run
    assert run.returncode == 0 and run.world_size == 3 and run.settings["seed"] == settings["seed"], run.console
    for check in CHECKS:
        check(run)


@pytest.mark.slow
def test_a_run_for_one_student_fails_for_another(three_rank_run):
    """One 3-rank student's run is what a script that hard-codes that student's seed does for another 3-rank
    student."""
    import dataclasses
    run = three_rank_run
    other_world, other_settings = ps.student_settings(a_student(
        "practicum_scale_out", lambda v: v["world_size"] == 3 and v["seed"] not in (3, run.settings["seed"])))
    assert other_world == run.world_size and other_settings["seed"] != run.settings["seed"]
    with pytest.raises(AssertionError, match="expected DistributedSampler's samples"):
        ps.check_sampler(dataclasses.replace(run, settings=other_settings))
    with pytest.raises(AssertionError, match="no log_rank3.jsonl"):   # a 4-rank variant: a 3-rank run lacks rank 3
        ps.check_rank_logs(dataclasses.replace(run, world_size=4))
