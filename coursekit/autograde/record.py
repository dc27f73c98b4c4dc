"""Step 4, *record*: nbgrader's own autograder and feedback, on the rebuilt notebook.

nbgrader's ``Execute`` step is replaced by :class:`ApplyVerdicts`, which fills in the outputs the
sandbox produced and the trusted results of the test cells; the gradebook, manual grades, late
penalties and feedback stay nbgrader's. Feedback pages get a Content-Security-Policy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import resource
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

from coursekit import course, inert
from coursekit.autograde.feedback import feedback_settings, write_feedback
from coursekit.autograde.plan import Plan
from coursekit.autograde.rebuild import is_test_cell, nbgrader_meta

log = logging.getLogger(__name__)

__all__ = [
    "ApplyVerdicts",
    "Result",
    "not_graded",
    "record_api",
    "record_student",
    "timed",
]


@dataclass
class Result:
    student: str
    score: float
    max_score: float
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # nbgrader could not record this student (should not happen)
    cached: bool = False
    seconds: float = 0.0
    #: stage ("grade", "record", "feedback") -> [wall seconds, CPU seconds of the process and of the
    #: children it reaped], and "sandbox" -> [0, CPU seconds of the sandbox's processes while this
    #: student was graded]: what the class benchmark adds up (benchmarks/class_scale.py)
    stages: dict = field(default_factory=dict)


def _cpu_seconds() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


@contextlib.contextmanager
def timed(stages: dict, name: str):
    """Add the wall and CPU seconds of the block to ``stages[name]``."""
    wall, cpu = time.perf_counter(), _cpu_seconds()
    try:
        yield
    finally:
        was = stages.get(name, [0.0, 0.0])
        stages[name] = [was[0] + time.perf_counter() - wall, was[1] + _cpu_seconds() - cpu]


class ApplyVerdicts(NbGraderPreprocessor):
    """Replaces nbgrader's ``Execute``: fills in the outputs the sandbox produced and the
    trusted results of the test cells, from the verdict of this student's notebook."""

    verdict_dir = Unicode("", help="folder of <student>/<notebook>.json verdicts").tag(config=True)

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        path = Path(self.verdict_dir) / info["student"] / f"{info['notebook']}.json"
        verdict = json.loads(path.read_text())
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            gid = nbgrader_meta(cell).get("grade_id")
            if is_test_cell(cell) and gid in verdict["tests"]:
                test = verdict["tests"][gid]
                cell.outputs = (
                    [nbformat.v4.new_output("stream", name="stdout", text="\n".join(test["lines"]) + "\n")]
                    if test["lines"]
                    else []
                )
                if not test["passed"] and test.get("score"):
                    # partial credit through nbgrader's own path: a test cell whose output is a number
                    # (and holds no error) scores that number; the failure is shown as text before it
                    cell.outputs += [
                        nbformat.v4.new_output(
                            "stream", name="stdout", text=(test["failure"] or "failed") + "\n"
                        ),
                        nbformat.v4.new_output(
                            "execute_result",
                            data={"text/plain": repr(float(test["score"]))},
                            execution_count=None,
                        ),
                    ]
                elif not test["passed"]:
                    cell.outputs.append(
                        nbformat.v4.new_output(
                            "error",
                            ename="GradingFailure",
                            evalue=test["failure"] or "failed",
                            traceback=[test["failure"] or "failed"],
                        )
                    )
                cell.execution_count = None
                cell.metadata["coursekit"] = checks_of(test)  # what the feedback page shows of this cell
            elif cell.get("id") in verdict["outputs"]:
                ran = verdict["outputs"][cell.id]
                cell.outputs = [nbformat.from_dict(o) for o in ran["outputs"]]
                cell.execution_count = ran.get("execution_count")
        nb.metadata["coursekit"] = {
            "parts": verdict.get("parts", []),
            "notes": verdict["notes"],
            "chapter": _chapter_link(info.get("assignment", "")),
        }
        if verdict["notes"]:  # notes quote file names and cell labels the student chose: literal text only
            text = "**Notes from the autograder**\n\n" + "\n".join(
                f"- {inert.markdown_text(n)}" for n in verdict["notes"]
            )
            note = nbformat.v4.new_markdown_cell(text)
            note.id = "autograder-notes"
            nb.cells.insert(0, note)
        return nb, resources


_CHECK_LINE = re.compile(r"^\[(pass|FAIL)\] (.*)$")


