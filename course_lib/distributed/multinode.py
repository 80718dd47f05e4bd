"""Multi-node training with torchrun, run for real on one machine: N "nodes" on localhost.

On a real cluster you start ONE torchrun per machine; each starts `--nproc_per_node` workers
(one per GPU). Two machines with 4 GPUs each, node0 reachable as `node0:29500`:

    # on node0                                   # on node1
    torchrun --nnodes 2 --node_rank 0 \\          torchrun --nnodes 2 --node_rank 1 \\
      --nproc_per_node 4 --rdzv-backend c10d \\      --nproc_per_node 4 --rdzv-backend c10d \\
      --rdzv-endpoint node0:29500 --rdzv-id job1 \\  --rdzv-endpoint node0:29500 --rdzv-id job1 \\
      --max-restarts 3 -m course_lib.train \\        --max-restarts 3 -m course_lib.train \\
      --strategy ddp --checkpoint-dir $SHARED/ck     --strategy ddp --checkpoint-dir $SHARED/ck

(slurm/train_multinode.sbatch does the same through srun.) How the rendezvous works: the torchrun
on the endpoint's host serves a key-value store (c10d TCPStore) at that address; every torchrun
connects to it, announces itself, and once `--nnodes` agents have joined the store gives each
agent a group rank g (c10d decides the order; `--node_rank` only counts for the static backend)
and its workers RANK = g * nproc_per_node + LOCAL_RANK, WORLD_SIZE = nnodes * nproc_per_node.
LOCAL_RANK picks the GPU on a machine; RANK is the rank in the whole job (rank 0 logs and saves).
When a worker dies, every agent stops its workers and the group rendezvous again (at most
`--max-restarts` times; TORCHELASTIC_RESTART_COUNT tells the workers which attempt this is), so
training must resume from a checkpoint on storage every node can read.

Here every "node" is a torchrun process on 127.0.0.1 in its own session, with a deadline
(course_lib.processes.run_commands); on a timeout or a failing node every process tree is killed,
so no worker outlives the call:

    from course_lib.distributed.multinode import run_nodes, last_json
    results = run_nodes(["course_lib.train", "--strategy", "ddp", "--epochs", "1", "--json"], nnodes=2)
    last_json(results[0].stdout)["world_size"]    # -> 2
"""
from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass, field

from ..processes import run_commands
from ..validate import int_in_range, non_negative_int, positive_int
from .launch import free_port

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                      "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")


@dataclass
class NodeResult:
    """One torchrun process: its node rank, exit code (negative: killed by that signal), output."""

    node_rank: int
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    pids: list = field(default_factory=list)   # torchrun and every descendant seen while it ran


def torchrun_command(module_args, nnodes: int = 1, node_rank: int = 0, nproc_per_node: int = 1,
                     rdzv_endpoint: str | None = None, max_restarts: int = 0, rdzv_id: str = "course",
                     rdzv_conf: dict | None = None, python: str | None = None) -> list[str]:
    """argv for `python -m torch.distributed.run ... -m MODULE ARGS` (torchrun of this Python's torch).

    module_args: ["course_lib.train", "--epochs", "1", ...], the module first. Without
    rdzv_endpoint (one node only) torchrun runs `--standalone` on a free local port.
    """
    if isinstance(module_args, str) or not module_args or not all(isinstance(a, str) for a in module_args):
        raise TypeError(f"module_args must be a non-empty list of strings, module first; got {module_args!r}")
    positive_int("nnodes", nnodes)
    positive_int("nproc_per_node", nproc_per_node)
    int_in_range("node_rank", node_rank, 0, nnodes - 1, hint=f" (nnodes={nnodes})")
    non_negative_int("max_restarts", max_restarts)
    cmd = [python or sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
           "--nproc_per_node", str(nproc_per_node), "--max-restarts", str(max_restarts)]
    if rdzv_endpoint is None:
        if nnodes != 1:
            raise ValueError(f"nnodes={nnodes} needs rdzv_endpoint='HOST:PORT' (the rendezvous address)")
        cmd.append("--standalone")
    else:
        host, _, port = rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"rdzv_endpoint must be 'HOST:PORT'; got {rdzv_endpoint!r}")
        cmd += ["--node_rank", str(node_rank), "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
                "--rdzv-id", rdzv_id]
        if rdzv_conf:
            cmd += ["--rdzv-conf", ",".join(f"{k}={v}" for k, v in rdzv_conf.items())]
    return cmd + ["-m", *module_args]


def run_nodes(module_args, nnodes: int = 2, nproc_per_node: int = 1, max_restarts: int = 0,
              timeout: float = 120.0, env: dict | None = None, cwd=None) -> list[NodeResult]:
    """Start `nnodes` torchrun "nodes" on 127.0.0.1 that rendezvous (c10d) on a free port.

    Node 0 hosts the rendezvous store (is_host=1), as the endpoint machine does on a cluster.
    With nnodes=1 this is `torchrun --standalone`. Each node sees only its own GPUs (`node_gpus`).
    Returns one NodeResult per node.
    """
    positive_int("nnodes", nnodes)
    if env is not None and not isinstance(env, dict):
        raise TypeError(f"env must be a dict of extra variables or None; got {type(env).__name__}")
    envs = [{**node_gpus(rank, nnodes, nproc_per_node), **(env or {})} for rank in range(nnodes)]
    if nnodes == 1:
        commands = [torchrun_command(module_args, 1, 0, nproc_per_node, None, max_restarts)]
    else:
        endpoint = f"127.0.0.1:{free_port()}"
        commands = [torchrun_command(module_args, nnodes, rank, nproc_per_node, endpoint, max_restarts,
                                     rdzv_conf={"is_host": int(rank == 0)}) for rank in range(nnodes)]
    return [NodeResult(rank, *result) for rank, result in
            enumerate(run_commands(commands, timeout=timeout, env=envs, cwd=cwd))]


def node_gpus(node_rank: int, nnodes: int, nproc_per_node: int) -> dict:
    """CUDA_VISIBLE_DEVICES for one "node" on this machine: its own GPUs, as a real node has, or none.

    Every simulated node sees the same GPUs, and nccl refuses two ranks on one GPU; so each node
    gets its own `nproc_per_node` GPUs when there are enough for all, else none (gloo on the CPU).
    """
    import torch

    if not torch.cuda.is_available():
        return {}
    gpus = torch.cuda.device_count()
    if nnodes * nproc_per_node > gpus:
        return {"CUDA_VISIBLE_DEVICES": ""}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")        # the ids the child must name, if already narrowed
    ids = visible.split(",") if visible else [str(i) for i in range(gpus)]
    first = node_rank * nproc_per_node
    return {"CUDA_VISIBLE_DEVICES": ",".join(ids[first:first + nproc_per_node])}


def last_json(text: str) -> dict:
    """The last line of `text` that parses as a JSON object (course_lib.train --json prints one)."""
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    raise ValueError("no JSON object line in the output (was --json passed, and did rank 0 finish?)")


def whoami() -> dict:
    """What torchrun told this process (its environment), plus host and pid: a one-line JSON demo."""
    info = {name: os.environ.get(name) for name in TORCHRUN_VARIABLES}
    return {**info, "host": socket.gethostname(), "pid": os.getpid()}


if __name__ == "__main__":  # torchrun ... -m course_lib.distributed.multinode: each worker says who it is
    print(json.dumps(whoami()), flush=True)
