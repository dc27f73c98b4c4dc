"""``coursekit check``: a student's notebook run as the autograder runs it, public checks only."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from coursekit.autograde.credit import Credit
from coursekit.autograde.grade import grade_notebook
from coursekit.autograde.plan import NotebookPlan, Plan, preload_modules
from coursekit.autograde.rebuild import is_test_cell, nbgrader_meta, thin_calls
from coursekit.sandbox import Limits, Worker

__all__ = ["CheckReport", "UNISOLATED", "check_notebook"]

#: the first line of a check run without bubblewrap: where it may differ from the autograder's run
UNISOLATED = (
    "note: checked without bubblewrap (not installed here): your code could read files outside its folder, "
    "which it cannot when the autograder runs it, so a notebook that reads them fails there"
)


@dataclass
class CheckReport:
    lines: list[str]
    public_score: float
    public_max: float
    hidden_max: float


def check_notebook(
    path: Path, *, sandbox: str = "auto", limits: Limits = Limits(), release=None
) -> CheckReport:
    """Run a student's notebook like the autograder does, with its public checks only.

    ``release``: the notebook the student was given; by default the course's release that the
    notebook's graded cells belong to (:func:`find_release`). The submission is rebuilt on it as the
    autograder rebuilds it, so both say the same about changed or deleted cells.
    """
    raw = Path(path).read_bytes()
    try:
        nb = nbformat.reads(raw.decode("utf-8-sig"), as_version=4)
    except Exception as e:  # anything nbformat cannot read
        raise ValueError(f"{path} is not a readable notebook: {e}") from None
    if release is None:
        release = find_release(nb)
    # the release the student was given, when this course has it: the notebook is rebuilt on it and
    # its public checks run, as the autograder does (same notes; a deleted test cell still runs)
    given = release if release is not None else nb
    tests, points, hidden = {}, {}, 0.0
    for cell in given.cells:
        meta = nbgrader_meta(cell)
        if not is_test_cell(cell):
            continue
        gid = meta.get("grade_id")
        try:
            tests[gid] = thin_calls(cell.source, f"test cell {gid!r}")
            points[gid] = float(meta.get("points", 0))
        except ValueError:
            hidden += float(meta.get("points", 0))  # a hidden test cell: only a comment in the release
    if not tests:
        raise ValueError(f"{path} has no public checks (is it an exercise notebook of this course?)")
    plan = NotebookPlan(Path(path).stem, given, tests, points, set())
    # the student's own code on their own machine: without bubblewrap it runs in a plain process (a
    # line says so) rather than not at all; the grading itself is the autograder's, whatever the kind
    preload = preload_modules(Plan("check", [plan], {}, ""))
    with Worker(sandbox, limits, preload=preload, own_code=True) as worker:
        verdict = grade_notebook(
            worker, plan, raw, {}, time.monotonic() + limits.submission_seconds, credit=_course_credit()
        )
        kind = worker.kind
    lines = [UNISOLATED] if kind == "rlimit" else []
    lines += [f"note: {n}" for n in verdict["notes"]]
    for cid, ran in verdict["outputs"].items():
        for o in ran["outputs"]:
            if o.get("output_type") == "error":
                lines.append(f"cell {cid}: {o.get('ename')}: {o.get('evalue')}")
    for gid, t in verdict["tests"].items():
        lines += [line for line in t["lines"] if not line.startswith("[FAIL]")]
        if not t["passed"]:
            lines.append(t["failure"] or f"{gid}: failed")
    return CheckReport(lines, verdict["score"], verdict["max_score"], hidden)


def _course_credit() -> Credit:
    """The partial credit of the course coursekit was installed from (its ``nbgrader_config.py``),
    so that a student's check scores as the autograder will; the default outside a course."""
    from coursekit import course
    from coursekit.chapters import course_root

    if not (course_root() / "nbgrader_config.py").is_file():
        return Credit()
    return Credit.from_config(course.nbgrader_api(course_root()).config)


def find_release(nb, exercises: Path | None = None):
    """The notebook of the course's release (``exercises/*/*.ipynb`` of the repository coursekit was
    installed from) whose graded cells ``nb`` holds: the one sharing the most grade ids with it, or
    ``None`` when none shares any (a notebook of another course; it is then checked on its own)."""
    from coursekit.chapters import course_root

    folder = exercises if exercises is not None else course_root() / "exercises"
    ids = {nbgrader_meta(c).get("grade_id") for c in nb.cells} - {None}
    best, shared = None, 0
    for candidate in sorted(folder.glob("*/*.ipynb")):
        try:
            released = nbformat.read(candidate, as_version=4)
        except Exception:  # not ours to judge: a broken file in exercises/ is the release test's
            continue
        n = len(ids & ({nbgrader_meta(c).get("grade_id") for c in released.cells} - {None}))
        if n > shared:
            best, shared = released, n
    return best
