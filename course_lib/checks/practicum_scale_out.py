"""Checks for solutions/practicum_scale_out.ipynb: run the learner's DDP script for real, then inspect it.

`run_ddp(script)` (course_lib.grading.scale_out_harness) runs the script under torchrun on the student's
variant of 2 or 3 CPU ranks and a seed (course_lib.grading.variants) and reads back what it did: each rank's
output, the files it wrote, every torch.save with its rank, the exit code (a DDPRun). The checks compare it
with facts, not with a copy of the solution:

- logs: one log file per rank, progress printed by rank 0 only;
- sampler: each rank's samples per epoch are torch's `DistributedSampler(seed=..)` after `set_epoch(e)`;
- seeding: the ranks drew different augmentation noise;
- checkpoint: one file, saved by rank 0 only, that loads into a plain LeNet300;
- equivalence: the final weights equal those of the given single-process script
  (`course_lib.grading.scale_out`) run on the global batch (world_size x batch) with the same sample order;
- the launch command: torchrun's own parser reads it (for several rank counts and ports, without running it)
  as the given number of ranks on one node rendezvousing on the given port, and it starts N ranks of this
  Python's torch that form one group;
- the process group is destroyed at the end: `run_ddp` here keeps the script's text on its result (a
  ScriptRun), and check_rank_logs looks for the call, which leaves no trace in what a gloo run does.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.data.distributed import DistributedSampler

from ..grading import scale_out_harness
from ..grading.scale_out_harness import (  # noqa: F401 - re-exported: the cells call single_process_reference
    SETTINGS, WORLD_SIZE, DDPRun, failed_rank, run_probe, single_process_reference, student_settings, tail)
from ..models import LeNet300
from . import calls_function, expect, expect_close, passed


@dataclasses.dataclass
class ScriptRun(DDPRun):
    """A DDPRun that keeps the script it ran: what a run cannot show (a missing destroy_process_group) is read there."""

    script: str = ""


def run_ddp(script: str, world_size: int | None = None, timeout: float = 90.0, quiet: bool = False,
            **overrides) -> ScriptRun:
    """course_lib.grading.scale_out_harness.run_ddp, whose result also keeps `script`."""
    run = scale_out_harness.run_ddp(script, world_size, timeout, quiet, **overrides)
    return ScriptRun(**{f.name: getattr(run, f.name) for f in dataclasses.fields(run)}, script=script)


def _expect_success(run) -> None:
    expect(not run.timed_out,
           f"the script did not finish within the deadline ({run.seconds:.0f} s): a rank waiting in a collective "
           "that another rank never joins? (e.g. a barrier, or DDP's forward/backward, run by rank 0 only)")
    expect(run.returncode == 0, f"the script failed (exit code {run.returncode}). Rank {failed_rank(run)}'s "
           f"error output ends with:\n{tail(run.stderr.get(failed_rank(run), run.console))}")


def _rank_log(run, rank: int) -> list:
    name = f"log_rank{rank}.jsonl"
    expect(name in run.logs, f"no {name}: each rank must write its own log, log_rank{{rank}}.jsonl (found "
           f"{sorted(run.logs) or 'no .jsonl file'}). "
           + ("All ranks appending to one log.jsonl interleave their lines and lose whose they were."
              if "log.jsonl" in run.logs else ""))
    return run.logs[name]


def check_rank_logs(run) -> None:
    """One log_rank{r}.jsonl per rank with a record per epoch; progress lines printed by rank 0 only."""
    _expect_success(run)
    epochs = run.settings["epochs"]
    for rank in range(run.world_size):
        records = _rank_log(run, rank)
        expect([r.get("epoch") for r in records] == list(range(epochs)),
               f"log_rank{rank}.jsonl should hold one record per epoch (epochs 0..{epochs - 1}); got epochs "
               f"{[r.get('epoch') for r in records]}")
    lines = {rank: [ln for ln in run.stdout.get(rank, "").splitlines() if ln.startswith("epoch")]
             for rank in range(run.world_size)}
    expect(len(lines[0]) == epochs, f"rank 0 should print {epochs} progress lines ('epoch ...'), one per epoch; "
           f"it printed {len(lines[0])}")
    chatty = [rank for rank in range(1, run.world_size) if lines[rank]]
    expect(not chatty, f"ranks {chatty} printed progress lines too: with N ranks the console shows every line N "
           "times. Print from rank 0 only (the per-rank details belong in log_rank{rank}.jsonl).")
    script = getattr(run, "script", "")     # a DDPRun made without this module's run_ddp has none: not judged
    expect(not script or calls_function(script, "destroy_process_group"),
           "the script never calls dist.destroy_process_group(): end main() with it (task item 1), so that every "
           "rank leaves the group cleanly; with NCCL a rank that exits without it can hang the others' last "
           "collective, and PyTorch warns.")
    passed("rank_logs")


def expected_indices(n: int, rank: int, world_size: int, epoch: int, seed: int) -> list[int]:
    """The samples rank `rank` should train on in `epoch`: torch's DistributedSampler decides."""
    sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def check_sampler(run) -> None:
    """Each rank's samples per epoch are DistributedSampler(seed=--seed)'s after set_epoch(epoch)."""
    _expect_success(run)
    n, seed, world = run.settings["samples"], run.settings["seed"], run.world_size
    logs = {rank: _rank_log(run, rank) for rank in range(world)}
    for rank in range(world):
        got = [record.get("indices") for record in logs[rank]]
        expect(not any(sorted(g or []) == list(range(n)) for g in got),
               f"rank {rank} trained on all {n} samples in an epoch: every rank repeats the whole dataset, so N "
               "ranks do N times the work for nothing. Give the DataLoader a DistributedSampler.")
        expect(len(got) < 2 or got[1] != got[0],
               f"rank {rank} trained on the same samples in the same order in epochs 0 and 1: call "
               "sampler.set_epoch(epoch) at the start of every epoch, or every epoch repeats the first one.")
        for epoch, indices in enumerate(got):
            want = expected_indices(n, rank, world, epoch, seed)
            if indices != want and indices == expected_indices(n, rank, world, epoch, 0):
                raise AssertionError(f"rank {rank}, epoch {epoch}: these are DistributedSampler's samples for seed 0, "
                                     f"but the run used --seed {seed}. Pass seed=args.seed to DistributedSampler.")
            expect(indices == want, f"rank {rank}, epoch {epoch}: expected DistributedSampler's samples "
                   f"{want[:8]}... ({len(want)} of them), got {(indices or [])[:8]}... ({len(indices or [])}). Hint: "
                   "DistributedSampler(dataset, shuffle=True, seed=args.seed), set_epoch(epoch), and no shuffle= "
                   "in the DataLoader.")
    passed("sampler")


