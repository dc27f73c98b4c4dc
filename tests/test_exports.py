"""Grades out of the gradebook: our CSV tells "not submitted" from 0 and carries times; the Canvas
and Moodle files have the layouts of the samples in ``tests/data/lms/``."""

from __future__ import annotations

import csv
import datetime as dt
import re

import pytest
from nbgrader.api import Gradebook

from coursekit import cli, exports
from coursekit.course import gradebook_url
from tests.submissions import ROOT, course_folder

LMS = ROOT / "tests" / "data" / "lms"
DUE = dt.datetime(2026, 3, 1, 17, 0)


@pytest.fixture
def course(tmp_path):
    """Two assignments, three students: alice submitted both (a 0 on the second, late), bob the
    first only, carol nothing."""
    root, _ = course_folder(tmp_path)
    url = gradebook_url(root)  # (and nbgrader's alembic on PATH)
    with Gradebook(url) as gb:
        for name in ("ch01_attention", "ch02_multihead"):
            gb.update_or_create_assignment(name, duedate=DUE)
            gb.update_or_create_notebook(name, name)
            gb.add_grade_cell("part", name, name, max_score=4, cell_type="code")
        gb.update_or_create_student(
            "alice", first_name="Alice", last_name="Liddell", email="alice@example.org"
        )
        gb.update_or_create_student("bob")
        gb.update_or_create_student("carol")
        for assignment, student, score, when in (
            ("ch01_attention", "alice", 3, DUE - dt.timedelta(hours=2)),
            ("ch02_multihead", "alice", 0, DUE + dt.timedelta(hours=5)),
            ("ch01_attention", "bob", 4, DUE - dt.timedelta(days=1)),
        ):
            gb.add_submission(assignment, student, timestamp=when)
            grade = gb.find_grade("part", assignment, assignment, student)
            grade.auto_score, grade.needs_manual_grade = score, False  # as nbgrader's autograder leaves them
            gb.db.commit()
    return root


