"""Grading into a PostgreSQL gradebook (README: "Large classes: a PostgreSQL gradebook").

A throwaway PostgreSQL server, started with the Debian ``postgresql`` package's ``initdb``
and ``pg_ctl``, listens only on a Unix socket in a private temporary folder (no TCP).
Exercise 1 is autograded into it through the CLI. The grades are read back with nbgrader
and with plain SQL, and compared with the same verdicts recorded into SQLite; the CSV
export, the class report and the ``pg_dump`` backup work from it; and two runs of different
assignments, from two course folders, write into one empty database at the same time.

Sandboxed grading does not depend on the gradebook, so where a test only needs grades
*recorded*, it reuses the verdicts of an earlier run (``.coursekit/verdicts``: keyed by the
submission's content, not the student) and the run spends its time in the database.
"""

from __future__ import annotations

import csv
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from coursekit import autograde, cli, exports
from tests.mutants.ch01_attention import MUTANTS
from tests.postgres import postgres_course, postgres_server
from tests.submissions import ROOT, course_folder, filled, load, points, replace_definition

pytestmark = [pytest.mark.slow, pytest.mark.bubblewrap]

ASSIGNMENT = "ch01_attention"
OTHER = "ch02_multihead"  # graded at the same time as ASSIGNMENT, from another course folder
AUTO, MANUAL = points(ASSIGNMENT)  # the autograded points, and the written answer's (graded by hand)
COURSE_ID = "transformers-course"  # nbgrader_config.py
MUTANT = next(m for m in MUTANTS if m.part == "softmax")
GRADES_SQL = """
    SELECT sa.student_id, c.name, g.auto_score, g.manual_score
    FROM grade g
    JOIN base_cell c ON g.cell_id = c.id
    JOIN submitted_notebook sn ON g.notebook_id = sn.id
    JOIN submitted_assignment sa ON sn.assignment_id = sa.id
    JOIN assignment a ON sa.assignment_id = a.id
    WHERE a.name = %s
"""


@pytest.fixture(scope="module")
def server():
    with postgres_server() as pg:
        yield pg


