"""Exercise 1 through real nbgrader: release, collect, autograde, feedback, export.

One batch holds the reference solution, the untouched release and every mutant of
the catalogue, autograded by ``coursekit autograde`` in a temporary course folder.
"""

from __future__ import annotations

import csv
import shutil

import nbformat
import pytest
from nbgrader.api import Gradebook

from coursekit import cli, course
from tests.mutants.ch01_attention import MUTANTS
from tests.submissions import ROOT, filled, load, replace_definition

pytestmark = pytest.mark.slow

ASSIGNMENT = "ch01_attention"
HIDDEN_CELL = {
    "softmax": "softmax_hidden",
    "causal_mask": "causal_mask_hidden",
    "scaled_dot_product_attention": "attention_hidden",
    "SelfAttention": "self_attention_hidden",
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Autograde one class of fake students; return the course folder and the CSV rows."""
    root = tmp_path_factory.mktemp("course")
    shutil.copy(ROOT / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "solutions", root / "solutions")
    inbox = root / "inbox"
    inbox.mkdir()
    reference = filled(ASSIGNMENT)
    nbformat.write(reference, inbox / "reference.ipynb")
    shutil.copy(ROOT / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", inbox / "solution.ipynb")
    nbformat.write(load(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"), inbox / "untouched.ipynb")
    for m in MUTANTS:
        nbformat.write(replace_definition(reference, m.target, m.source), inbox / f"{m.name}.ipynb")
    csv_path = root / "grades.csv"
    assert cli.main(["--course", str(root), "autograde", str(inbox), "--assignment", ASSIGNMENT, "--csv", str(csv_path)]) == 0
    with open(csv_path, newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    return root, rows


def score(rows, student):
    return float(rows[student]["score"]), float(rows[student]["max_score"])


@pytest.mark.parametrize("student", ["reference", "solution"])
def test_solution_scores_full_marks(graded, student):
    """The release filled in with the solutions, and the instructor's notebook itself."""
    _, rows = graded
    got, best = score(rows, student)
    assert best == 12 and got == best


def test_untouched_release_scores_zero_without_stopping_the_batch(graded):
    _, rows = graded
    assert score(rows, "untouched")[0] == 0
    assert len(rows) == len(MUTANTS) + 3  # everyone after it was graded


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_loses_its_part_with_its_hint(graded, mutant):
    root, rows = graded
    got, best = score(rows, mutant.name)
    assert got < best
    cell_id = HIDDEN_CELL[mutant.part]
    with Gradebook(f"sqlite:///{root}/gradebook.db") as gb:
        grade = gb.find_grade(cell_id, ASSIGNMENT, ASSIGNMENT, mutant.name)
        assert grade.score == 0, f"{cell_id} kept its points"
    autograded = load(root / "autograded" / mutant.name / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    cell = next(c for c in autograded.cells if c.metadata.get("nbgrader", {}).get("grade_id") == cell_id)
    shown = "\n".join(str(o.get("evalue", "")) + str(o.get("text", "")) for o in cell.outputs)
    assert mutant.hint in shown, f"the student would not see {mutant.hint!r}; the cell shows:\n{shown}"


def test_feedback_is_written_for_every_student(graded):
    root, rows = graded
    for student in rows:
        html = root / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html"
        assert html.is_file()
    text = (root / "feedback" / "softmax_no_max_shift" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    assert "subtract the maximum" in text


def test_rerun_gives_identical_scores(graded):
    root, rows = graded
    students = ["reference", "attention_no_scaling"]
    again = {g.student: g.score for g in course.autograde(root, ASSIGNMENT, students, feedback=False)}
    assert again == {s: float(rows[s]["score"]) for s in students}


def test_collect_rejects_bad_input(tmp_path):
    root = tmp_path
    shutil.copy(ROOT / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "solutions", root / "solutions")
    inbox = root / "inbox"
    inbox.mkdir()
    with pytest.raises(ValueError, match="no submissions"):
        course.collect(root, ASSIGNMENT, inbox)
    (inbox / "bad name!.ipynb").write_text("{}")
    with pytest.raises(ValueError, match="student ids must be"):
        course.collect(root, ASSIGNMENT, inbox)
    with pytest.raises(ValueError, match="no such assignment"):
        course.collect(root, "ch99_nothing", inbox)
