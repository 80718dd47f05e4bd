"""Cheap tests of the practicum checks' own logic (no torchrun launch, no measuring process): the launch command
read by torchrun's own parser, the destroyed process group, the size tier's message. The end-to-end gradings are in
tests/test_checks_practicum_scale_out.py and tests/test_checks_practicum_make_it_small.py (slow)."""
import json
import sys

import pytest

from course_lib.checks import practicum_make_it_small as pm
from course_lib.checks import practicum_scale_out as ps
from course_lib.grading import make_it_small as mis
from course_lib.grading import scale_out_harness
from nbtools import ROOT, notebook_namespace

NS = notebook_namespace(ROOT / "solutions" / "practicum_scale_out.ipynb")
RUN = [sys.executable, "-m", "torch.distributed.run"]


def fake_probe(nproc, python=sys.executable):
    """run_probe's answer for a command that started `nproc` ranks of `python` in one group."""
    import torch

    def run_probe(command, timeout):
        cmd = command("/tmp/probe.py", 40123)
        out = "".join(json.dumps({"rank": r, "world_size": nproc, "sum": nproc * (nproc - 1) / 2, "python": python,
                                  "torch": torch.__version__}) + "\n" for r in range(nproc))
        return 0, out, "", False, cmd
    return run_probe


def launched(monkeypatch, torchrun_command, nproc=2):
    """check_torchrun_command on a run that went right: only what the command says is judged."""
    monkeypatch.setattr(ps, "run_probe", fake_probe(nproc))
    ps.check_torchrun_command(torchrun_command, nproc)


@pytest.mark.parametrize("nproc", [1, 2, 3])
def test_the_solutions_command_is_read_as_asked(monkeypatch, nproc):
    launched(monkeypatch, NS["torchrun_command"], nproc)


@pytest.mark.parametrize("right", [
    lambda s, n, p: RUN + [f"--nproc-per-node={n}", "--rdzv_backend=c10d", f"--rdzv_endpoint=localhost:{p}", s],
    lambda s, n, p: RUN + ["--nproc_per_node", str(n), "--master-addr", "127.0.0.1", "--master-port", str(p), s],
    lambda s, n, p: RUN + ["--nnodes=1:1", "--nproc_per_node", str(n), "--rdzv-backend", "c10d", "--rdzv-id", "job",
                           "--rdzv-endpoint", f"127.0.0.1:{p}", s, "--an-argument-of-the-script"],
], ids=["= and underscores, localhost", "static rendezvous on the port", "elastic 1:1, script arguments"])
def test_other_launches_on_the_given_port_pass(monkeypatch, right):
    launched(monkeypatch, right)


@pytest.mark.parametrize("wrong, words", [
    (lambda s, n, p: RUN + ["--standalone", "--nproc_per_node", str(n), s], "--standalone makes torchrun"),
    (lambda s, n, p: RUN + ["--standalone", "--nproc_per_node", str(n), "--rdzv-endpoint", f"127.0.0.1:{p}", s],
     "ignore any --rdzv-endpoint"),
    (lambda s, n, p: RUN + ["--nproc_per_node", str(n), "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29500",
                            s], "port 29500, not on the port 29517"),
    (lambda s, n, p: RUN + ["--nproc_per_node", str(n), "--master-port", "29500", s], "port 29500, not on the port"),
    (lambda s, n, p: RUN + ["--nproc_per_node", str(n), s], "free port of its own, as the command names no port"),
    (lambda s, n, p: RUN + ["--nproc_per_node", str(n), "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1", s],
     "port 29400, not on the port"),                                                              # c10d's default
    (lambda s, n, p: RUN + ["--nproc_per_node", str(n), "--rdzv-backend", "c10d", "--master-port", str(p), s],
     "backend c10d\\), port 29400"),                                  # c10d takes its port from the endpoint only
    (lambda s, n, p: RUN + ["--nproc_per_node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{p}", s],
     "--nproc_per_node 2 rank\\(s\\) per node: expected 1 rank$"),                                # nproc hard-coded
    (lambda s, n, p: RUN + ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{p}", s, "--nproc_per_node",
                            str(n)], "expected 2 ranks. \\['--nproc_per_node'\\] come after the script path"),
    (lambda s, n, p: RUN + ["--standalone", s], "\\(its default\\): expected 2 ranks"),
    (lambda s, n, p: RUN + ["--nnodes", "2", "--nproc_per_node", str(n), "--rdzv-backend", "c10d",
                            "--rdzv-endpoint", f"127.0.0.1:{p}", s], "--nnodes 2 makes torchrun wait"),
    (lambda s, n, p: RUN + ["--nproc_per_node", str(n), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                            f"127.0.0.1:{p}", "probe.py"], "reads 'probe.py' as the script to run"),
], ids=["standalone", "standalone with an endpoint", "endpoint port hard-coded", "master port hard-coded",
        "no port at all", "endpoint without a port", "c10d with --master-port", "nproc hard-coded",
        "options after the script", "the lecture's one-rank launch", "two nodes", "another script"])
