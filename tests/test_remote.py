"""course_lib.grading.remote / answers / wire: the student's objects behave, seen from the grader, as if they
lived in the grader's process (values, in-place changes, autograd, random state) while only plain data
crosses, and a sandbox that lies, hangs or dies is cut off."""
import os
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.grading import wire
from course_lib.grading.remote import Sandbox, SandboxLost, StudentError, is_remote

CODE = '''
import torch
import torch.nn.functional as F

def add(a, b):
    return a + b

def train_step(model, x, y, opt):
    model.train()
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()

def keep_view(t):
    global VIEW
    VIEW = t[:2]

def read_view():
    return VIEW.clone()

def freeze_first(model):
    model[0].weight.requires_grad_(False)

def clamp_twice(x):
    return x.clamp(0, 1) * 2

def count(n):
    yield from range(n)

class Box:
    def __init__(self, t):
        self.t, self.items = t, [1, 2]
    def bump(self):
        self.t += 1
        return self

def fail(kind):
    raise {"value": ValueError("bad value"), "exit": SystemExit(3), "custom": type("Oops", (Exception,), {})("x")}[kind]

def forever():
    while True:
        pass
'''


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    sandbox = Sandbox(tmp_path_factory.mktemp("sandbox"))
    sandbox.deadline = time.monotonic() + 120
    assert sandbox.run_cell(CODE)["status"] == "ok"
    yield sandbox
    sandbox.close()


@pytest.fixture
def names(box):
    box.deadline = time.monotonic() + 60
    return box.get(["add", "train_step", "freeze_first", "keep_view", "read_view", "clamp_twice", "count", "Box", "fail", "forever", "not_defined"])


def test_values_handles_and_missing_names(names):
    assert "not_defined" not in names and all(is_remote(f) for f in names.values())
    assert names["add"](2, 3) == 5 and names["add"].__name__ == "add"
    assert torch.equal(names["add"](torch.ones(2), torch.ones(2)), torch.full((2,), 2.0))
    assert list(names["count"](4)) == [0, 1, 2, 3]
    with pytest.raises(TypeError):
        names["add"]([1], (2,))


def test_in_place_changes_come_back_and_objects_stay_the_same(names):
    t = torch.zeros(3)
    obj = names["Box"](t)
    assert is_remote(obj) and obj.items == [1, 2] and len(obj.items) == 2
    obj.bump().bump()
    assert torch.equal(t, torch.full((3,), 2.0)), "the student's in-place update reached the grader's tensor"
    t.add_(10)                                          # and the grader's change reaches the student's object
    obj.bump()
    assert torch.equal(t, torch.full((3,), 13.0))


def test_a_view_the_student_keeps_sees_the_graders_refill(names):
    """A tensor the grader refills in place (as an optimizer's p.grad is) keeps its storage over there too, so a
    view the student's code kept (a momentum buffer aliasing the gradient) changes as it would in one process."""
    t = torch.zeros(3)
    names["keep_view"](t)
    t.fill_(5.0)
    assert torch.equal(names["read_view"](), torch.full((2,), 5.0))


def test_requires_grad_comes_back_both_ways(names):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    names["freeze_first"](model)
    assert not model[0].weight.requires_grad and model[0].bias.requires_grad
    model[0].weight.requires_grad_(True)                 # the grader's change reaches the sandbox's copy
    names["freeze_first"](model)
    assert not model[0].weight.requires_grad


