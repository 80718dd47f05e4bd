"""The notebook launcher: results by rank, errors with rank and traceback, timeouts, no orphans."""
import time

import pytest

import launch_workers
from course_lib.distributed import workers
from course_lib.distributed.launch import WorkerError, choose_backend, launch
from course_lib.processes import alive


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 3])
def test_all_reduce_results_come_back_in_rank_order(world_size):
    out = launch(workers.all_reduce_sum, world_size, 3)
    expected = float(sum(range(1, world_size + 1)))
    assert out == [[expected] * 3] * world_size
    info = launch(workers.rank_info, 2)
    assert [i["rank"] for i in info] == [0, 1] == [i["env_rank"] for i in info]
    assert {i["backend"] for i in info} == {choose_backend(2)}


@pytest.mark.slow
def test_a_failing_rank_is_reported_with_its_traceback_and_the_rest_are_killed():
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        launch(launch_workers.fail_on_rank, 3, 2, timeout=60)
    assert time.monotonic() - t0 < 30, "the error must arrive in seconds, not at the timeout"
    err = info.value
    assert err.rank == 2 and "rank 2 failed" in str(err) and not err.rendezvous   # it failed inside fn
    assert "deliberate failure on rank 2" in err.remote_traceback and "fail_on_rank" in err.remote_traceback


@pytest.mark.slow
def test_timeout_kills_every_worker(tmp_path):
    with pytest.raises(TimeoutError, match="ranks \\[0, 1\\]"):
        launch(launch_workers.report_pid_then_sleep, 2, str(tmp_path), timeout=8)
    pids = [int((tmp_path / str(r)).read_text()) for r in range(2)]
    time.sleep(0.5)
    assert not any(alive(pid) for pid in pids), "no orphan worker may survive the launch"


@pytest.mark.slow
def test_a_process_a_worker_started_is_killed_with_it(tmp_path):
    with pytest.raises(TimeoutError):
        launch(launch_workers.start_child_then_sleep, 2, str(tmp_path), timeout=8)
    children = [int((tmp_path / f"child{r}").read_text()) for r in range(2)]
    assert not any(alive(pid) for pid in children), "a process started by a worker outlived the launch"


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="world_size"):
        launch(workers.rank_info, 0)
    with pytest.raises(ValueError, match="backend must be one of"):
        launch(workers.rank_info, 2, backend="mpi")
    with pytest.raises(ValueError, match="timeout"):
        launch(workers.rank_info, 2, timeout=0)

    def local_fn(rank, world_size):
        return rank

    with pytest.raises(ValueError, match="cannot import it"):
        launch(local_fn, 2)


@pytest.mark.skipif(__import__("torch").cuda.device_count() >= 2, reason="this machine has 2 GPUs")
def test_nccl_without_gpus_is_refused():
    with pytest.raises(ValueError, match="needs 2 CUDA GPUs"):
        choose_backend(2, "nccl")


def test_free_port_can_be_bound():
    import socket

    from course_lib.distributed.launch import free_port
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert 1024 <= port < 65536


@pytest.mark.slow
def test_each_rank_gets_its_own_copy_of_tensor_arguments():
    import torch
    out = launch(launch_workers.add_rank_in_place, 3, torch.zeros(2))
    assert out == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]


def test_workers_are_forked_from_a_server_that_imported_torch_where_there_is_one():
    import multiprocessing

    from course_lib.distributed.launch import _context
    expected = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    assert _context().get_start_method() == expected
    if expected == "forkserver":        # torch, and what the first optimizer or DDP would import: seconds per rank
        assert launch(launch_workers.loaded, 2, ["torch", "torch._dynamo"]) == [["torch", "torch._dynamo"]] * 2


def test_workers_see_the_launchers_environment_as_it_is_now(monkeypatch):
    launch(launch_workers.environment, 1, "COURSE_TEST_LAUNCH_ENV")      # the forkserver is running now
    monkeypatch.setenv("COURSE_TEST_LAUNCH_ENV", "set after the server started")
    assert launch(launch_workers.environment, 2, "COURSE_TEST_LAUNCH_ENV") == ["set after the server started"] * 2
    monkeypatch.delenv("COURSE_TEST_LAUNCH_ENV")
    assert launch(launch_workers.environment, 1, "COURSE_TEST_LAUNCH_ENV") == [None]


def test_workers_exit_when_their_launcher_is_killed(tmp_path):
    """A kernel restart kills the launcher with SIGKILL: no finally runs, yet its workers must not linger."""
    import signal
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, sys.argv[1]); import launch_workers; "
            "from course_lib.distributed.launch import launch; "
            "launch(launch_workers.report_pid_then_sleep, 2, sys.argv[2], timeout=120)")
    launcher = subprocess.Popen([sys.executable, "-c", code, str(launch_workers.__file__).rsplit("/", 1)[0],
                                 str(tmp_path)])
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / str(r)).exists() for r in range(2)) and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = [int((tmp_path / str(r)).read_text()) for r in range(2)]
        assert all(alive(pid) for pid in pids)
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids), "workers outlived their killed launcher"


GLOO_RACE = ("Traceback (most recent call last):\n  ...\nRuntimeError: Gloo connectFullMesh failed with [pair.cc:561] "
             "Connection closed by peer [127.0.0.1]:3740.\n")


@pytest.mark.parametrize("first, retried", [
    (WorkerError(1, GLOO_RACE, rendezvous=True), True),
    (WorkerError(1, GLOO_RACE, rendezvous=False), False),                 # after fn started: a real failure
    (WorkerError(0, "RuntimeError: the rank's own error\n", rendezvous=True), False),   # not Gloo's race
], ids=["gloo race while joining", "gloo error in fn", "other error while joining"])
def test_only_gloo_connect_failures_while_joining_start_the_ranks_once_more(monkeypatch, capsys, first, retried):
    from course_lib.distributed import launch as launch_module
    calls = []

    def once(*args):
        calls.append(args)
        if len(calls) == 1:
            raise first
        return ["second try"]
    monkeypatch.setattr(launch_module, "_launch_once", once)
    if retried:
        assert launch(workers.all_reduce_sum, 2) == ["second try"] and len(calls) == 2
        assert "could not connect to its peers (Gloo), before any work; starting the 2 ranks once more" in \
            capsys.readouterr().err
    else:
        with pytest.raises(WorkerError) as exc_info:
            launch(workers.all_reduce_sum, 2)
        assert exc_info.value is first and len(calls) == 1