def test_launches_that_ignore_what_they_were_given_fail_before_running(monkeypatch, wrong, words):
    def no_run(*args):
        raise AssertionError("the command ran")
    monkeypatch.setattr(ps, "run_probe", no_run)
    with pytest.raises(AssertionError, match=words) as failure:
        ps.check_torchrun_command(wrong)
    assert "the command ran" not in str(failure.value)


def test_a_command_torchrun_cannot_read_is_judged_by_its_run_and_its_port(monkeypatch):
    """Not `-m torch.distributed.run` nor `torchrun`: the run decides, then the port must be in the command."""
    runner = [sys.executable, "-c", "from torch.distributed.run import main; main()"]
    launched(monkeypatch, lambda s, n, p: runner + ["--nproc_per_node", str(n), "--rdzv-endpoint", f"127.0.0.1:{p}",
                                                    "--rdzv-backend", "c10d", s])
    with pytest.raises(AssertionError, match="never mentions the port 40123"):
        launched(monkeypatch, lambda s, n, p: runner + ["--standalone", "--nproc_per_node", str(n), s])


# --- the process group: destroyed at the end --------------------------------------------------------------------

def a_run(script: str) -> ps.ScriptRun:
    """What run_ddp returns for a run whose logs and printing are right, with `script` as the script it ran."""
    records = [{"epoch": e, "indices": [], "loss": 1.0, "noise_sum": 0.5} for e in range(2)]
    return ps.ScriptRun(0, False, 1.0, {"epochs": 2}, 2, logs={f"log_rank{r}.jsonl": records for r in range(2)},
                        stdout={0: "epoch 1/2: loss 1\nepoch 2/2: loss 1\n", 1: ""}, script=script)


def test_the_solutions_script_destroys_its_group():
    ps.check_rank_logs(a_run(NS["DDP_SCRIPT"]))


@pytest.mark.parametrize("old, new", [
    ("    dist.destroy_process_group()\n", ""),
    ("    dist.destroy_process_group()\n", "    # dist.destroy_process_group()\n"),
    ("    dist.destroy_process_group()\n", "    print('dist.destroy_process_group()')\n"),
], ids=["left out", "commented out", "only in a string"])
def test_a_script_that_never_destroys_its_group_fails(old, new):
    assert old in NS["DDP_SCRIPT"]
    with pytest.raises(AssertionError, match="never calls dist.destroy_process_group"):
        ps.check_rank_logs(a_run(NS["DDP_SCRIPT"].replace(old, new)))


@pytest.mark.parametrize("old, new", [
    ("import torch.distributed as dist\n", "import torch.distributed as dist\nfrom torch.distributed import *\n"),
    ("import torch.distributed as dist\n",
     "import torch.distributed as dist\nfrom torch.distributed import destroy_process_group as leave\n"),
], ids=["star import", "alias"])
def test_other_ways_to_destroy_the_group_pass(old, new):
    script = NS["DDP_SCRIPT"].replace(old, new)
    if "leave" in new:
        script = script.replace("    dist.destroy_process_group()\n", "    leave()\n")
    else:
        script = script.replace("    dist.destroy_process_group()\n", "    destroy_process_group()\n")
    ps.check_rank_logs(a_run(script))


def test_run_ddp_keeps_the_script_and_a_plain_run_is_not_judged(monkeypatch):
    plain = scale_out_harness.DDPRun(0, False, 1.0, {"epochs": 2}, 2)
    monkeypatch.setattr(scale_out_harness, "run_ddp", lambda *args, **kwargs: plain)
    run = ps.run_ddp("print(1)\n", quiet=True)
    assert isinstance(run, ps.ScriptRun) and run.script == "print(1)\n" and run.world_size == 2
    ps.check_rank_logs(a_run(""))        # no script (a DDPRun made elsewhere): the rest is judged


# --- make it small: the size tier's message ----------------------------------------------------------------------

def measured(code_bytes, contents=(("fc1.weight", "float32 [300, 784]", 940_800),)):
    return mis.Measurement(code="x" * code_bytes, accuracy=0.95, baseline=0.95, contents=list(contents))


@pytest.mark.parametrize("budget, words", [(47_500, "over the 47.5 KB budget \\(47,500 bytes\\)"),
                                           (200_000, "over the 200 KB budget")])
def test_the_budget_is_shown_as_it_is(budget, words):
    with pytest.raises(AssertionError, match=words):
        pm.check_budget(measured(budget + 1), budget)


def test_a_result_without_entries_names_none():
    with pytest.raises(AssertionError) as failure:
        pm.check_budget(measured(60_000, contents=()), 50_000)
    assert "biggest entries" not in str(failure.value)
    pm.check_budget(measured(40_000), 50_000)
