import io
import os
import subprocess
import sys

import pytest
import torch

from conftest import needs_mnist
from course_lib import env
from course_lib.env import DeviceUnavailableError, dist_info, doctor, get_device, pick, quick_mode, seed_everything

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
cpu_only = pytest.mark.skipif(torch.cuda.is_available() or env._mps_available(), reason="machine has an accelerator")


@cpu_only
def test_auto_is_cpu_without_an_accelerator():
    assert get_device("auto") == torch.device("cpu")
    assert get_device() == torch.device("cpu")


def test_explicit_cpu():
    assert get_device("cpu") == torch.device("cpu")


@no_cuda
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_missing_cuda_is_an_error_naming_the_device(name):
    with pytest.raises(DeviceUnavailableError, match=repr(name)) as info:
        get_device(name)
    assert isinstance(info.value, RuntimeError)


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "cpu:0", "", "CUDA"])
def test_bad_device_names_list_the_allowed_values(name):
    with pytest.raises(ValueError, match="auto.*cpu.*cuda"):
        get_device(name)


@pytest.mark.parametrize("name", [3, None])
def test_non_string_device_is_a_type_error(name):
    with pytest.raises(TypeError, match="cpu"):
        get_device(name)


def test_seed_everything_repeats_and_rank_changes_the_stream():
    assert seed_everything(7) == 7
    a = torch.rand(5)
    seed_everything(7)
    assert torch.equal(a, torch.rand(5))
    assert seed_everything(7, rank=1) == 8
    assert not torch.equal(a, torch.rand(5))


@pytest.mark.parametrize("seed, rank", [(-1, 0), (1.5, 0), ("1", 0), (1, -1), (1, "0")])
def test_seed_everything_rejects_bad_input(seed, rank):
    with pytest.raises(ValueError, match="seed" if seed in (-1, 1.5, "1") else "rank"):
        seed_everything(seed, rank)


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), (" ON ", True), ("0", False), ("", False)])
def test_quick_mode_and_pick_follow_course_quick(monkeypatch, value, expected):
    monkeypatch.setenv("COURSE_QUICK", value)
    assert quick_mode() is expected
    assert pick(100, 3) == (3 if expected else 100)


def test_quick_mode_is_off_when_unset(monkeypatch):
    monkeypatch.delenv("COURSE_QUICK", raising=False)
    assert not quick_mode() and pick("normal", "quick") == "normal"


