"""``coursekit check``: a student's notebook run as the autograder runs it, public checks only."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from coursekit.autograde.grade import grade_notebook
from coursekit.autograde.plan import NotebookPlan, Plan, preload_modules
from coursekit.autograde.rebuild import is_test_cell, nbgrader_meta, thin_calls
from coursekit.sandbox import Limits, Worker

__all__ = ["CheckReport", "check_notebook"]


@dataclass
class CheckReport:
    lines: list[str]
    public_score: float
    public_max: float
    hidden_max: float


def check_notebook(path: Path, *, sandbox: str = "auto", limits: Limits = Limits()) -> CheckReport:
    """Run a student's notebook like the autograder does, with its public checks only."""
    raw = Path(path).read_bytes()
    try:
        nb = nbformat.reads(raw.decode("utf-8-sig"), as_version=4)
    except Exception as e:  # anything nbformat cannot read
        raise ValueError(f"{path} is not a readable notebook: {e}") from None
    tests, points, hidden = {}, {}, 0.0
    for cell in nb.cells:
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
    plan = NotebookPlan(Path(path).stem, nb, tests, points, set())
    kind = sandbox if sandbox != "auto" else ("bwrap" if _bwrap_ok() else "rlimit")
    with Worker(kind, limits, preload=preload_modules(Plan("check", [plan], {}, ""))) as worker:
        verdict = grade_notebook(worker, plan, raw, {}, time.monotonic() + limits.submission_seconds)
    lines = [f"note: {n}" for n in verdict["notes"]]
    for cid, ran in verdict["outputs"].items():
        for o in ran["outputs"]:
            if o.get("output_type") == "error":
                lines.append(f"cell {cid}: {o.get('ename')}: {o.get('evalue')}")
    for gid, t in verdict["tests"].items():
        lines += [line for line in t["lines"] if not line.startswith("[FAIL]")]
        if not t["passed"]:
            lines.append(t["failure"] or f"{gid}: failed")
    return CheckReport(lines, verdict["score"], verdict["max_score"], hidden)


def _bwrap_ok() -> bool:
    from coursekit.sandbox import bubblewrap_works

    return bubblewrap_works()
