"""One week of a term, scripted end to end as an instructor lives it.

Release -> five students (full marks; one catalogued mistake in each kind of part; half-finished;
the untouched release; one who hands in nothing) -> ``coursekit autograde`` on a Dask cluster of
two ``coursekit worker`` processes (README: "Large classes"; ``--jobs`` is tested elsewhere) ->
hand grades and comments through the formgrader's HTTP interface (``coursekit formgrader``) -> the
LMS export refused while a hand grade is pending, written with a warning when the instructor
insists -> a ``--fresh`` re-run on the cluster -> feedback pages, the class report, ``grades.csv``
and the Canvas and Moodle files checked for every student: scores, statuses, comments, warnings,
and no spurious note.
"""

from __future__ import annotations

import csv
import html
import json
import shutil
import time

import nbformat
import pytest
from nbgrader.api import Gradebook

from coursekit import cli
from coursekit.grading import harness
from tests.dask_cluster import dask_cluster
from tests.postgres import postgres_course, postgres_server
from tests.submissions import (
    ROOT,
    filled,
    load,
    points,
    replace_definition,
    running_formgrader,
)

pytestmark = [pytest.mark.slow, pytest.mark.bubblewrap]

ASSIGNMENT = "ch02_multihead"
AUTO, MANUAL = points(ASSIGNMENT)
WRITTEN = "written_pooling"  # the written answer (a markdown grade cell), graded by hand
#: a roster name a spreadsheet would run as a formula (OWASP's CSV injection)
FORMULA = '=HYPERLINK("http://example.invalid","click")'


def catalogue():
    from importlib import import_module

    return import_module(f"tests.mutants.{ASSIGNMENT}").MUTANTS


def one_mistake_per_kind(reference):
    """The full notebook with the first catalogued mistake of an implementation, a prediction and
    the experiment."""
    parts = harness.parts(ASSIGNMENT)
    kinds = {
        "implementation": parts[0].name,
        "prediction": next(p.name for p in parts if p.name.startswith("predict_")),
        "experiment": next(p.name for p in parts if p.number == "6"),
    }
    nb, chosen = reference, {}
    for kind, part in kinds.items():
        m = next(m for m in catalogue() if m.part == part)
        nb = replace_definition(nb, m.target, m.source)
        chosen[kind] = m
    return nb, chosen