def check_seeding(run) -> None:
    """The ranks drew different random noise (seeded with seed + rank), every epoch."""
    _expect_success(run)
    sums = {rank: [record.get("noise_sum") for record in _rank_log(run, rank)] for rank in range(run.world_size)}
    expect(all(len(s) == run.settings["epochs"] and all(isinstance(v, float) for v in s) for s in sums.values()),
           "every record in log_rank{rank}.jsonl needs the script's float noise_sum; keep the logging as given")
    for epoch in range(run.settings["epochs"]):
        values = [sums[rank][epoch] for rank in range(run.world_size)]
        expect(len(set(values)) == len(values),
               f"epoch {epoch}: the ranks drew identical noise (noise sums {values}). With the same seed on every "
               "rank, all ranks 'augment' their samples with the same random numbers. Seed with args.seed + rank "
               "(DDP still starts every rank from rank 0's weights).")
    passed("seeding")


def check_checkpoint(run) -> None:
    """checkpoint.pt is the only checkpoint, saved by rank 0 only, and loads into a plain LeNet300."""
    _expect_success(run)
    writers = sorted({str(s.get("rank")) for s in run.saves})
    expect(run.saves, "the script never called torch.save: write checkpoint.pt after every epoch, as the given "
           "script does")
    expect(writers == ["0"], f"torch.save was called by ranks {writers}: after the all-reduce every rank holds the "
           "same weights, so one writer is enough, and several writers race on the same file. Save on rank 0 only.")
    saved = [f for f in run.files if f.endswith((".pt", ".pth", ".ckpt"))]
    expect(saved == ["checkpoint.pt"], f"expected exactly one checkpoint, checkpoint.pt; the script left {saved}")
    state = run.checkpoint or {}
    expect("unloadable" not in state, f"checkpoint.pt does not load: {state.get('unloadable')}")
    expect({"epoch", "model", "optimizer"} <= set(state), f"checkpoint.pt should hold epoch, model and optimizer "
           f"(as the given script saves); it holds {sorted(state)}")
    expect(state["epoch"] == run.settings["epochs"] - 1,
           f"the checkpoint is from epoch {state['epoch']}, not the last epoch {run.settings['epochs'] - 1}")
    keys = list(state["model"])
    expect(not any(k.startswith("module.") for k in keys),
           "the model's keys start with 'module.': that is the DDP wrapper's state_dict. Save "
           "model.module.state_dict() so the checkpoint loads into a plain LeNet300 (for evaluation, or a run on "
           "a different number of ranks).")
    try:
        LeNet300().load_state_dict(state["model"])
    except RuntimeError as exc:
        raise AssertionError(f"checkpoint.pt's model does not load into LeNet300: {exc}") from None
    passed("checkpoint")


