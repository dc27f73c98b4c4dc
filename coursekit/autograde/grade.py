"""Step 3, *grade*: every test cell of a notebook, on the trusted side.

A test cell is a thin call into ``coursekit.grading``; the check builds its inputs here, sends
them to a fresh, reseeded copy of the student's process and reads the answers back as data.
The result of a notebook is its *verdict*: the outputs of its cells, each test cell's result
with its lines and hints, and the notes the student will read.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import re
import time

import nbformat

from coursekit.autograde.credit import Credit
from coursekit.autograde.plan import NotebookPlan, resolve
from coursekit.autograde.rebuild import Call, is_test_cell, nbgrader_meta, normalize
from coursekit.autograde.run import run_notebook
from coursekit.chapters import chapter
from coursekit.grading import core, harness
from coursekit.sandbox import BUSY, StudentError, Worker
from coursekit.sandbox.host import TEMPLATE_GONE

log = logging.getLogger(__name__)

__all__ = ["VERDICT_VERSION", "grade_notebook"]

VERDICT_VERSION = 2  # 2: test results carry their clauses and partial scores


@contextlib.contextmanager
def one_torch_thread():
    """Run the trusted side's torch on one thread while this thread grades a notebook.

    The references a grader computes are tiny; more threads only spin, and several grading
    processes of one machine (``--jobs``, Dask workers), each with a pool as wide as the machine,
    fought over its cores: the trusted side of a student cost 17% more CPU on 2 cores than on 1
    (benchmarks/class_scale.py). One thread also makes the references' rounding the same on every
    machine, as it is in the sandbox. torch's setting (OpenMP's) belongs to the calling thread:
    other grading threads of the process keep theirs, and the caller gets its own back."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def grade_notebook(
    worker: Worker,
    plan: NotebookPlan,
    raw: bytes | None,
    files: dict[str, bytes],
    deadline: float,
    secret: bytes = b"",
    credit: Credit = Credit(),
) -> dict:
    """Grade one notebook (``raw`` is ``None`` when it was not submitted); return its verdict.
    ``secret`` is mixed into the seed of every check (see :func:`course_secret`); ``credit`` says
    how a test cell's points follow the checks it passed (see :mod:`coursekit.autograde.credit`).
    The trusted side's torch runs on one thread meanwhile (:func:`one_torch_thread`)."""
    with one_torch_thread():
        return _grade_notebook(worker, plan, raw, files, deadline, secret, credit)


def _grade_notebook(
    worker: Worker,
    plan: NotebookPlan,
    raw: bytes | None,
    files: dict[str, bytes],
    deadline: float,
    secret: bytes,
    credit: Credit,
) -> dict:
    started = time.monotonic()
    if raw is None:
        norm = normalize(b"", plan.release)
        norm.notes[:] = [f"{plan.name}.ipynb was not submitted"]
    else:
        norm = normalize(raw, plan.release)
    verdict = {
        "version": VERDICT_VERSION,
        "notebook": plan.name,
        "notes": list(norm.notes),
        "normalized": json.loads(nbformat.writes(norm.notebook)),
        "outputs": {},
        "tests": {},
        "parts": plan.part_list(),
    }
    session = None
    if norm.readable:
        cells = [
            (c.id, c.source, nbgrader_meta(c).get("grade_id") or f"added cell {c.id}")
            for c in norm.notebook.cells
            if c.cell_type == "code" and not is_test_cell(c)
        ]
        session = run_notebook(worker, cells, files, deadline, verdict, watched_references(plan))
    busy = verdict.pop("busy", None)  # a busy machine kept a cell from running, twice: not graded now
    if busy:
        verdict["notes"].append(f"your notebook is not graded yet: {busy}; your instructor grades it again")
    for gid, calls in plan.tests.items():
        verdict["tests"][gid] = _grade_cell(
            session,
            calls,
            deadline,
            gid in plan.hidden,
            plan.points.get(gid, 0.0),
            None if norm.readable else norm.notes[0],
            secret,
            credit,
        )
        if busy:
            verdict["tests"][gid].update(passed=False, score=0.0, busy=True, failure=f"not graded: {busy}")
    _name_earlier_parts(plan, norm.notebook, verdict["tests"])
    changed = prediction_changes(plan, raw, verdict["tests"]) if norm.readable else []
    if changed:
        verdict["prediction_changes"] = changed
    if session is not None:
        verdict["reference_calls"] = sorted(session.reference_calls)
        session.close()
    if worker.reset_after_student() == TEMPLATE_GONE:
        verdict["notes"].append(f"{TEMPLATE_GONE} The sandbox was replaced before the next notebook.")
    verdict["score"] = sum(t["score"] for t in verdict["tests"].values())
    verdict["max_score"] = sum(plan.points.values())
    verdict["seconds"] = round(time.monotonic() - started, 3)
    return verdict


def watched_references(plan: NotebookPlan) -> list[tuple[str, str]]:
    """``(module, name)`` of the course's reference of each graded part of the notebook: the
    sandbox records the student's calls of these (an integrity signal of the class report)."""
    try:
        modules = chapter(plan.name).modules
    except (KeyError, ValueError):
        return []
    names = sorted({n for _, defined in plan.parts for n in defined})
    found = []
    for m in modules:
        module = importlib.import_module(f"coursekit.{m}")
        found += [(module.__name__, n) for n in names if callable(getattr(module, n, None))]
    return found


#: what a prediction's check prints (coursekit.grading.questions): the value it saw, then the answer
_PREDICTED = re.compile(r"You predicted (.+?); the experiment gives ")