def test_dist_info_defaults_and_torchrun_variables(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    info = dist_info()
    assert (info.rank, info.world_size, info.local_rank, info.is_main) == (0, 1, 0, True)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    info = dist_info()
    assert (info.rank, info.world_size, info.local_rank, info.is_main) == (3, 4, 1, False)


@pytest.mark.parametrize("var", ["RANK", "WORLD_SIZE", "LOCAL_RANK"])
def test_dist_info_rejects_non_integers(monkeypatch, var):
    monkeypatch.setenv(var, "two")
    with pytest.raises(ValueError, match=f"{var}.*'two'"):
        dist_info()


def test_describe_reports_the_facts_the_course_needs():
    facts = env.describe()
    assert facts["torch"] == torch.__version__
    assert facts["default_device"] == str(get_device("auto"))
    assert facts["cpu_cores"] >= 1 and isinstance(facts["gpus"], list)


def test_bf16_supported_on_cpu_is_a_bool():
    assert isinstance(env.bf16_supported("cpu"), bool)


@needs_mnist
def test_doctor_passes_with_data():
    out = io.StringIO()
    assert doctor(out) == 0
    assert "All good" in out.getvalue()


def test_doctor_fails_without_data_and_says_where_to_put_it(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("COURSE_DOWNLOAD", "0")
    out = io.StringIO()
    assert doctor(out) == 1
    text = out.getvalue()
    assert "COURSE_DATA_DIR" in text and str(tmp_path) in text and "cannot run" in text
    assert not any(tmp_path.iterdir()), "doctor must not write into the data folder"


def _run_doctor(**extra_env):
    environ = {**os.environ, **extra_env}
    return subprocess.run([sys.executable, "-m", "course_lib", "doctor"], env=environ,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@needs_mnist
def test_doctor_cli_exits_0_with_data():
    proc = _run_doctor()
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_doctor_cli_exits_1_without_data(tmp_path):
    proc = _run_doctor(COURSE_DATA_DIR=str(tmp_path), COURSE_DOWNLOAD="0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "COURSE_DATA_DIR" in proc.stdout


def test_review_fixes_bool_seed_torch_device_and_launch_env(monkeypatch):
    import torch as _torch
    from course_lib.env import dist_info, get_device, seed_everything
    with pytest.raises(ValueError, match="seed"):
        seed_everything(True)
    assert get_device(_torch.device("cpu")) == _torch.device("cpu")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="RANK=2, WORLD_SIZE=2"):
        dist_info()


def _fake_group(monkeypatch, backend: str, rank: int, gpus: int) -> None:
    """Pretend this process is rank `rank` of a process group on `backend`, seeing `gpus` GPUs."""
    monkeypatch.setattr(env.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(env.dist, "get_backend", lambda *a: backend)
    monkeypatch.setattr(env.dist, "get_rank", lambda *a: rank)
    monkeypatch.setattr(env.torch.cuda, "device_count", lambda: gpus)


@pytest.mark.parametrize("local_rank, gpus, expected", [
    ("1", 4, "cuda:1"),   # two nodes of 4 GPUs: global rank 5 is the second GPU of node 1, not cuda:5
    (None, 4, "cuda:1"),  # no LOCAL_RANK: the global rank, modulo the GPUs this process sees
    ("3", 1, "cuda:0"),   # one visible GPU per process (SLURM --gpus-per-task=1)
])
def test_rank_device_uses_the_local_rank(monkeypatch, local_rank, gpus, expected):
    _fake_group(monkeypatch, "nccl", rank=5, gpus=gpus)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert env.rank_device() == torch.device(expected)


def test_rank_device_is_the_cpu_under_gloo_and_without_a_group(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert env.rank_device() == torch.device("cpu")          # no process group in this test process
    _fake_group(monkeypatch, "gloo", rank=5, gpus=4)
    assert env.rank_device() == torch.device("cpu")
    _fake_group(monkeypatch, "nccl", rank=5, gpus=0)
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        env.rank_device()
    _fake_group(monkeypatch, "nccl", rank=5, gpus=4)
    monkeypatch.setenv("LOCAL_RANK", "one")
    with pytest.raises(ValueError, match="LOCAL_RANK.*'one'"):
        env.rank_device()


def test_importing_course_lib_freezes_the_collector_at_exit():
    """A process that imported course_lib skips the last collections over torch's objects at exit (~1 CPU-s)."""
    # atexit runs last-registered first: this handler, registered before the import, runs after course_lib's
    probe = ("import atexit, gc, sys\n"
             "atexit.register(lambda: sys.stdout.write(f'frozen {gc.get_freeze_count()}\\n'))\n"
             "import course_lib\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert int(out.stdout.split()[-1]) > 10_000, out.stdout
    # a nanobind extension loaded (triton >= 3.9): no freeze, or nanobind reports every object it holds as a leak
    fake = ("import types\n"
            "ext = types.ModuleType('fake_ext'); ext.__file__ = '/nowhere/fake_ext.so'\n"
            "ext.ir = types.ModuleType('fake_ext.ir')\n"
            "ext.ir.Attribute = type('nb_meta', (type,), {'__module__': 'nanobind'})('Attribute', (), {})\n"
            "sys.modules['fake_ext'] = ext\n")
    out = subprocess.run([sys.executable, "-c", probe + fake], capture_output=True, text=True, timeout=120, check=True)
    assert int(out.stdout.split()[-1]) == 0, out.stdout
