"""Multi-node torchrun on localhost, elastic restarts from checkpoints, the SLURM template, no orphans.

The torchrun tests start real torchrun processes (two "nodes" on 127.0.0.1, or one standalone
node with a worker killed mid-training) and then check that no process they started is left.
"""
import os
import subprocess
import sys

import pytest
import torch

from course_lib.distributed import multinode
from course_lib.distributed.multinode import last_json, torchrun_command, whoami
from nbtools import ROOT

SBATCH = ROOT / "slurm" / "train_multinode.sbatch"


# --- argv ------------------------------------------------------------------------------------

def test_torchrun_command_uses_this_python_and_the_rendezvous():
    cmd = torchrun_command(["course_lib.train", "--epochs", "1"], nnodes=2, node_rank=1, nproc_per_node=4,
                           rdzv_endpoint="node0:29500", max_restarts=3)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    text = " ".join(cmd)
    for part in ("--nnodes 2", "--node_rank 1", "--nproc_per_node 4", "--rdzv-backend c10d",
                 "--rdzv-endpoint node0:29500", "--max-restarts 3"):
        assert part in text
    assert cmd[-4:] == ["-m", "course_lib.train", "--epochs", "1"] and "--standalone" not in cmd
    single = torchrun_command(["course_lib.train"], nproc_per_node=2)
    assert "--standalone" in single and "--rdzv-endpoint" not in single


@pytest.mark.parametrize("kwargs, error", [
    ({"module_args": "course_lib.train"}, TypeError),
    ({"module_args": []}, TypeError),
    ({"nnodes": 0}, ValueError),
    ({"nproc_per_node": True}, ValueError),
    ({"nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"}, ValueError),
    ({"nnodes": 2}, ValueError),                                 # several nodes need an endpoint
    ({"rdzv_endpoint": "no-port"}, ValueError),
    ({"max_restarts": -1}, ValueError),
])
def test_torchrun_command_rejects_bad_input(kwargs, error):
    kwargs = {"module_args": ["course_lib.train"], **kwargs}
    with pytest.raises(error):
        torchrun_command(**kwargs)


def test_last_json_and_whoami(monkeypatch):
    assert last_json('log line\n{"world_size": 2}\n[1, 2]\nbye\n') == {"world_size": 2}
    with pytest.raises(ValueError, match="no JSON object"):
        last_json("no summary here\n[1]")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    me = whoami()
    assert me["RANK"] == "3" and me["LOCAL_RANK"] == "1" and me["pid"] == os.getpid()


# --- SLURM template ------------------------------------------------------------------------------

def test_sbatch_template_is_valid_bash_and_runs_course_lib_train():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    text = SBATCH.read_text()
    assert "torch.distributed.run" in text and "-m course_lib.train --strategy ddp" in text
    assert "scontrol show hostnames" in text and "--rdzv-backend c10d" in text and "#SBATCH --requeue" in text


def test_sbatch_template_builds_the_torchrun_command(tmp_path):
    """Run the script with stand-ins for srun, scontrol and python; check the argv torchrun gets."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fakes = {
        "srun": '#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n',
        "scontrol": '#!/bin/bash\n[[ $1 == show ]] && printf "gpu-a17\\ngpu-a18\\n"\n',
        "fakepython": f'#!/bin/bash\nprintf "%s\\n" "$@" > "{tmp_path}/argv"\n',
    }
    for name, body in fakes.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(bin_dir / "fakepython"),
           "SLURM_JOB_NODELIST": "gpu-a[17-18]", "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_NAME": "t",
           "SLURM_JOB_ID": "4242", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_GPUS_ON_NODE": "4"}
    done = subprocess.run(["bash", str(SBATCH), "--epochs", "2"], env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    argv = (tmp_path / "argv").read_text().split("\n")[:-1]
    text = " ".join(argv)
    assert argv[:2] == ["-m", "torch.distributed.run"]
    for part in ("--nnodes 2", "--node_rank 1", "--nproc_per_node 4", "--rdzv-endpoint gpu-a17:29500",
                 "--rdzv-id 4242", "--max-restarts 3", "-m course_lib.train --strategy ddp",
                 f"--checkpoint-dir {tmp_path}/checkpoints/t", "--resume"):
        assert part in text, part
    assert argv[-2:] == ["--epochs", "2"]
    assert (tmp_path / "checkpoints" / "t").is_dir()


# --- real torchrun: lecture 08 runs both in quick mode and asserts what a test here would (cells 6 and 14-15): two
# single-process "nodes" train as one world of 2 with only rank 0 printing; a rank killed after step 5 of 8
# (checkpoints every 3) restarts mid-epoch, crosses into the next epoch and ends with the uninterrupted run's
# weights, no worker left behind. Not repeated here: each is half a minute of torchrun. -------------------------


@pytest.mark.parametrize("gpus, visible, nproc, expected", [
    (0, None, 1, [{}, {}]),                                                  # no GPU: nothing to hide
    (1, None, 1, [{"CUDA_VISIBLE_DEVICES": ""}] * 2),                        # one GPU, two nodes: nccl would refuse
    (4, None, 2, [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]),
    (2, "5,7", 1, [{"CUDA_VISIBLE_DEVICES": "5"}, {"CUDA_VISIBLE_DEVICES": "7"}]),   # already narrowed
])
def test_each_simulated_node_sees_only_its_own_gpus(monkeypatch, gpus, visible, nproc, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert [multinode.node_gpus(rank, 2, nproc) for rank in range(2)] == expected
