"""Every exercise after the first, through ``coursekit autograde`` in one batch each.

Per assignment: the release filled in with the solutions scores every autograded point (the
written answer waits for the instructor; the instructor's own notebook runs under nbval in
``tests/test_exercises.py``, and through the autograder for exercise 1), the
untouched release scores zero without stopping the batch, and one notebook with a mutant in each
of three of its parts (from the assignment's catalogue, ``tests/mutants/<name>.py``) loses each
part's hidden test cell and sees each hint there (``tests/test_graders.py`` grades the whole catalogue in-process).
Exercise 1 has its own, longer test (``test_autograde.py``) that also covers the
gradebook's integrity and the feedback pages (the same template for every assignment), so these
batches write none.
"""

from __future__ import annotations

import csv
import importlib

import nbformat
import pytest
from nbgrader.api import Gradebook

from coursekit import cli
from coursekit.chapters import CHAPTERS
from coursekit.grading import harness
from tests.submissions import ROOT, course_folder, filled, load, points, replace_definition

pytestmark = [pytest.mark.slow, pytest.mark.bubblewrap]

MUTANTS = "mutants"  # the student whose notebook holds the three mutants of batch()

ASSIGNMENTS = [
    c.assignment for c in CHAPTERS if c.assignment != "ch01_attention"
]  # that one: test_autograde.py


def catalogue(assignment: str):
    """``(MUTANTS, HIDDEN_CELL)`` of an assignment: its wrong implementations, and for each
    graded part the ``grade_id`` of its hidden test cell."""
    hidden = {p.name: t.grade_id for p in harness.parts(assignment) for t in p.tests if t.hidden}
    return importlib.import_module(f"tests.mutants.{assignment}").MUTANTS, hidden


def batch(assignment: str) -> list:
    """The mutants graded through the sandbox here: the first of the catalogue for three parts, the
    assignment's first, middle and last graded part, all three in one student's notebook (the
    hidden cells are graded apart, so each part fails with its own hint; in-process, each of these
    notebooks showed every one of its three hints). Every mutant of the catalogue is graded
    in-process by ``tests/test_graders.py``, and the filled release passes every part through the
    sandbox here; these show that the sandboxed path fails a part, with its hint, as the in-process
    one does. (A notebook per mutant cost two more gradings per assignment, about 3 minutes of the
    suite; one per part, six more.)"""
    mutants, hidden = catalogue(assignment)
    order = [p.name for p in harness.parts(assignment) if p.name in hidden]
    chosen = {order[0], order[len(order) // 2], order[-1]}
    first: dict[str, object] = {}
    for m in mutants:
        if m.part in chosen:
            first.setdefault(m.part, m)
    return list(first.values())


@pytest.fixture(scope="module", params=ASSIGNMENTS)
def graded(request, tmp_path_factory):
    """Autograde one class per assignment; return (assignment, course folder, CSV rows)."""
    assignment = request.param
    mutants = batch(assignment)
    root, inbox = course_folder(tmp_path_factory.mktemp(assignment))
    reference = filled(assignment)
    nbformat.write(reference, inbox / "reference.ipynb")
    nbformat.write(load(ROOT / "exercises" / assignment / f"{assignment}.ipynb"), inbox / "untouched.ipynb")
    wrong = reference
    for m in mutants:
        wrong = replace_definition(wrong, m.target, m.source)
    nbformat.write(wrong, inbox / f"{MUTANTS}.ipynb")
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
        "1",  # the pool (--jobs 2) is tested by test_autograde and test_adversarial: here it cost two
        # more processes and a second sandbox per batch, about 8 CPU-seconds each, and the suite is CPU-bound
        "--no-feedback",  # the hints are read from the autograded notebooks; feedback pages: test_autograde
    ]
    assert cli.main(argv) == 0
    with open(csv_path, newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    return assignment, root, rows


def test_solutions_score_full_marks(graded):
    """Every autograded point, and the written answer left to the instructor (not yet a 0)."""
    assignment, _, rows = graded
    auto, manual = points(assignment)
    assert manual > 0
    row = rows["reference"]
    assert (float(row["score"]), float(row["max_score"])) == (auto, auto + manual)
    assert row["needs_manual_grade"] == "yes"


def test_untouched_release_scores_zero_without_stopping_the_batch(graded):
    assignment, _, rows = graded
    assert float(rows["untouched"]["score"]) == 0
    assert len(rows) == 3


def test_the_untouched_release_and_the_filled_one_get_no_note(graded):
    """Handed in as released (or with only the answer cells filled in), a notebook is what the
    students were given: no note about a changed or deleted cell."""
    import json

    assignment, root, _ = graded
    for student in ("untouched", "reference"):
        verdict = root / ".coursekit" / "verdicts" / assignment / student / f"{assignment}.json"
        assert json.loads(verdict.read_text())["notes"] == [], student


def test_every_mutant_loses_its_part_with_its_hint(graded):
    assignment, root, rows = graded
    _, hidden = catalogue(assignment)
    mutants = batch(assignment)
    problems = []
    with Gradebook(f"sqlite:///{root}/gradebook.db") as gb:
        for m in mutants:
            cell_id = hidden[m.part]
            grade = gb.find_grade(cell_id, assignment, assignment, MUTANTS)
            if grade.max_score > 0 and grade.score >= grade.max_score:  # partial credit may keep a share
                problems.append(f"{m.name}: {cell_id} kept its points")
                continue
            nb = load(root / "autograded" / MUTANTS / assignment / f"{assignment}.ipynb")
            cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == cell_id)
            shown = "\n".join(str(o.get("evalue", "")) + str(o.get("text", "")) for o in cell.outputs)
            if not any(o.get("output_type") in ("error", "execute_result") for o in cell.outputs):
                problems.append(f"{m.name}: {cell_id} passed")  # (an execute_result: its partial score)
            elif m.hint not in shown:
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