def prediction_changes(plan: NotebookPlan, raw: bytes | None, results: dict) -> list[list[str]]:
    """``[answer cell, value its check saw, value graded]`` for each prediction whose check, as the
    outputs the student handed in show, printed the experiment's answer for another value than
    the one graded now: the prediction was changed after its answer was shown. A signal for the
    instructor (the class report), never a deduction; nothing when the outputs were cleared."""
    try:
        cells = json.loads((raw or b"").decode("utf-8-sig")).get("cells")
    except (ValueError, AttributeError):
        return []
    seen: dict[str, str] = {}
    for cell in cells if isinstance(cells, list) else []:
        gid = nbgrader_meta(cell).get("grade_id") if isinstance(cell, dict) else None
        answer = plan.part_of.get(gid) if isinstance(gid, str) else None
        outputs = cell.get("outputs") if answer else None
        for out in outputs if isinstance(outputs, list) else []:
            text = out.get("text") if isinstance(out, dict) else None
            text = "".join(text) if isinstance(text, list) else text
            found = _PREDICTED.search(text) if isinstance(text, str) else None
            if found:
                seen.setdefault(answer, found[1][:200])
    graded: dict[str, str] = {}
    for gid, result in results.items():
        for line in result.get("lines", []):
            found = _PREDICTED.search(line)
            if found and gid in plan.part_of:
                graded.setdefault(plan.part_of[gid], found[1])
    return [[a, seen[a], graded[a]] for a in sorted(seen) if a in graded and graded[a] != seen[a]]


def _name_earlier_parts(plan: NotebookPlan, notebook, results: dict) -> None:
    """Start the failure of a part whose answer calls an earlier, failing part with "fix part N first"."""
    failed = {plan.part_of[gid] for gid, t in results.items() if not t["passed"] and gid in plan.part_of}
    answers = {
        nbgrader_meta(c).get("grade_id"): c.source for c in notebook.cells if nbgrader_meta(c).get("solution")
    }
    for answer, sentence in harness.fix_first(plan.parts, answers, failed, plan.labels).items():
        for gid, t in results.items():
            if (
                plan.part_of.get(gid) == answer
                and not t["passed"]
                and not (t["failure"] or "").startswith("not graded")
            ):
                t["failure"] = f"{sentence}.\n{t['failure'] or 'failed'}"


#: how many times a test cell is graded when a busy machine kept one of its checks from being timed
BUSY_TRIES = 2


def _grade_cell(
    session,
    calls: list[Call],
    deadline: float,
    hidden: bool,
    points: float,
    unreadable: str | None,
    secret: bytes = b"",
    credit: Credit = Credit(),
) -> dict:
    """The result of one test cell. A check that a busy grading machine kept from being timed
    (:class:`coursekit.sandbox.MachineBusy`) is no mistake of the student's: the cell is graded again;
    still busy, it is *not graded* (``busy``: the instructor re-runs it), never scored 0."""
    for _ in range(BUSY_TRIES):
        result = _grade_cell_once(session, calls, deadline, hidden, points, unreadable, secret, credit)
        if not _stopped_by_load(result):
            return result
    result.update(
        passed=False,
        score=0.0,
        busy=True,
        failure=f"not graded: {BUSY} to time this part's checks, twice; your instructor grades it again",
    )
    return result


def _stopped_by_load(result: dict) -> bool:
    texts = [result.get("failure") or ""] + [h for _, h in result.get("failed_checks") or []]
    return any(f"this check {BUSY}" in t for t in texts)


def _grade_cell_once(
    session,
    calls: list[Call],
    deadline: float,
    hidden: bool,
    points: float,
    unreadable: str | None,
    secret: bytes = b"",
    credit: Credit = Credit(),
) -> dict:
    result = {"hidden": hidden, "points": points, "lines": [], "failure": None, "passed": False, "score": 0.0}
    if unreadable is not None:
        result["failure"] = f"not graded: {unreadable}"
        return result
    if session is None:
        result["failure"] = "not graded: your notebook could not be run"
        return result
    if time.monotonic() >= deadline:
        result["failure"] = "not graded: your submission used up its time budget"
        return result
    lines: list[str] = []
    clauses: list[tuple[str, float, bool]] = []
    tokens = core.SESSION.set(session), core.REPORT.set(lines), core.SECRET.set(secret)
    clause_token = core.CLAUSES.set(clauses)
    try:
        for call in calls:
            fn = resolve(call)
            fn(*(session.remote(name) for name in call.args), **dict(call.kwargs))
        result["passed"], result["score"] = True, points
    except core.GradingFailure as e:
        result["failure"] = str(e)
        result["failed_checks"] = [[f"{e.part}: {name}", hint] for name, hint in e.failures]
        result["score"] = credit.score(points, clauses)  # the clauses that passed (0: all or nothing)
    except StudentError as e:
        result["failure"] = str(e)
    except Exception as e:  # a bug in a grader: say so plainly, and keep grading the others
        log.exception("grader error")
        result["failure"] = (
            f"internal error in the grader ({type(e).__name__}: {e}); please tell your instructor"
        )
    finally:
        core.SESSION.reset(tokens[0])
        core.REPORT.reset(tokens[1])
        core.SECRET.reset(tokens[2])
        core.CLAUSES.reset(clause_token)
        session.end_check()
    result["lines"] = lines
    result["clauses"] = [[name, weight, ok] for name, weight, ok in clauses]
    result["clause_points"] = credit.points_of(points, clauses)
    return result