def write_class(inbox: Path) -> None:
    reference = filled(ASSIGNMENT)
    nbformat.write(reference, inbox / "reference.ipynb")
    nbformat.write(load(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"), inbox / "untouched.ipynb")
    nbformat.write(
        replace_definition(reference, MUTANT.target, MUTANT.source), inbox / f"{MUTANT.name}.ipynb"
    )


def reuse_verdicts(src: Path, src_student: str, dst: Path, dst_student: str, assignment: str) -> None:
    """Give ``dst_student`` in course ``dst`` the verdict that ``src`` made for the same notebook."""
    target = dst / ".coursekit" / "verdicts" / assignment / dst_student
    shutil.copytree(src / ".coursekit" / "verdicts" / assignment / src_student, target, dirs_exist_ok=True)


def grades(url: str, assignment: str) -> dict[tuple[str, str], tuple]:
    """(student, grade cell) -> (auto score, manual score), through nbgrader."""
    with Gradebook(url, COURSE_ID) as gb:
        return {
            (sub.student_id, g.name): (g.auto_score, g.manual_score)
            for sub in gb.assignment_submissions(assignment)
            for nb in sub.notebooks
            for g in nb.grades
        }


def formgrader_views(url: str) -> dict:
    """What nbgrader's formgrader lists (its aggregate SQL), without row ids and timestamps."""

    def by(key, dicts):
        return {d[key]: {k: v for k, v in d.items() if k not in ("id", "timestamp")} for d in dicts}

    with Gradebook(url, COURSE_ID) as gb:
        return {
            "students": by("id", gb.student_dicts()),
            "submissions": by("student", gb.submission_dicts(ASSIGNMENT)),
            "notebooks": by("student", gb.notebook_submission_dicts(ASSIGNMENT, ASSIGNMENT)),
            "average": gb.average_assignment_score(ASSIGNMENT),
        }


def totals(url: str, assignment: str) -> dict[str, float]:
    with Gradebook(url, COURSE_ID) as gb:
        return {s.student_id: s.score for s in gb.assignment_submissions(assignment)}


@pytest.fixture(scope="module")
def graded(server, tmp_path_factory):
    """Exercise 1 autograded into PostgreSQL: the course folder, the URL and the CSV rows."""
    url = server.create_database("gradebook")
    root, inbox = postgres_course(tmp_path_factory.mktemp("pg"), url)
    write_class(inbox)
    csv_path = root / "grades.csv"
    assert (
        cli.main(
            [
                "--course",
                str(root),
                "autograde",
                str(inbox),
                "--assignment",
                ASSIGNMENT,
                "--csv",
                str(csv_path),
            ]
        )
        == 0
    )
    assert not (root / "gradebook.db").exists()  # nothing went to the default SQLite file
    with open(csv_path, newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    return root, url, rows


# --------------------------------------------------------------------------- one course


def test_scores_are_in_the_postgres_gradebook(server, graded):
    _, url, _ = graded
    scores = totals(url, ASSIGNMENT)
    assert set(scores) == {"reference", "untouched", MUTANT.name}
    partial = scores[MUTANT.name]
    assert scores["reference"] == AUTO and scores["untouched"] == 0 and 0 < partial < AUTO
    by_nbgrader = grades(url, ASSIGNMENT)
    lost = by_nbgrader[(MUTANT.name, "softmax_hidden")][0]  # partial credit: the share of checks passed
    assert lost < by_nbgrader[("reference", "softmax_hidden")][0]  # the mutant lost points of its part
    # independently of nbgrader and SQLAlchemy: plain SQL through the driver
    by_sql = {
        (student, cell): (auto, manual)
        for student, cell, auto, manual in server.sql(url, GRADES_SQL, ASSIGNMENT)
    }
    assert by_sql == by_nbgrader
    assert (
        sum(auto or 0 for (student, _cell), (auto, _manual) in by_sql.items() if student == MUTANT.name)
        == partial  # (a written answer has no autograded score: NULL until someone grades it)
    )


def test_postgres_records_what_sqlite_records(graded, tmp_path):
    """The same verdicts, recorded into SQLite by the same command: the same grades, cell by cell,
    and the same views in nbgrader's formgrader."""
    pg_root, url, pg_rows = graded
    root, inbox = course_folder(tmp_path)
    for path in (pg_root / "inbox").iterdir():
        shutil.copy(path, inbox)
        reuse_verdicts(pg_root, path.stem, root, path.stem, ASSIGNMENT)
    csv_path = root / "grades.csv"
    assert (
        cli.main(
            [
                "--course",
                str(root),
                "autograde",
                str(inbox),
                "--assignment",
                ASSIGNMENT,
                "--csv",
                str(csv_path),
                "--no-feedback",
            ]
        )
        == 0
    )
    sqlite = f"sqlite:///{root}/gradebook.db"
    assert grades(sqlite, ASSIGNMENT) == grades(url, ASSIGNMENT)
    views = formgrader_views(url)
    assert views == formgrader_views(sqlite)
    assert (
        views["submissions"][MUTANT.name]["score"] == float(pg_rows[MUTANT.name]["score"])
        and len(views["students"]) == 3
    )
    with open(csv_path, newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    keys = ("assignment", "student_id", "score", "max_score")
    assert {s: [r[k] for k in keys] for s, r in rows.items()} == {
        s: [r[k] for k in keys] for s, r in pg_rows.items()
    }


def test_csv_export_and_report_work_from_postgres(graded, tmp_path):
    root, url, rows = graded
    expected = totals(url, ASSIGNMENT)
    assert {s: float(r["score"]) for s, r in rows.items()} == expected
    assert {float(r["max_score"]) for r in rows.values()} == {AUTO + MANUAL}
    again = exports.export(root, tmp_path / "again.csv")
    with open(again, newline="") as f:
        assert {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)} == expected
    assert cli.main(["--course", str(root), "report", "--assignment", ASSIGNMENT]) == 0
    with open(root / "reports" / ASSIGNMENT / "scores.csv", newline="") as f:
        assert {r["student"]: float(r["score"]) for r in csv.DictReader(f)} == expected
    assert (root / "feedback" / MUTANT.name / ASSIGNMENT / f"{ASSIGNMENT}.html").is_file()


def test_each_run_dumps_the_gradebook_and_the_dump_restores(server, graded):
    root, url, _ = graded
    folder = root / ".coursekit" / "backups"
    before = set(folder.glob("gradebook-*.dump"))
    assert before, "the first run did not back up the (then empty) gradebook"
    autograde.autograde(root, ASSIGNMENT, ["reference"], feedback=False)
    (new,) = set(folder.glob("gradebook-*.dump")) - before
    restored = server.create_database("restored")
    subprocess.run(
        [str(server.bindir / "pg_restore"), "--no-owner", f"--dbname={restored}", str(new)], check=True
    )
    assert totals(restored, ASSIGNMENT) == totals(url, ASSIGNMENT)


def test_a_failed_backup_stops_the_run_before_grading(server, tmp_path):
    url = server.create_database("dump_me")
    broken = url.replace("/dump_me?", "/no_such_database?")
    with pytest.raises(RuntimeError, match="pg_dump could not back up the gradebook"):
        autograde.backup_gradebook(tmp_path, broken)
    assert not list((tmp_path / ".coursekit" / "backups").glob("*"))  # no half-written dump is kept


def test_a_gradebook_it_cannot_reach_is_a_clear_error(server, tmp_path, capsys):
    url = server.create_database("reachable").replace("/reachable?", "/no_such_database?")
    root, inbox = postgres_course(tmp_path, url)
    nbformat.write(load(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"), inbox / "untouched.ipynb")
    assert cli.main(["--course", str(root), "autograde", str(inbox), "--assignment", ASSIGNMENT]) == 2
    err = capsys.readouterr().err
    assert (
        "cannot connect to the gradebook postgresql://grader@/no_such_database" in err
        and "does not exist" in err
    )


def test_without_pg_dump_a_run_warns_that_it_made_no_backup(server, tmp_path, monkeypatch, caplog):
    url = server.create_database("no_client_tools")
    which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *args, **kw: None if name == "pg_dump" else which(name, *args, **kw)
    )
    with caplog.at_level(logging.WARNING, logger="coursekit.autograde"):
        assert autograde.backup_gradebook(tmp_path, url) is None
    assert "gradebook was NOT backed up" in caplog.text


def test_doctor_checks_a_postgres_gradebook(server, tmp_path, monkeypatch, capsys):
    url = server.create_database("doctored")
    lines = autograde.check_gradebook(url)
    assert [(ok, what) for ok, what, _ in lines] == [(True, "pg_dump"), (True, "gradebook")]
    assert "PostgreSQL" in lines[1][2] and "postgresql://grader@/doctored" in lines[1][2]
    # the course's own nbgrader_config.py decides which gradebook `coursekit doctor` checks
    root, _ = postgres_course(tmp_path, url.replace("/doctored?", "/no_such_database?"))
    assert cli.main(["--course", str(root), "doctor"]) == 1
    out = capsys.readouterr().out
    assert (
        "[FAIL] gradebook: cannot connect to postgresql://grader@/no_such_database" in out
        and "does not exist" in out
    )
    which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *args, **kw: None if name == "pg_dump" else which(name, *args, **kw)
    )
    ok, what, detail = autograde.check_gradebook(url)[0]
    assert (ok, what) == (False, "pg_dump") and "apt-get install postgresql-client" in detail


def test_one_run_per_assignment_and_database_from_any_course_folder(server, tmp_path):
    """The course lock only sees its own folder; a second folder on the same database is stopped too."""
    url = server.create_database("locks")
    other, _ = postgres_course(tmp_path, url, "other")
    with autograde.gradebook_lock(url, ASSIGNMENT):
        with pytest.raises(
            RuntimeError, match=f"another `coursekit autograde` is grading {ASSIGNMENT} into this gradebook"
        ):
            autograde.autograde(other, ASSIGNMENT, ["reference"], feedback=False)
        with autograde.gradebook_lock(url, OTHER):  # another assignment is free
            pass
    with autograde.gradebook_lock(url, ASSIGNMENT):  # and the lock was released
        pass


# --------------------------------------------------------------------------- two runs at once


def test_two_assignments_graded_at_once_into_one_empty_database(server, graded, tmp_path):
    """Two `coursekit autograde` processes, one per course folder and assignment, the same students,
    one empty database, started together: both exit cleanly and every grade lands.

    (Left to nbgrader, two runs at once on an empty database collide creating its tables, the
    course and the students; ``coursekit.autograde.gradebook_setup`` makes them take turns.)
    """
    pg_root, pg_url, _ = graded
    # ch02's verdicts: graded once, in a scratch SQLite course
    started = time.monotonic()
    scratch, scratch_inbox = course_folder(tmp_path, "scratch")
    nbformat.write(filled(OTHER), scratch_inbox / "reference.ipynb")
    nbformat.write(load(ROOT / "exercises" / OTHER / f"{OTHER}.ipynb"), scratch_inbox / "untouched.ipynb")
    assert (
        cli.main(
            [
                "--course",
                str(scratch),
                "autograde",
                str(scratch_inbox),
                "--assignment",
                OTHER,
                "--no-feedback",
                "--csv",
                str(scratch / "grades.csv"),
            ]
        )
        == 0
    )
    print(f"{OTHER} graded in a scratch course: {time.monotonic() - started:.1f} s")

    url = server.create_database("shared")
    students = [f"s{i:02d}" for i in range(4)]
    sources = [  # (course folder, assignment, the course whose verdicts it reuses, its gradebook, notebooks there)
        ("a", ASSIGNMENT, pg_root, pg_url, ["reference", "untouched", MUTANT.name]),
        ("b", OTHER, scratch, f"sqlite:///{scratch}/gradebook.db", ["reference", "untouched"]),
    ]
    commands, expected = [], {}
    for name, assignment, source, source_url, kinds in sources:
        root, inbox = postgres_course(tmp_path, url, name)
        scores = totals(source_url, assignment)
        for i, student in enumerate(students):
            kind = kinds[i % len(kinds)]
            shutil.copy(source / "inbox" / f"{kind}.ipynb", inbox / f"{student}.ipynb")
            reuse_verdicts(source, kind, root, student, assignment)
            expected[(assignment, student)] = scores[kind]
        commands.append(
            [
                sys.executable,
                "-m",
                "coursekit.cli",
                "--course",
                str(root),
                "autograde",
                str(inbox),
                "--assignment",
                assignment,
                "--csv",
                str(root / "grades.csv"),
                "--no-feedback",
            ]
        )
    started = time.monotonic()
    logs = [tmp_path / f"run-{i}.log" for i in range(len(commands))]
    runs = []
    for command, log in zip(commands, logs):
        with open(log, "w") as out:  # the child keeps its own copy of the file
            runs.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT))
    for run, log in zip(runs, logs):
        assert run.wait(timeout=900) == 0, log.read_text()
    got = {(a, s): score for a in (ASSIGNMENT, OTHER) for s, score in totals(url, a).items()}
    assert got == expected
    assert (
        expected[(ASSIGNMENT, "s00")] == AUTO and expected[(OTHER, "s00")] > 0 == expected[(OTHER, "s01")]
    )  # tell them apart
    with open(exports.export(tmp_path / "a", tmp_path / "both.csv"), newline="") as f:
        assert {(r["assignment"], r["student_id"]): float(r["score"]) for r in csv.DictReader(f)} == expected
    print(f"two runs of {len(students)} students each, at once: {time.monotonic() - started:.1f} s")