def check_equivalence(run, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """The DDP run's final weights equal the single-process script's at the global batch (same order)."""
    _expect_success(run)
    expect(run.checkpoint and "model" in run.checkpoint, "no loadable checkpoint.pt with a 'model' to compare")
    reference = single_process_reference(run)["checkpoint"]["model"]
    got = {k.removeprefix("module."): v for k, v in run.checkpoint["model"].items()}
    expect(set(got) == set(reference),
           f"the checkpoint's parameters {sorted(got)} are not LeNet300's {sorted(reference)}")
    for name, want in reference.items():
        expect_close(got[name], want, f"final weights {name} vs one process with batch "
                     f"{run.world_size} x {run.settings['batch_size']}", atol=atol, rtol=rtol,
                     hint="N ranks x batch B must train exactly like one process with batch N*B on the same samples: "
                     "same initial weights on rank 0 (torch.manual_seed(args.seed + rank)), the same --lr (no "
                     "scaling here), DistributedSampler(seed=args.seed) with set_epoch, and DDP to average gradients.")
    passed("equivalence")


def _torchrun_options(cmd: list) -> list | None:
    """What torchrun itself parses in `cmd`: the arguments after `-m torch.distributed.run` or a `torchrun`
    executable; None when `cmd` is neither (then only the run judges it)."""
    for i, arg in enumerate(cmd):
        if arg == "-m" and cmd[i + 1:i + 2] == ["torch.distributed.run"]:
            return cmd[i + 2:]
        if arg == "-mtorch.distributed.run" or Path(arg).name == "torchrun":
            return cmd[i + 1:]
    return None


def _launch_plan(cmd: list):
    """torchrun's own reading of `cmd` (an argparse Namespace), or None when it is not a torchrun command or
    torchrun would refuse its options (the run then shows torchrun's own error)."""
    from torch.distributed.run import get_args_parser
    options = _torchrun_options(cmd)
    if options is None:
        return None
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            return get_args_parser().parse_args(options)
        except SystemExit:
            return None


def _rendezvous_port(plan) -> tuple[str, int | None]:
    """(endpoint, port) of the rendezvous, resolved as torch.distributed.run.run resolves them (torch 2.14):
    --standalone, and a static rendezvous on one node that names neither endpoint nor --master-port, take a free
    port of their own (port 0); c10d without a port takes 29400; None where torchrun would refuse the endpoint."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
    backend, endpoint = plan.rdzv_backend, plan.rdzv_endpoint
    if plan.standalone or (backend == "static" and not endpoint and plan.master_port is None):   # one node here
        return "localhost:0", 0
    if backend == "static" and not endpoint:
        endpoint = f"{plan.master_addr}:{plan.master_port}"
    try:
        return endpoint, parse_rendezvous_endpoint(endpoint, 29400 if backend == "c10d" else -1)[1]
    except ValueError:
        return endpoint, None


def _judge_plan(cmd: list, script: str, nproc: int, port: int) -> None:
    """What torchrun would do with `cmd`, read by its own parser without running anything: `nproc` ranks of
    `script` on one node, rendezvousing on `port`. Commands torchrun cannot read are left to the run."""
    plan = _launch_plan(cmd)
    if plan is None:
        return
    call = f"torchrun_command(script, {nproc}, {port})"
    expect(os.path.abspath(plan.training_script) == os.path.abspath(script),
           f"{call} = {cmd}: torchrun reads {plan.training_script!r} as the script to run, not the script it was "
           "given; the script path comes right after torchrun's own options")
    late = [a for a in plan.training_script_args if a.startswith("--")][:3]
    expect(plan.nproc_per_node == str(nproc),
           f"{call} = {cmd}: torchrun starts --nproc_per_node {plan.nproc_per_node} rank(s) per node"
           + (" (its default)" if plan.nproc_per_node == "1" and "nproc" not in " ".join(cmd) else "")
           + f": expected {nproc} rank{'s' if nproc != 1 else ''}"
           + (f". {late} come after the script path, so torchrun hands them to the script: its own options go "
              "before the script" if late else ""))
    expect(plan.nnodes in ("1", "1:1"), f"{call} = {cmd}: --nnodes {plan.nnodes} makes torchrun wait for other "
                                        "machines; this is one node (--nnodes 1)")
    expect(not plan.standalone, f"{call} = {cmd}: --standalone makes torchrun rendezvous on a free port of its own "
                                "and ignore any --rdzv-endpoint; the caller gave you the port: leave --standalone "
                                f"out and rendezvous with --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port}")
    endpoint, got = _rendezvous_port(plan)
    expect(got == port, f"{call} = {cmd}: torchrun would rendezvous "
           + ("on a free port of its own, as the command names no port" if got == 0 else
              f"on {endpoint or 'its default endpoint'} (backend {plan.rdzv_backend}), port {got}")
           + f", not on the port {port} it was given. Another launch on this machine may hold the port it picks; "
           "rendezvous on the one you are given (--rdzv-endpoint 127.0.0.1:<port>).")


def check_torchrun_command(torchrun_command, nproc: int = 2, timeout: float = 60.0) -> None:
    """torchrun_command(script, nproc_per_node, port) -> argv that starts nproc ranks of this Python's torch,
    rendezvousing on `port`."""
    ports = []

    def command(script, port, ranks=nproc):
        cmd = torchrun_command(script, ranks, port)
        expect(isinstance(cmd, (list, tuple)) and cmd and all(isinstance(a, str) for a in cmd),
               f"return the command as a list of strings (an argv for subprocess.run); got {cmd!r}")
        ports.append(port)
        return list(cmd)

    script = os.path.join(tempfile.gettempdir(), "scale_out_probe", "probe.py")
    for ranks, port in ((nproc, 29517), (1 if nproc > 1 else 2, 41871), (nproc + 2, 35129)):   # no torch default
        _judge_plan(command(script, port, ranks), script, ranks, port)
    code, out, err, timed_out, cmd = run_probe(command, timeout)
    expect(not timed_out, f"the command did not finish within {timeout:.0f} s: {cmd}")
    expect(code == 0, f"the command failed (exit code {code}): {cmd}\n{tail(out + err)}")
    reports = []
    for text in re.findall(r"\{[^{}]*\}", out):   # torchrun may prefix a rank's lines
        try:
            reports.append(json.loads(text))
        except ValueError:
            continue
    ranks = sorted(r.get("rank") for r in reports)
    expect(ranks == list(range(nproc)), f"expected {nproc} ranks (0..{nproc - 1}) to report, got ranks {ranks}. "
           f"Hint: --nproc_per_node, and the script path after torchrun's own options. The command printed:\n"
           f"{tail(out + err)}")
    for r in reports:
        expect(r["world_size"] == nproc and r["sum"] == nproc * (nproc - 1) / 2,
               f"rank {r['rank']} saw world_size {r['world_size']} (expected {nproc}): the ranks did not form "
               "one group")
        expect(r["python"] == sys.executable and r["torch"] == torch.__version__,
               f"the ranks ran {r['python']} (torch {r['torch']}), not this kernel's {sys.executable} (torch "
               f"{torch.__version__}): a `torchrun` found on PATH may belong to another environment. Use "
               "[sys.executable, '-m', 'torch.distributed.run', ...].")
    expect(_launch_plan(cmd) is not None or re.search(rf"(?<![0-9]){ports[-1]}(?![0-9])", " ".join(cmd)),
           f"the command {cmd} never mentions the port {ports[-1]} it was given: the ranks met on a port of their "
           "own choosing, which another launch on this machine may hold. Rendezvous on the port you are given.")
    passed("torchrun_command")