def checks_of(test: dict) -> dict:
    """A test cell's result as the feedback shows it: each named check with its hint, or one
    line for a part that is not answered yet, or the one reason nothing could be checked."""
    hints = {name: hint for name, hint in test.get("failed_checks") or []}
    shares = test.get("clause_points") or {}  # each check's share of the cell's points
    checks, notes = [], []
    for line in test.get("lines", []):
        m = _CHECK_LINE.match(line)
        if m:  # "part: check" -> the check (the page already says which part)
            checks.append(
                {
                    "name": m[2].split(": ", 1)[-1],
                    "passed": m[1] == "pass",
                    "hint": hints.get(m[2]),
                    "points": shares.get(m[2]),
                }
            )
        elif not re.search(
            r": all \d+ checks passed$", line
        ):  # a grader's note, e.g. why a prediction was right
            notes.append(line.split(": ", 1)[-1])
    failure = test.get("failure") or ""
    advice = (
        failure.splitlines()[0].rstrip(".") if failure.startswith("part ") and "fix part" in failure else None
    )
    failed = [c for c in checks if not c["passed"]]
    unanswered = bool(failed) and all((c["hint"] or "").startswith("not implemented yet") for c in failed)
    message = None
    if not test.get("passed") and not checks:  # not graded, or the student's code stopped the grader
        message = failure.split("\n", 1)[-1] if advice else failure
    return {
        "hidden": bool(test.get("hidden")),
        "passed": bool(test.get("passed")),
        "checks": checks,
        "unanswered": unanswered,
        "advice": advice,
        "message": message,
        "notes": notes,
    }


def _chapter_link(assignment: str) -> dict | None:
    """The chapter of ``assignment`` and its address in the published book (``html.baseurl`` of
    ``_config.yml``); ``url`` is ``None`` when the book has no published address (a link into the
    instructor's own ``_build/`` would lead nowhere on the student's machine)."""
    from coursekit.chapters import chapter, course_root

    try:
        row = chapter(assignment)
    except ValueError:
        return None
    page = Path(row.page).with_suffix(".html").as_posix()
    base = course.book_url(course_root())
    url = f"{base}/{page}" if base else None
    return {"title": row.title, "url": url}


def record_api(root: Path, verdicts: Path, db_url: str | None = None):
    """The nbgrader API a grading process records with: nbgrader's autograder with
    :class:`ApplyVerdicts` in place of its ``Execute``, and our feedback settings; ``db_url``
    overrides the course's gradebook URL (a writer that shares it waits for the others)."""
    overrides = {"CourseDirectory.db_url": db_url} if db_url else {}
    api = course.nbgrader_api(
        root,
        **{
            "CourseDirectory.submitted_directory": str(root / ".coursekit" / "normalized"),
            "Autograde.autograde_preprocessors": _autograde_preprocessors(),
            "ApplyVerdicts.verdict_dir": str(verdicts),
            **feedback_settings(),
            "NbGraderAPI.log_level": "ERROR",  # "removing existing assignment" on every re-run is expected
            **overrides,
        },
    )
    try:  # nbgrader's own database code warns about its session handling; not ours to fix
        from sqlalchemy.exc import SAWarning

        warnings.filterwarnings("ignore", category=SAWarning)
    except ImportError:
        pass
    return api


def not_graded(plan: Plan, student: str, error: str) -> Result:
    """The result of a student whom the sandbox (not the student's code) failed: nothing recorded."""
    return Result(
        student, 0.0, sum(sum(nb.points.values()) for nb in plan.notebooks), [], f"not graded: {error}"
    )


def _autograde_preprocessors() -> list:
    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.preprocessors import (
        AssignLatePenalties,
        CheckCellMetadata,
        IgnorePattern,
        LimitOutput,
        SaveAutoGrades,
    )

    return [
        ApplyVerdicts,
        IgnorePattern,
        ClearMetadataPreprocessor,
        LimitOutput,
        SaveAutoGrades,
        AssignLatePenalties,
        CheckCellMetadata,
    ]


def _answer_sources(path: Path, plan: Plan) -> dict[str, str]:
    """Grade id -> the source of the answer that a grade cell grades (a written answer is its own
    cell; a test cell grades the answer before it), in the notebook at ``path`` ({} if none)."""
    try:
        nb = nbformat.read(path, as_version=4)
    except (OSError, ValueError):
        return {}
    sources = {nbgrader_meta(c).get("grade_id"): c.source for c in nb.cells}
    part_of = {gid: a for p in plan.notebooks for gid, a in p.part_of.items()}
    return {gid: sources.get(part_of.get(gid, gid), "") for gid in sources if gid}


