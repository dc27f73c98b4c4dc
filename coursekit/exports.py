"""Grades out of the gradebook, in the forms instructors upload.

* :func:`write_csv`: every assignment and student, one row each, with a ``status`` column that
  tells ``not submitted`` (no score at all) from a graded 0, the submission time, the late
  penalty and whether manual grading is pending.
* :func:`write_canvas`: Canvas's gradebook import layout (``Student, ID, SIS User ID, SIS Login
  ID, Section`` then one column per assignment, and a ``Points Possible`` row). The course's
  student ids go into ``SIS Login ID``, which Canvas matches students by.
* :func:`write_moodle`: Moodle's grade import layout (``First name, Last name, ID number,
  Institution, Department, Email address`` then one ``Assignment: <name> (Real)`` column each);
  in Moodle's import, map ``ID number`` to the users' ID number.

In the LMS files an assignment not submitted is an empty cell (the LMS keeps it ungraded),
never a 0. Scores come from nbgrader's gradebook, so manual grades and late penalties count.

While answers wait for a hand grade, :func:`export` refuses the file unless told
(``allow_pending``); then our CSV says so in its ``status`` and ``pending_hand_grades`` columns and
Moodle's file gets a last ``Note`` column (Moodle's import leaves a column it is not told to map
alone), naming on each waiting student's row what the totals lack. Canvas's file gets none: Canvas
makes a new assignment of any column it does not know, so there the warning is the terminal's.

Every text cell (names, emails, ids, titles) goes through :func:`text_cell` (OWASP's rule against
formula injection).
"""

from __future__ import annotations

import csv
import datetime as dt
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Grade",
    "PendingGrades",
    "grades",
    "pending",
    "pending_warning",
    "text_cell",
    "write_csv",
    "write_canvas",
    "write_moodle",
    "FORMATS",
    "export",
]


@dataclass(frozen=True)
class Grade:
    """One student's result on one assignment."""

    assignment: str
    student: str
    last_name: str
    first_name: str
    email: str
    submitted: bool
    timestamp: dt.datetime | None
    duedate: dt.datetime | None
    raw_score: float | None  # before the late penalty
    late_penalty: float | None
    score: float | None  # None: not submitted
    max_score: float
    needs_manual_grade: bool
    seconds_late: float = 0.0
    pending: int = 0  # answers still waiting for a hand grade (the formgrader's "needs manual grade")

    @property
    def status(self) -> str:
        if not self.submitted:
            return "not submitted"
        if self.needs_manual_grade:
            return "needs manual grade"
        return "late" if self.seconds_late > 0 else "graded"


def grades(db_url: str) -> list[Grade]:
    """Every (assignment, student) pair of the gradebook at ``db_url``, assignments in name order."""
    from nbgrader.api import Gradebook, MissingEntry

    out = []
    with Gradebook(db_url) as gb:
        students = sorted(gb.students, key=lambda s: s.id)
        for assignment in sorted(gb.assignments, key=lambda a: a.name):
            for student in students:
                try:
                    sub = gb.find_submission(assignment.name, student.id)
                except MissingEntry:
                    out.append(
                        Grade(
                            assignment.name,
                            student.id,
                            student.last_name or "",
                            student.first_name or "",
                            student.email or "",
                            False,
                            None,
                            assignment.duedate,
                            None,
                            None,
                            None,
                            float(assignment.max_score),
                            False,
                        )
                    )
                    continue
                penalty = float(sub.late_submission_penalty or 0.0)
                out.append(
                    Grade(
                        assignment.name,
                        student.id,
                        student.last_name or "",
                        student.first_name or "",
                        student.email or "",
                        True,
                        sub.timestamp,
                        assignment.duedate,
                        float(sub.score),
                        penalty,
                        max(0.0, float(sub.score) - penalty),
                        float(sub.max_score),
                        bool(sub.needs_manual_grade),
                        float(sub.total_seconds_late or 0.0),
                        sum(bool(g.needs_manual_grade) for nb in sub.notebooks for g in nb.grades),
                    )
                )
    return out


def _time(t: dt.datetime | None) -> str:
    if t is None:
        return ""
    return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).isoformat(timespec="seconds")


def _score(x: float | None) -> str:
    return "" if x is None else f"{x:g}"


#: what makes a spreadsheet read a cell as a formula (OWASP, "CSV Injection")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def text_cell(value: str) -> str:
    """A text cell made inert for Excel, LibreOffice and Google Sheets: a value that starts like a
    formula (``=HYPERLINK(...)``, ``+SUM(1,1)``, ``@cmd``, a tab) gets a leading ``'``, as OWASP's
    rule for CSV files says; the spreadsheet then shows it as text. Names, emails and ids come from
    the roster and the students, so every exported text cell goes through here."""
    value = str(value)
    return "'" + value if value.startswith(_FORMULA_START) else value


_text = text_cell


def pending(rows: list[Grade]) -> dict[str, int]:
    """Student -> answers still waiting for a hand grade, over every assignment (students with none
    left out)."""
    out: dict[str, int] = {}
    for g in rows:
        if g.pending:
            out[g.student] = out.get(g.student, 0) + g.pending
    return out


class PendingGrades(ValueError):
    """An LMS export asked for while hand grades are pending: its totals would be incomplete."""


def pending_warning(waiting: dict[str, int]) -> str:
    """The line ``coursekit export --allow-pending`` prints when totals still lack hand grades."""
    return (
        f"WARNING: {sum(waiting.values())} answers of {len(waiting)} students still wait for a hand grade "
        f"({_who(waiting)}): their totals in this file lack those points"
    )


