"""Notebook-style functions run on N ranks by sending their source."""
import pytest
import torch

from course_lib.distributed.launch import WorkerError
from course_lib.grading.student import compile_source, launch_student, student_source


def scaled_sum(tensor, factor):
    dist.all_reduce(tensor)  # noqa: F821 - `dist` is provided by the worker's namespace
    return tensor * factor + dist.get_rank()  # noqa: F821


def broken(tensor):
    raise ValueError("student bug")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_launch_student_runs_the_source_on_every_rank():
    out = launch_student(scaled_sum, 2, torch.ones(3), 2.0)
    assert [o.tolist() for o in out] == [[4.0] * 3, [5.0] * 3]


@pytest.mark.timeout(120)
def test_a_student_error_names_the_rank_and_the_message():
    with pytest.raises(WorkerError, match="student bug"):
        launch_student(broken, 2, torch.ones(1))


def test_source_and_bad_input():
    assert student_source(broken).startswith("def broken(tensor):")
    assert compile_source("def f(x):\n    return math.sqrt(x) + torch.ones(1).item()", "f")(4.0) == 3.0
    with pytest.raises(TypeError, match="def"):
        student_source(lambda t: t)
    with pytest.raises(ValueError, match="'g'"):
        compile_source("def f():\n    pass", "g")
    with pytest.raises(TypeError, match="source"):
        compile_source(b"def f(): pass", "f")