def half_finished(reference):
    """The release with only its first two parts answered."""
    nb = load(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    for part in harness.parts(ASSIGNMENT)[:2]:
        nb = replace_definition(nb, part.name, part.source)
    return nb


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """``(the Dask scheduler's address, the gradebook's URL)``: every autograde run of the term grades
    on the cluster's two workers, into a throwaway PostgreSQL gradebook they all write to."""
    with postgres_server() as pg, dask_cluster(tmp_path_factory.mktemp("dask"), workers=2) as (address, _):
        yield address, pg.create_database("term")


@pytest.fixture(scope="module")
def term(tmp_path_factory, cluster):
    address, url = cluster
    root, inbox = postgres_course(tmp_path_factory.mktemp("term"), url)
    shutil.copy(ROOT / "_config.yml", root)
    shutil.copytree(ROOT / "_vendor" / "mathjax", root / "_vendor" / "mathjax")  # make mathjax
    reference = filled(ASSIGNMENT)
    buggy, mistakes = one_mistake_per_kind(reference)
    nbformat.write(reference, inbox / "full.ipynb")
    nbformat.write(buggy, inbox / "buggy.ipynb")
    nbformat.write(half_finished(reference), inbox / "half.ipynb")
    nbformat.write(load(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"), inbox / "untouched.ipynb")
    with Gradebook(url) as gb:  # the roster, "absent" hands in nothing
        for student in ("full", "buggy", "half", "untouched", "absent"):
            gb.add_student(
                student, first_name=FORMULA if student == "buggy" else student.title(), last_name="Doe"
            )
    argv = ["--course", str(root), "autograde", str(inbox), "--assignment", ASSIGNMENT]
    assert cli.main([*argv, "--scheduler", address]) == 0
    return root, inbox, mistakes


def grades_csv(root):
    with open(root / "grades.csv", newline="") as f:
        return {r["student_id"]: r for r in csv.DictReader(f) if r["assignment"] == ASSIGNMENT}


def verdict(root, student):
    return json.loads(
        (root / ".coursekit" / "verdicts" / ASSIGNMENT / student / f"{ASSIGNMENT}.json").read_text()
    )


@pytest.fixture(scope="module")
def grader(term, tmp_path_factory):
    """``coursekit formgrader`` on the term's course: a requests session that speaks its HTTP API, the
    server's address and the address it printed."""
    root, _, _ = term
    with running_formgrader(root, tmp_path_factory.mktemp("jupyter")) as (session, api, url):
        yield session, api.removesuffix("/formgrader/api"), url


def hand_grade(session, base, student, score, comment):
    """Grade the written answer of ``student`` and comment on it, as the formgrader's page does."""
    api = f"{base}/formgrader/api"
    (sub,) = [
        s
        for s in session.get(f"{api}/submitted_notebooks/{ASSIGNMENT}/{ASSIGNMENT}").json()
        if s["student"] == student
    ]
    grades = {g["name"]: g for g in session.get(f"{api}/grades", params={"submission_id": sub["id"]}).json()}
    comments = {
        c["name"]: c for c in session.get(f"{api}/comments", params={"submission_id": sub["id"]}).json()
    }
    assert grades[WRITTEN]["needs_manual_grade"], grades[WRITTEN]
    reply = session.put(f"{api}/grade/{grades[WRITTEN]['id']}", json={"manual_score": score})
    assert reply.status_code == 200, reply.text
    reply = session.put(f"{api}/comment/{comments[WRITTEN]['id']}", json={"manual_comment": comment})
    assert reply.status_code == 200, reply.text


def test_a_term(term, grader, cluster):
    root, inbox, mistakes = term
    session, base, _ = grader
    address, url = cluster

    # 1. autograded: scores, statuses, no spurious note
    rows = grades_csv(root)
    assert float(rows["full"]["score"]) == AUTO and rows["full"]["status"] == "needs manual grade"
    assert 0 < float(rows["buggy"]["score"]) < AUTO and rows["buggy"]["pending_hand_grades"] == "1"
    assert 0 < float(rows["half"]["score"]) < float(rows["buggy"]["score"])
    assert float(rows["untouched"]["score"]) == 0 and rows["untouched"]["pending_hand_grades"] == "0"
    assert rows["absent"]["status"] == "not submitted" and rows["absent"]["score"] == ""
    for student in ("full", "buggy", "half", "untouched"):
        assert verdict(root, student)["notes"] == [], student  # nothing changed that the student was given

    # 2. hand grades and comments in the formgrader; one still pending
    hand_grade(session, base, "full", MANUAL, "Clear, and the cost argument is right.")
    canvas = root / "grades-canvas.csv"
    assert cli.main(["--course", str(root), "export", "--format", "canvas"]) == 2  # buggy still waits
    assert not canvas.exists()
    hand_grade(session, base, "buggy", MANUAL / 2, "Half right: <b>heads</b> share the width.")

    # 3. a fresh re-run keeps the hand grades, their comments and their status
    argv = ["--course", str(root), "autograde", str(inbox), "--assignment", ASSIGNMENT, "--fresh"]
    assert cli.main([*argv, "--scheduler", address]) == 0
    rows = grades_csv(root)
    assert float(rows["full"]["score"]) == AUTO + MANUAL and rows["full"]["status"] == "graded"
    assert rows["buggy"]["status"] == "graded" and rows["buggy"]["pending_hand_grades"] == "0"
    with Gradebook(url) as gb:
        written = gb.find_grade(WRITTEN, ASSIGNMENT, ASSIGNMENT, "full")
        assert (written.manual_score, written.needs_manual_grade) == (MANUAL, False)
        comment = gb.find_comment(WRITTEN, ASSIGNMENT, ASSIGNMENT, "full")
        assert comment.manual_comment == "Clear, and the cost argument is right."

    # 4. feedback: the comments (as text), each part's result, the mistakes' hints, partial credit
    def page(student):
        return (root / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()

    assert "Clear, and the cost argument is right." in page("full") and "graded by hand" in page("full")
    assert html.escape("Half right: <b>heads</b> share the width.") in page("buggy")
    assert "<b>heads</b>" not in page("buggy")
    for m in mistakes.values():
        assert html.escape(m.hint) in page("buggy") or m.hint in page("buggy"), m.name
    assert "Notes from the autograder" not in page("full") + page("untouched") + page("half")
    assert 'class="share"' in page("buggy")  # each check's share of the points

    # 5. the class report: no pending hand grade left, every student's score
    assert cli.main(["--course", str(root), "report", "--assignment", ASSIGNMENT]) == 0
    report = (root / "reports" / ASSIGNMENT / "report.html").read_text()
    assert "wait for a hand grade" not in report
    with open(root / "reports" / ASSIGNMENT / "scores.csv", newline="") as f:
        scores = {r["student"]: float(r["score"]) for r in csv.DictReader(f)}
    assert scores == {s: float(rows[s]["score"]) for s in ("full", "buggy", "half", "untouched")}

    # 6. the LMS files: every student, not submitted as an empty cell, no formula
    assert cli.main(["--course", str(root), "export", "--format", "canvas"]) == 0
    assert cli.main(["--course", str(root), "export", "--format", "moodle"]) == 0
    with open(canvas, newline="") as f:
        lines = list(csv.reader(f))
    column = next(i for i, h in enumerate(lines[0]) if h.endswith(f"({ASSIGNMENT})"))
    got = {line[3]: line[column] for line in lines[2:]}
    assert got == {s: rows[s]["score"] for s in ("full", "buggy", "half", "untouched", "absent")}
    with open(root / "grades-moodle.csv", newline="") as f:
        moodle = {r["ID number"]: r for r in csv.DictReader(f)}
    assert moodle["buggy"]["First name"] == "'" + FORMULA  # shown as text by a spreadsheet
    assert not any(cell.startswith(("=", "+", "@")) for line in lines for cell in line)


def test_an_export_with_pending_hand_grades_needs_the_instructors_word(term, cluster, tmp_path, capsys):
    """While a hand grade is pending, ``export`` refuses and writes nothing; ``--allow-pending``
    writes and warns, naming who waits."""
    root, _, _ = term
    with Gradebook(cluster[1]) as gb:
        if not gb.find_submission(ASSIGNMENT, "half").needs_manual_grade:
            grade = gb.find_grade(WRITTEN, ASSIGNMENT, ASSIGNMENT, "half")
            grade.needs_manual_grade = True  # as nbgrader leaves a written answer nobody graded yet
            gb.db.commit()
    out = tmp_path / "moodle.csv"
    assert cli.main(["--course", str(root), "export", "--format", "moodle", "--out", str(out)]) == 2
    assert not out.exists() and "still wait for a hand grade (half: 1)" in capsys.readouterr().err
    argv = ["--course", str(root), "export", "--format", "moodle", "--out", str(out), "--allow-pending"]
    assert cli.main(argv) == 0
    assert out.exists() and "WARNING: 1 answers of 1 students still wait" in capsys.readouterr().err


@pytest.mark.browser
def test_the_grading_page_works_offline_with_the_courses_mathjax(term, grader, tmp_path):
    """nbgrader's grading page loads MathJax 2 from a CDN and its script waits on MathJax 2's API;
    offline (no host name resolves in this browser) the page of ``coursekit formgrader`` loads the
    course's MathJax instead (which renders math) and finishes setting up (its script sets
    ``MathJax.loaded``), so a hand grade can be entered."""
    from tests.browser import chromium

    session, base, printed = grader
    api = f"{base}/formgrader/api"
    (sub,) = [
        s
        for s in session.get(f"{api}/submitted_notebooks/{ASSIGNMENT}/{ASSIGNMENT}").json()
        if s["student"] == "full"
    ]
    driver = chromium(tmp_path / "profile")
    try:
        driver.get(printed)  # the address `coursekit formgrader` prints: it logs the browser in
        driver.get(f"{base}/formgrader/submissions/{sub['id']}/")
        deadline = time.monotonic() + 60
        while not driver.execute_script("return !!(window.MathJax && window.MathJax.loaded)"):
            assert time.monotonic() < deadline, (
                "the grading page never finished setting up: "
                + str(
                    driver.execute_script(
                        "return [document.title, [...document.scripts].map(s => s.src), typeof MathJax,"
                        " window.MathJax && Object.keys(window.MathJax)]"
                    )
                )
                + str(driver.get_log("browser"))
            )
            time.sleep(0.3)
        rendered = driver.execute_script("return MathJax.tex2chtml('\\\\frac{1}{\\\\sqrt{D}}').outerHTML")
        assert rendered.startswith("<mjx-container"), rendered  # the course's MathJax, working
        scripts = driver.execute_script("return [...document.scripts].map(s => s.src).filter(Boolean)")
        assert any(s.endswith("/files/_vendor/mathjax/tex-chtml.js") for s in scripts), scripts
        assert not any("cdnjs" in s for s in scripts), scripts
    finally:
        driver.quit()


@pytest.mark.browser
def test_the_feedback_page_and_the_class_report_pass_axe(term, tmp_path):
    """A student's feedback page (with hints, comments and partial credit) and the class report
    have no serious or critical violation of axe-core's WCAG 2.1 A and AA rules."""
    from tests.browser import axe_violations, chromium

    root, _, _ = term
    assert cli.main(["--course", str(root), "report", "--assignment", ASSIGNMENT]) == 0
    driver = chromium(tmp_path / "profile")
    try:
        for page in (
            root / "feedback" / "buggy" / ASSIGNMENT / f"{ASSIGNMENT}.html",
            root / "reports" / ASSIGNMENT / "report.html",
        ):
            driver.get(page.as_uri())
            assert axe_violations(driver) == [], page.name
    finally:
        driver.quit()