def write_csv(rows: list[Grade], path: Path, *, pending: dict[str, int] | None = None) -> Path:
    """The long format: a row per assignment and student (nbgrader's columns, plus ``status`` and
    ``pending_hand_grades``, which say on every row what waits for a hand grade; ``pending`` adds
    nothing more)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "assignment",
                "duedate",
                "timestamp",
                "student_id",
                "last_name",
                "first_name",
                "email",
                "status",
                "raw_score",
                "late_submission_penalty",
                "score",
                "max_score",
                "needs_manual_grade",
                "pending_hand_grades",
            ]
        )
        for g in rows:
            w.writerow(
                [
                    _text(g.assignment),
                    _time(g.duedate),
                    _time(g.timestamp),
                    _text(g.student),
                    _text(g.last_name),
                    _text(g.first_name),
                    _text(g.email),
                    g.status,
                    _score(g.raw_score),
                    _score(g.late_penalty),
                    _score(g.score),
                    f"{g.max_score:g}",
                    "yes" if g.needs_manual_grade else "no",
                    str(g.pending),
                ]
            )
    return Path(path)


def _wide(rows: list[Grade]) -> tuple[list[str], dict[str, dict[str, Grade]], dict[str, float]]:
    assignments = sorted({g.assignment for g in rows})
    by_student: dict[str, dict[str, Grade]] = {}
    for g in rows:
        by_student.setdefault(g.student, {})[g.assignment] = g
    points = {g.assignment: g.max_score for g in rows}
    return assignments, by_student, points


def _title(assignment: str) -> str:
    from coursekit.chapters import chapter

    try:
        return f"{chapter(assignment).title} ({assignment})"
    except ValueError:
        return assignment


def write_canvas(rows: list[Grade], path: Path, *, pending: dict[str, int] | None = None) -> Path:
    """Canvas's gradebook import file: identity columns, one column per assignment, ``Points Possible``.
    No note column for ``pending``: Canvas would import it as a new assignment."""
    assignments, by_student, points = _wide(rows)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "Student",
                "ID",
                "SIS User ID",
                "SIS Login ID",
                "Section",
                *(_text(_title(a)) for a in assignments),
            ]
        )
        w.writerow(
            ["    Points Possible", "", "", "", "", *(f"{points[a]:g}" for a in assignments)]
        )  # as Canvas writes it
        for student, mine in sorted(by_student.items()):
            any_row = next(iter(mine.values()))
            name = ", ".join(n for n in (any_row.last_name, any_row.first_name) if n) or student
            w.writerow(
                [
                    _text(name),
                    "",
                    "",
                    _text(student),
                    "",
                    *(_score(mine[a].score) if a in mine else "" for a in assignments),
                ]
            )
    return Path(path)


#: the header of the note column of Moodle's file while hand grades are pending
MOODLE_NOTE = "Note"


def write_moodle(rows: list[Grade], path: Path, *, pending: dict[str, int] | None = None) -> Path:
    """Moodle's grade import file: identity columns and one ``Assignment: <name> (Real)`` column each;
    with ``pending`` (student -> answers waiting for a hand grade), a last :data:`MOODLE_NOTE` column
    that says on each waiting student's row that the totals lack those points (leave it unmapped)."""
    assignments, by_student, _ = _wide(rows)
    pending = pending or {}
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "First name",
                "Last name",
                "ID number",
                "Institution",
                "Department",
                "Email address",
                *(_text(f"Assignment: {_title(a)} (Real)") for a in assignments),
                *([MOODLE_NOTE] if pending else []),
            ]
        )
        for student, mine in sorted(by_student.items()):
            any_row = next(iter(mine.values()))
            w.writerow(
                [
                    _text(any_row.first_name),
                    _text(any_row.last_name),
                    _text(student),
                    "",
                    "",
                    _text(any_row.email),
                    *(_score(mine[a].score) if a in mine else "" for a in assignments),
                    *([_pending_note(mine, pending.get(student, 0))] if pending else []),
                ]
            )
    return Path(path)


def _pending_note(mine: dict[str, Grade], waiting: int) -> str:
    if not waiting:
        return ""
    where = ", ".join(f"{a}: {g.pending}" for a, g in sorted(mine.items()) if g.pending)
    return text_cell(
        f"INCOMPLETE: {waiting} answers wait for a hand grade ({where}); these totals lack their points"
    )


#: ``coursekit export --format``: name -> writer
FORMATS = {"csv": write_csv, "canvas": write_canvas, "moodle": write_moodle}


def export(root: Path, path: Path, fmt: str = "csv", *, allow_pending: bool = True) -> Path:
    """Write every grade of the course at ``root`` (its gradebook, as ``nbgrader_config.py`` names it)
    to ``path`` in ``fmt`` (``csv``, ``canvas`` or ``moodle``); returns ``path``.

    Raises:
        PendingGrades: hand grades are pending and ``allow_pending`` is false (nothing is written).
    """
    from coursekit import course

    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {sorted(FORMATS)}")
    rows = grades(course.gradebook_url(root))
    waiting = pending(rows)
    if waiting and not allow_pending:
        raise PendingGrades(
            f"{sum(waiting.values())} answers of {len(waiting)} students still wait for a hand grade "
            f"({_who(waiting)}), so their totals are incomplete: grade them in the formgrader "
            "(coursekit formgrader), or export anyway with --allow-pending; nothing was written"
        )
    return FORMATS[fmt](rows, Path(path), pending=waiting)


def _who(waiting: dict[str, int], shown: int = 5) -> str:
    names = [f"{s}: {n}" for s, n in sorted(waiting.items())]
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
