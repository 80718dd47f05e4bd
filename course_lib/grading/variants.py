"""Per-student variants of the practica: parameters drawn from the student's id, so two students cannot swap answers.

    from course_lib.grading.variants import student_id, variant
    variant(student_id(), "practicum_scale_out")       # {"world_size": 3, "seed": 41}, the same on every machine

The student's notebook and the grader derive the same values from the same id: while the student works,
the id is the JupyterHub user name; when grading, `course_lib.grading.grade.grade(..., student=...)` sets
COURSE_STUDENT_ID for the grader's checks and the sandbox (it wins over JUPYTERHUB_USER, which on a hub is
the grader's own name). Without an id ("anonymous": a self-paced learner, CI) every practicum gets the
DEFAULTS the notebooks' text describes. The draw hashes (TERM, exercise, parameter, id) with SHA-256 (Python's
hash() of a str changes from one process to the next): a new TERM gives every student new values, so last
term's answers do not fit this term's variants. TERM is set once per term, before the term's tag is cut
(docs/INSTRUCTOR_GUIDE.md, "A term"), and never during one: students' notebooks and the grader must agree.
"""
from __future__ import annotations

import contextlib
import hashlib
import os

ENV = "COURSE_STUDENT_ID"
ANONYMOUS = "anonymous"
TERM = "2026-fall"      # the term the variants are drawn for: change it when a new term starts

# exercise -> (what an anonymous learner gets, the choices a student id draws from). Every choice must be
# solvable within the practicum's time limits: tests/test_variants.py runs the solutions on several ids.
VARIANTS = {
    "practicum_scale_out": (
        {"world_size": 2, "seed": 3},
        {"world_size": (2, 3),                     # 3 ranks on 2 cores: slower, well inside run_ddp's deadline
         "seed": tuple(range(1, 100))},            # never 0: a sampler that ignores --seed must show
    ),
    "practicum_make_it_small": (
        {"budget": 50_000, "floor_drop": 0.010},
        {"budget": tuple(range(45_000, 55_001, 1_000)),    # the smallest size tier, bytes
         "floor_drop": (0.008, 0.009, 0.010, 0.011, 0.012)},   # accuracy may fall this much below the given model
    ),
}


def student_id() -> str:
    """The id variants are drawn from: $COURSE_STUDENT_ID (the grader's), else $JUPYTERHUB_USER, else "anonymous"."""
    for name in (ENV, "JUPYTERHUB_USER"):
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return ANONYMOUS


def variant(student: str, exercise: str) -> dict:
    """The parameters of `exercise` for `student` (case and surrounding blanks ignored); deterministic."""
    if exercise not in VARIANTS:
        raise ValueError(f"exercise must be one of {sorted(VARIANTS)}; got {exercise!r}")
    if not isinstance(student, str) or not student.strip():
        raise ValueError(f"student must be a non-empty str (a user or folder name); got {student!r}")
    defaults, choices = VARIANTS[exercise]
    key = student.strip().lower()
    if key == ANONYMOUS:
        return dict(defaults)
    out = {}
    for name, options in choices.items():
        digest = hashlib.sha256(f"{TERM}\0{exercise}\0{name}\0{key}".encode()).digest()
        out[name] = options[int.from_bytes(digest[:8], "big") % len(options)]
    return out


def describe(exercise: str, student: str | None = None) -> str:
    """One line for the notebook: whose variant this is and its values."""
    student = student_id() if student is None else student
    values = ", ".join(f"{k}={v!r}" for k, v in variant(student, exercise).items())
    how = ("no student id: the defaults. Not on JupyterHub? set COURSE_STUDENT_ID to your id before starting "
           "Jupyter" if student.strip().lower() == ANONYMOUS else "the grader uses the same values")
    return f"variant for student {student!r}: {values} ({how})"


@contextlib.contextmanager
def as_student(student: str | None):
    """Set COURSE_STUDENT_ID to `student` inside the block (None: leave the environment as it is).

    The grader's own process and every process it starts (the sandbox, torchrun) read it from there; the
    grader grades one submission per process (classroom forks), so changing os.environ is safe.
    """
    if student is None:
        yield
        return
    variant(student, "practicum_scale_out")          # validates the id
    previous = os.environ.get(ENV)
    os.environ[ENV] = student
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = previous