def read(path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_our_csv_tells_not_submitted_from_zero_and_has_times(course, tmp_path):
    rows = {
        (r["assignment"], r["student_id"]): r
        for r in csv.DictReader(open(exports.export(course, tmp_path / "g.csv")))
    }
    assert len(rows) == 6  # every assignment and student, submitted or not
    zero, missing = rows[("ch02_multihead", "alice")], rows[("ch02_multihead", "carol")]
    assert (zero["status"], zero["score"]) == ("late", "0") and zero["timestamp"].startswith(
        "2026-03-01T22:00:00"
    )
    assert (missing["status"], missing["score"], missing["timestamp"]) == ("not submitted", "", "")
    assert (
        rows[("ch01_attention", "bob")]["score"] == "4"
        and rows[("ch01_attention", "alice")]["email"] == "alice@example.org"
    )
    assert {r["max_score"] for r in rows.values()} == {"4"}


def test_canvas_file_has_the_layout_canvas_exports(course, tmp_path):
    sample, ours = (
        read(LMS / "canvas-gradebook-export.csv"),
        read(exports.export(course, tmp_path / "c.csv", "canvas")),
    )
    assert ours[0][:5] == sample[0][:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    assert ours[1][0] == sample[1][0] == "    Points Possible" and ours[1][5:] == ["4", "4"]
    assert all(re.fullmatch(r".+ \([a-z0-9_]+\)", h) for h in ours[0][5:]), ours[0]
    body = {r[3]: r[5:] for r in ours[2:]}  # students by SIS Login ID
    assert body == {
        "alice": ["3", "0"],
        "bob": ["4", ""],
        "carol": ["", ""],
    }  # not submitted: left empty, never 0
    assert [r[0] for r in ours[2:]] == ["Liddell, Alice", "bob", "carol"]


def test_moodle_file_has_the_layout_moodle_exports(course, tmp_path):
    sample, ours = (
        read(LMS / "moodle-grades-export.csv"),
        read(exports.export(course, tmp_path / "m.csv", "moodle")),
    )
    identity = ["First name", "Last name", "ID number", "Institution", "Department", "Email address"]
    assert ours[0][:6] == sample[0][:6] == identity
    assert all(re.fullmatch(r"Assignment: .+ \(Real\)", h) for h in ours[0][6:]) and sample[0][6].endswith(
        "(Real)"
    )
    assert {r[2]: r[6:] for r in ours[1:]} == {"alice": ["3", "0"], "bob": ["4", ""], "carol": ["", ""]}


def test_the_cli_writes_each_format_and_refuses_others(course, tmp_path, capsys):
    for fmt in ("csv", "canvas", "moodle"):
        out = tmp_path / f"{fmt}.csv"
        assert cli.main(["--course", str(course), "export", "--format", fmt, "--out", str(out)]) == 0
        assert out.is_file() and read(out)
    with pytest.raises(SystemExit):
        cli.main(["--course", str(course), "export", "--format", "blackboard"])


@pytest.mark.parametrize(
    "value", ['=HYPERLINK("http://example.invalid","x")', "+SUM(1,1)", "-2+3", "@cmd", "\tx", "\r=1", "＝1"]
)
def test_a_cell_a_spreadsheet_would_run_as_a_formula_is_text_in_every_format(course, tmp_path, value):
    """OWASP's rule for CSV files: a roster value that starts like a formula gets a leading quote, in
    our CSV, Canvas's and Moodle's files alike; nothing else changes."""
    with Gradebook(gradebook_url(course)) as gb:
        gb.update_or_create_student("alice", first_name=value, last_name="", email=value)
        gb.update_or_create_student("bob", first_name="Bob", last_name="O'Hara-Smith")
    for fmt in ("csv", "canvas", "moodle"):
        cells = [c for line in read(exports.export(course, tmp_path / f"{fmt}.csv", fmt)) for c in line]
        assert "'" + value in cells, (fmt, cells)
        assert not any(c.startswith(("=", "+", "-", "@", "\t", "\r", "＝")) for c in cells), (fmt, cells)
        assert "O'Hara-Smith" in cells or "O'Hara-Smith, Bob" in cells, (fmt, cells)  # a plain name, kept


def test_an_lms_export_waits_for_pending_hand_grades_unless_told(course, tmp_path, capsys):
    with Gradebook(gradebook_url(course)) as gb:
        grade = gb.find_grade("part", "ch01_attention", "ch01_attention", "bob")
        grade.needs_manual_grade = True  # a written answer nobody graded yet
        gb.db.commit()
    out = tmp_path / "canvas.csv"
    argv = ["--course", str(course), "export", "--format", "canvas", "--out", str(out)]
    assert cli.main(argv) == 2 and not out.exists()
    assert "1 answers of 1 students still wait for a hand grade (bob: 1)" in capsys.readouterr().err
    assert cli.main([*argv, "--allow-pending"]) == 0 and out.exists()
    assert "WARNING: 1 answers of 1 students still wait for a hand grade (bob: 1)" in capsys.readouterr().err
    with open(exports.export(course, tmp_path / "g.csv"), newline="") as f:  # grades.csv: never refused
        rows = {(r["assignment"], r["student_id"]): r for r in csv.DictReader(f)}
    assert rows[("ch01_attention", "bob")]["pending_hand_grades"] == "1"
    assert rows[("ch01_attention", "alice")]["pending_hand_grades"] == "0"


def test_moodles_file_names_the_incomplete_totals_in_a_note_column_only_when_pending(course, tmp_path):
    """``--allow-pending``: Moodle's file gets a last ``Note`` column (left unmapped on import) saying
    on each waiting student's row which totals lack hand grades; Canvas's file keeps its layout (an
    unknown column would become an assignment there); with nothing pending, no note column at all."""
    plain = read(exports.export(course, tmp_path / "plain.csv", "moodle", allow_pending=False))
    assert exports.MOODLE_NOTE not in plain[0]
    with Gradebook(gradebook_url(course)) as gb:
        grade = gb.find_grade("part", "ch02_multihead", "ch02_multihead", "alice")
        grade.needs_manual_grade = True
        gb.db.commit()
    with pytest.raises(exports.PendingGrades, match=r"1 answers of 1 students .*\(alice: 1\)"):
        exports.export(course, tmp_path / "refused.csv", "moodle", allow_pending=False)
    assert not (tmp_path / "refused.csv").exists()
    moodle = read(exports.export(course, tmp_path / "m.csv", "moodle", allow_pending=True))
    assert moodle[0][-1] == exports.MOODLE_NOTE and len(moodle[0]) == len(plain[0]) + 1
    notes = {r[2]: r[-1] for r in moodle[1:]}
    assert notes["alice"].startswith("INCOMPLETE: 1 answers wait") and "ch02_multihead: 1" in notes["alice"]
    assert notes["bob"] == notes["carol"] == ""
    canvas = read(exports.export(course, tmp_path / "c.csv", "canvas", allow_pending=True))
    assert (
        canvas[0][:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"] and len(canvas[0]) == 7
    )


def test_the_class_reports_scores_csv_is_inert_and_counts_pending_hand_grades(course):
    """The report's ``scores.csv`` is an export too: a roster id, a part title or an autograder note that
    starts like a formula is text; each student's row counts the answers that wait for a hand grade."""
    import json

    from coursekit import report

    student, note, title = "@evil", '=HYPERLINK("http://example.invalid","y")', "+SUM(1,1)"
    with Gradebook(gradebook_url(course)) as gb:
        gb.update_or_create_student(student)
        gb.add_submission("ch01_attention", student, timestamp=DUE)
        grade = gb.find_grade("part", "ch01_attention", "ch01_attention", student)
        grade.auto_score, grade.needs_manual_grade = None, True  # a written answer, not graded yet
        gb.db.commit()
    for who, manual in ((student, True), ("bob", False)):
        folder = course / ".coursekit" / "verdicts" / "ch01_attention" / who
        folder.mkdir(parents=True)
        verdict = {
            "notes": [note] if who == student else [],
            "parts": [{"title": title, "tests": ["part"], "manual": manual}],
            "tests": {"part": {"passed": not manual, "lines": [], "points": 4}},
        }
        (folder / "ch01_attention.json").write_text(json.dumps(verdict))
    page = report.write_report(course, "ch01_attention").read_text()
    assert "1 answers wait for a hand grade" in page and "@evil: 1" in page
    with open(course / "reports" / "ch01_attention" / "scores.csv", newline="") as f:
        lines = list(csv.reader(f))
    assert "'" + title in lines[0] and title not in lines[0]
    rows = {r[0]: dict(zip(lines[0], r)) for r in lines[1:]}
    assert set(rows) == {"'" + student, "bob"}
    assert rows["'" + student]["autograder_notes"] == "'" + note
    assert (rows["'" + student]["pending_hand_grades"], rows["bob"]["pending_hand_grades"]) == ("1", "0")
