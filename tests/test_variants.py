"""Per-student variants: the same id gives the same parameters everywhere, different ids different ones, and the
grader hands the submission's student to its checks and to the sandbox."""
import os
import subprocess
import sys

import pytest

from course_lib.grading import variants
from course_lib.grading.make_it_small import student_terms
from course_lib.grading.scale_out_harness import student_settings


@pytest.mark.parametrize("exercise", sorted(variants.VARIANTS))
def test_ids_draw_values_from_the_choices_and_anonymous_gets_the_defaults(exercise):
    defaults, choices = variants.VARIANTS[exercise]
    assert variants.variant("anonymous", exercise) == defaults
    drawn = [variants.variant(f"student{i}", exercise) for i in range(40)]
    for values in drawn:
        assert set(values) == set(choices) and all(values[k] in choices[k] for k in choices)
    for name in choices:                                  # the ids spread over the choices
        assert len({values[name] for values in drawn}) >= min(2, len(choices[name]))
    assert variants.variant("alice", exercise) != variants.variant("bob", exercise)
    assert variants.variant(" Alice ", exercise) == variants.variant("alice", exercise)


def test_the_draw_is_the_same_in_another_process():
    """hashlib, not hash(): a fresh interpreter with another PYTHONHASHSEED draws the same values."""
    code = "from course_lib.grading.variants import variant; print(variant('alice', 'practicum_scale_out'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout
    assert out.strip() == str(variants.variant("alice", "practicum_scale_out"))


def test_student_id_the_graders_id_wins_over_the_hub_user(monkeypatch):
    monkeypatch.delenv("COURSE_STUDENT_ID", raising=False)
    monkeypatch.delenv("JUPYTERHUB_USER", raising=False)
    assert variants.student_id() == "anonymous"
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    assert variants.student_id() == "alice"
    monkeypatch.setenv("COURSE_STUDENT_ID", "bob")      # a TA grading on the hub: the submission's student counts
    assert variants.student_id() == "bob"
    with variants.as_student("carol"):
        assert variants.student_id() == "carol" and os.environ["COURSE_STUDENT_ID"] == "carol"
    assert os.environ["COURSE_STUDENT_ID"] == "bob"


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="exercise must be one of"):
        variants.variant("alice", "practicum_nope")
    with pytest.raises(ValueError, match="student must be"):
        variants.variant("  ", "practicum_scale_out")


def test_the_practica_read_the_variant_of_the_current_student(monkeypatch):
    monkeypatch.setenv("COURSE_STUDENT_ID", "alice")
    assert student_settings() == student_settings("alice") != student_settings("bob")
    assert student_terms() == student_terms("alice") != student_terms("bob")
    assert "variant for student 'alice'" in variants.describe("practicum_scale_out")
    monkeypatch.setenv("COURSE_STUDENT_ID", "anonymous")
    assert "COURSE_STUDENT_ID" in variants.describe("practicum_make_it_small")


def test_grade_hands_the_student_to_its_checks_and_to_the_sandbox(tmp_path, monkeypatch):
    """An answer cell reports the id the sandbox sees; the test cell (run in the grader) compares both with the
    variant of the student passed to grade()."""
    import nbformat

    from course_lib.grading import grade

    def meta(kind, grade_id):
        return {"grade": kind == "test", "solution": kind == "answer", "locked": kind == "test",
                "grade_id": grade_id, "schema_version": 3, "task": False, **({"points": 1.0} if kind == "test" else {})}
    cells = [("code", None, "from course_lib.grading.variants import student_id, variant"),
             ("answer", "who", "def who():\n    ### BEGIN SOLUTION\n    return student_id()\n    ### END SOLUTION"),
             ("test", "who_test", "assert who() == student_id() == 'alice', (who(), student_id())\n"
                                  "assert variant(who(), 'practicum_scale_out') == "
                                  f"{variants.variant('alice', 'practicum_scale_out')!r}")]
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for kind, grade_id, source in cells:
        cell = nbformat.v4.new_code_cell(source)
        if grade_id:
            cell.metadata["nbgrader"] = meta(kind, grade_id)
        nb.cells.append(cell)
    path = tmp_path / "who.ipynb"
    nbformat.write(nb, str(path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JUPYTERHUB_USER", "the-grader")         # grading on a hub: the TA's name must not count
    monkeypatch.delenv("COURSE_STUDENT_ID", raising=False)
    report = grade.grade(path, path, student="alice")
    assert report.points == {"who_test": 1.0}, report.messages
    assert "COURSE_STUDENT_ID" not in os.environ                # restored


@pytest.mark.parametrize("exercise", sorted(variants.VARIANTS))
def test_a_new_term_draws_new_variants_and_keeps_the_defaults(exercise, monkeypatch):
    draw = lambda: [variants.variant(f"student{i}", exercise) for i in range(20)]
    this_term = draw()
    monkeypatch.setattr(variants, "TERM", "another term")
    assert draw() != this_term and variants.variant("anonymous", exercise) == variants.VARIANTS[exercise][0]
