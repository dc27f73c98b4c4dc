"""Every exercise after the first, through ``coursekit autograde`` in one batch each.

Per assignment: the release filled in with the solutions and the instructor's own
notebook score full marks, the untouched release scores zero without stopping the
batch, and every mutant of the assignment's catalogue (``tests/mutants/<name>.py``)
loses the points of its part's hidden test cell and sees its hint there.
Exercise 1 has its own, longer test (``test_autograde.py``) that also covers the
gradebook's integrity and the feedback pages (the same template for every assignment), so these
batches write none.
"""

from __future__ import annotations

import csv
import importlib
import shutil

import nbformat
import pytest
from nbgrader.api import Gradebook

from coursekit import cli
from coursekit.chapters import CHAPTERS
from coursekit.grading import harness
from tests.submissions import ROOT, course_folder, filled, load, replace_definition

pytestmark = pytest.mark.slow

ASSIGNMENTS = [
    c.assignment for c in CHAPTERS if c.assignment != "ch01_attention"
]  # that one: test_autograde.py


def catalogue(assignment: str):
    """``(MUTANTS, HIDDEN_CELL)`` of an assignment: its wrong implementations, and for each
    graded part the ``grade_id`` of its hidden test cell."""
    hidden = {p.name: t.grade_id for p in harness.parts(assignment) for t in p.tests if t.hidden}
    return importlib.import_module(f"tests.mutants.{assignment}").MUTANTS, hidden


def max_score(assignment: str) -> float:
    nb = load(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    return float(sum(c.metadata.get("nbgrader", {}).get("points", 0) for c in nb.cells))


@pytest.fixture(scope="module", params=ASSIGNMENTS)
def graded(request, tmp_path_factory):
    """Autograde one class per assignment; return (assignment, course folder, CSV rows)."""
    assignment = request.param
    mutants, _ = catalogue(assignment)
    root, inbox = course_folder(tmp_path_factory.mktemp(assignment))
    reference = filled(assignment)
    nbformat.write(reference, inbox / "reference.ipynb")
    shutil.copy(ROOT / "solutions" / assignment / f"{assignment}.ipynb", inbox / "solution.ipynb")
    nbformat.write(load(ROOT / "exercises" / assignment / f"{assignment}.ipynb"), inbox / "untouched.ipynb")
    for m in mutants:
        nbformat.write(replace_definition(reference, m.target, m.source), inbox / f"{m.name}.ipynb")
    csv_path = root / "grades.csv"
    argv = [
        "--course",
        str(root),
        "autograde",
        str(inbox),
        "--assignment",
        assignment,
        "--csv",
        str(csv_path),
        "--jobs",
        "2",
        "--no-feedback",  # the hints are read from the autograded notebooks; feedback pages: test_autograde
    ]
    assert cli.main(argv) == 0
    with open(csv_path, newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    return assignment, root, rows


def test_solutions_score_full_marks(graded):
    assignment, _, rows = graded
    best = max_score(assignment)
    for student in ("reference", "solution"):
        assert (float(rows[student]["score"]), float(rows[student]["max_score"])) == (best, best), student


def test_untouched_release_scores_zero_without_stopping_the_batch(graded):
    assignment, _, rows = graded
    assert float(rows["untouched"]["score"]) == 0
    assert len(rows) == len(catalogue(assignment)[0]) + 3


def test_every_mutant_loses_its_part_with_its_hint(graded):
    assignment, root, rows = graded
    mutants, hidden = catalogue(assignment)
    problems = []
    with Gradebook(f"sqlite:///{root}/gradebook.db") as gb:
        for m in mutants:
            cell_id = hidden[m.part]
            if gb.find_grade(cell_id, assignment, assignment, m.name).score != 0:
                problems.append(f"{m.name}: {cell_id} kept its points")
                continue
            nb = load(root / "autograded" / m.name / assignment / f"{assignment}.ipynb")
            cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == cell_id)
            shown = "\n".join(str(o.get("evalue", "")) + str(o.get("text", "")) for o in cell.outputs)
            if m.hint not in shown:
                problems.append(f"{m.name}: the student would not see {m.hint!r}; the cell shows:\n{shown}")
    assert not problems, "\n".join(problems)


def test_catalogue_covers_every_hidden_cell(graded):
    assignment, _, _ = graded
    mutants, hidden = catalogue(assignment)
    nb = load(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    hidden_ids = {c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "BEGIN HIDDEN TESTS" in c.source}
    assert set(hidden.values()) == hidden_ids
    assert {m.part for m in mutants} == set(hidden)
    assert len(mutants) >= 8 and len({m.name for m in mutants}) == len(mutants)