def test_training_steps_match_one_process(names):
    """Parameters, .grad, .training and the optimizer's momentum across calls, with dropout drawn from the
    grader's random state: the same losses and weights as the same steps in one process."""
    def make():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 3))
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(16, 6, generator=torch.Generator().manual_seed(1)), torch.arange(16) % 3
    (remote_model, remote_opt), (local_model, local_opt) = make(), make()
    remote_model.eval()
    remote_losses, local_losses = [], []
    for step in range(4):
        torch.manual_seed(step)
        remote_losses.append(names["train_step"](remote_model, x, y, remote_opt))
        torch.manual_seed(step)
        local_model.train()
        local_opt.zero_grad()
        loss = F.cross_entropy(local_model(x), y)
        loss.backward()
        local_opt.step()
        local_losses.append(loss.item())
    assert remote_losses == pytest.approx(local_losses, rel=1e-5)
    assert remote_model.training and remote_model[0].weight.grad is not None
    for a, b in zip(remote_model.parameters(), local_model.parameters()):
        torch.testing.assert_close(a, b)


def test_autograd_through_the_students_function(names):
    x = torch.tensor([0.5, 2.0, -1.0], requires_grad=True)
    (names["clamp_twice"](x) * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    reference = torch.tensor([0.5, 2.0, -1.0], requires_grad=True)
    (reference.clamp(0, 1) * 2 * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    torch.testing.assert_close(x.grad, reference.grad)


def test_the_students_exceptions_arrive_typed_and_never_as_system_exit(names):
    with pytest.raises(ValueError, match="bad value") as info:
        names["fail"]("value")
    assert isinstance(info.value, StudentError)
    with pytest.raises(StudentError, match="SystemExit"):
        names["fail"]("exit")
    with pytest.raises(StudentError, match="Oops"):
        names["fail"]("custom")


def test_a_reply_that_is_not_plain_data_is_refused(tmp_path):
    """The student rewrites the sandbox's server to answer with a pickled object whose unpickling would
    run a command: the grader refuses the reply (weights_only) and the command never runs."""
    proof = tmp_path / "pwned"
    sandbox = Sandbox(tmp_path)
    sandbox.deadline = time.monotonic() + 60
    try:
        sandbox.run_cell(
            "import os, course_lib.grading.answers as a\n"
            "class Evil:\n"
            f"    def __reduce__(self):\n        return (os.system, ('touch {proof}',))\n"
            "a.handle = lambda shell, message: {'value': Evil()}\n"
            "def f():\n    return 1")
        f = sandbox.get(["f"])
    except SandboxLost as exc:
        assert "malformed" in str(exc) or "not plain data" in str(exc)
    else:
        pytest.fail(f"the grader accepted {f!r}")
    assert not proof.exists() and not Path(f"/tmp/{proof.name}").exists()


@pytest.mark.slow
def test_a_hang_runs_into_the_deadline_and_the_sandbox_is_killed(tmp_path):
    sandbox = Sandbox(tmp_path)
    sandbox.deadline = time.monotonic() + 60
    sandbox.run_cell(CODE)
    forever = sandbox.get(["forever"])["forever"]
    sandbox.deadline = time.monotonic() + 3
    start = time.monotonic()
    with pytest.raises(SandboxLost, match="time limit"):
        forever()
    assert time.monotonic() - start < 15 and sandbox.proc.poll() is not None


def test_decode_accepts_plain_data_only():
    assert wire.decode({"a": [1, (2.0, "x")], "r": (wire.TAG, "range", (0, 3, 1))}, None) == \
        {"a": [1, (2.0, "x")], "r": range(3)}
    for bad in (object(), [1, {2: Path("x")}], (wire.TAG, "nope", 1), (wire.TAG, "range", ("0", 1, 1))):
        with pytest.raises(wire.ProtocolError):
            wire.decode(bad, None)


@pytest.mark.slow
def test_the_sandbox_cannot_see_the_grader_environment_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_SOLUTIONS_DIR", str(tmp_path / "private"))
    sandbox = Sandbox(tmp_path)
    sandbox.deadline = time.monotonic() + 60
    try:
        sandbox.run_cell("import os\nsolutions = os.environ.get('COURSE_SOLUTIONS_DIR')")
        assert sandbox.get(["solutions"])["solutions"] is None
    finally:
        sandbox.close()
    assert os.environ["COURSE_SOLUTIONS_DIR"]