def _hand_graded(
    root: Path, db_url: str, plan: Plan, student: str
) -> dict[tuple[str, str], tuple[bool, str]]:
    """(notebook, grade id) -> (its "needs manual grade" flag, the answer it grades) of each grade the
    instructor gave by hand, as the gradebook and the last autograded notebook hold them."""
    from nbgrader.api import Gradebook, MissingEntry

    found = {}
    with Gradebook(db_url) as gb:
        try:
            submission = gb.find_submission(plan.assignment, student)
        except MissingEntry:
            return {}
        for nb in submission.notebooks:
            graded = root / "autograded" / student / plan.assignment / f"{nb.name}.ipynb"
            sources = _answer_sources(graded, plan)
            for g in nb.grades:
                if g.manual_score is not None:
                    found[(nb.name, g.name)] = (bool(g.needs_manual_grade), sources.get(g.name, ""))
    return found


def _keep_hand_grading_status(root: Path, db_url: str, plan: Plan, student: str, before: dict) -> None:
    """nbgrader flags every hand-given grade "needs manual grade" again when a notebook is autograded
    again (nbgrader's ``SaveAutoGrades``), which put the instructor's finished written answers back on
    their to-do list at every re-run. The flag is restored where the answer it grades is unchanged;
    a changed answer keeps nbgrader's flag, to be looked at again."""
    from nbgrader.api import Gradebook, MissingEntry

    if not before:
        return
    changed = False
    with Gradebook(db_url) as gb:
        for (notebook, gid), (flag, source) in before.items():
            now = _answer_sources(root / "autograded" / student / plan.assignment / f"{notebook}.ipynb", plan)
            if now.get(gid, "") != source:
                continue
            try:
                grade = gb.find_grade(gid, notebook, plan.assignment, student)
            except MissingEntry:
                continue
            if grade.manual_score is not None and bool(grade.needs_manual_grade) != flag:
                grade.needs_manual_grade = flag
                changed = True
        if changed:
            gb.db.commit()


def record_student(
    root: Path,
    api,
    plan: Plan,
    student: str,
    error: str | None,
    cached: bool,
    feedback: bool,
    verdicts: Path,
    stages: dict | None = None,
) -> Result:
    """Record ``student``'s verdicts through nbgrader's autograder (``api``: :func:`record_api`) and
    write the feedback page; ``error``: the sandbox failed on this student, so nothing is recorded."""
    from nbgrader.api import Gradebook, MissingEntry

    stages = {} if stages is None else stages
    if error is not None:  # not the student's code's fault: record nothing, say so
        return not_graded(plan, student, error)
    notes, seconds, busy = [], 0.0, False
    staged = root / ".coursekit" / "normalized" / student / plan.assignment
    if staged.exists():
        shutil.rmtree(staged)
    staged.mkdir(parents=True)
    for nb in plan.notebooks:
        verdict = json.loads((verdicts / student / f"{nb.name}.json").read_text())
        if verdict.get("timestamp"):  # the time graded with, from the instructor's side (see coursekit.inbox)
            (staged / "timestamp.txt").write_text(verdict["timestamp"] + "\n")
        notes += verdict["notes"]
        seconds += verdict.get("seconds", 0.0)
        busy |= any(t.get("busy") for t in verdict.get("tests", {}).values())
        nbformat.write(nbformat.from_dict(verdict["normalized"]), staged / f"{nb.name}.ipynb")
    with timed(stages, "record"):
        by_hand = _hand_graded(root, api.coursedir.db_url, plan, student)
        outcome = api.autograde(plan.assignment, student, force=True, create=True)
        if outcome.get("success"):
            _keep_hand_grading_status(root, api.coursedir.db_url, plan, student, by_hand)
    error = None
    if not outcome.get("success"):
        error = course.last_line(outcome.get("error") or outcome.get("log") or "unknown error")
        log.warning("nbgrader could not record %s: %s", student, error)
    elif feedback:
        with timed(stages, "feedback"):
            failed = write_feedback(root, api, plan.assignment, student)
        if failed:
            log.warning("feedback for %s failed: %s", student, failed)
    with Gradebook(api.coursedir.db_url) as gb:
        max_score = gb.find_assignment(plan.assignment).max_score
        try:
            score = gb.find_submission(plan.assignment, student).score
        except MissingEntry:
            score = 0.0
    if busy and error is None:  # recorded, but some part is not graded yet: the instructor runs it again
        error = "the grading machine was too busy to time some checks; run coursekit autograde again"
    return Result(student, float(score), float(max_score), notes, error, cached, seconds, stages)
