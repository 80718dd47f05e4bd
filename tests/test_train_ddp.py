"""The train CLI under torchrun (--strategy ddp), mid-epoch checkpoints and the failure hook."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import RESUME_TOLERANCE, needs_mnist
from course_lib import loop, train
from course_lib.distributed import faults
from course_lib.checkpoint import load_checkpoint
from course_lib.distributed.launch import free_port

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def torchrun(nproc, *args, timeout=150):
    env = {**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    cmd = ["timeout", str(timeout - 10), *TORCHRUN, "--nnodes", "1", "--nproc_per_node", str(nproc),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
           "-m", "course_lib.train", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def parse(args):
    return train.build_parser().parse_args(args)


@pytest.mark.slow
@needs_mnist
@pytest.mark.timeout(240)
def test_two_ddp_ranks_equal_one_process_with_twice_the_batch(tmp_path):
    """2 ranks x batch 32 (DistributedSampler order) == 1 process x batch 64 (TensorLoader order).

    lenet300 has no dropout, so the only difference is summation order in the all-reduce.
    """
    common = ["--model", "lenet300", "--epochs", "1", "--train-subset", "512", "--no-progress", "--json"]
    result = torchrun(2, *common, "--strategy", "ddp", "--batch-size", "32", "--checkpoint-dir", str(tmp_path / "ddp"))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and summary["strategy"] == "ddp" and summary["global_batch_size"] == 64
    assert summary["train_samples"] == 512 and 0.5 < summary["test_accuracy"] <= 1.0
    assert summary["images_per_second"] > 0 and summary["images_per_second_note"] == "sum over ranks"
    assert result.stdout.count("test accuracy") == 1          # rank 0 alone prints

    single = train.run(parse(common + ["--batch-size", "64", "--checkpoint-dir", str(tmp_path / "one")]))
    a, b = load_checkpoint(tmp_path / "ddp" / "last.pt"), load_checkpoint(tmp_path / "one" / "last.pt")
    assert a["world_size"] == 2 and len(a["rng_per_rank"]) == 2
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-4, atol=1e-5)
    assert summary["test_accuracy"] == pytest.approx(single["test_accuracy"], abs=2e-3)


def test_launch_mistakes_are_clear_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit, match="--strategy single"):
        train.run(parse(["--epochs", "1"]))
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(SystemExit, match="torchrun"):
        train.run(parse(["--epochs", "1", "--strategy", "ddp"]))
    with pytest.raises(SystemExit, match="--checkpoint-every needs --checkpoint-dir"):
        train.run(parse(["--epochs", "1", "--checkpoint-every", "5"]))
    with pytest.raises(SystemExit):
        parse(["--strategy", "horovod"])
    with pytest.raises(SystemExit):
        parse(["--checkpoint-every", "0"])
    with pytest.raises(ValueError, match="skip_batches"):
        loop.fit(torch.nn.Linear(2, 2), [], skip_batches=-1)


@pytest.mark.slow
@needs_mnist
def test_resume_mid_epoch_ends_with_the_same_weights(tmp_path, monkeypatch):
    common = ["--epochs", "2", "--train-subset", "256", "--batch-size", "32", "--no-progress", "--model", "net",
              "--checkpoint-every", "3"]
    train.run(parse(common + ["--checkpoint-dir", str(tmp_path / "a")]))

    import course_lib.checkpoint as ckpt

    original, saves = ckpt.save_checkpoint, []

    def crash_at_step_6(path, state):
        original(path, state)
        saves.append(state["step"])
        if state["step"] == 6:
            raise KeyboardInterrupt("worker killed")

    monkeypatch.setattr(ckpt, "save_checkpoint", crash_at_step_6)
    with pytest.raises(KeyboardInterrupt):
        train.run(parse(common + ["--checkpoint-dir", str(tmp_path / "b")]))
    assert saves == [3, 6]
    state = load_checkpoint(tmp_path / "b" / "last.pt")
    assert (state["epoch"], state["batches_done"], state["step"]) == (0, 6, 6)   # 8 batches per epoch
    monkeypatch.setattr(ckpt, "save_checkpoint", original)
    resumed = train.run(parse(common + ["--checkpoint-dir", str(tmp_path / "b"), "--resume"]))
    assert resumed["epochs_run"] == 2
    a, b = load_checkpoint(tmp_path / "a" / "last.pt"), load_checkpoint(tmp_path / "b" / "last.pt")
    assert a["step"] == b["step"] == 16
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], **RESUME_TOLERANCE)


def test_injected_fault_exits_only_on_its_rank_step_and_first_attempt(monkeypatch):
    exits = []
    monkeypatch.setattr(faults.os, "_exit", lambda code: exits.append(code))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    on_rank0 = faults.die_at(5, rank=1)
    on_rank0(5)
    monkeypatch.setenv("RANK", "1")
    on_rank1 = faults.die_at(5, rank=1)
    on_rank1(4)
    assert exits == []
    on_rank1(5)
    assert exits == [1]
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")     # the restarted attempt runs to the end
    faults.die_at(5, rank=1)(5)
    assert exits == [1]


def test_faults_cli_refuses_a_step_below_one(capsys):
    with pytest.raises(SystemExit):
        faults.main(["--fail-at-step", "0", "--epochs", "1"])
    assert "--fail-at-step must be >= 1" in capsys.readouterr().err