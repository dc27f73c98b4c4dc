"""A class's submissions: collected, graded in parallel sandboxes, recorded by one writer.

Sandboxing and grading run in ``jobs`` worker threads, each with a sandbox of its own; one
thread writes the gradebook (nbgrader's), under the locks of :mod:`coursekit.autograde.gradebook`,
after a backup. Verdicts are cached by the content of what was graded (a :class:`Snapshot`), the
assignment and the grading code, so an interrupted run resumes where it stopped, and a re-run
gives identical scores.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from coursekit.autograde.grade import grade_notebook
from coursekit.autograde.gradebook import backup_gradebook, gradebook_setup, locked
from coursekit.autograde.plan import Plan, preload_modules, staged_plan
from coursekit.autograde.record import Result, record_all
from coursekit.sandbox import Limits, Worker, choose_kind

log = logging.getLogger(__name__)

__all__ = ["Snapshot", "autograde", "grade_inbox", "snapshot"]


def grade_inbox(root: Path, assignment: str, inbox: Path, *, times: dict | None = None, **options):
    """Collect the untrusted folder ``inbox`` into ``submitted/`` (see :mod:`coursekit.inbox`)
    and grade every student it holds, all under the course's lock: a run refused by the lock
    changes nothing. ``options`` are those of :func:`autograde`.

    Returns:
        ``(collected, results)``: what :func:`coursekit.inbox.collect` found (refusals and
        notes included) and a :class:`Result` per collected student.
    """
    from coursekit import inbox as inbox_module

    _check_options(**options)
    if not Path(inbox).is_dir():  # before the lock: a mistyped path changes nothing in the course folder
        raise FileNotFoundError(f"submissions folder {inbox} does not exist")
    notebooks = sorted(p.name for p in (root / "solutions" / assignment).glob("*.ipynb"))
    with locked(root, assignment) as api:
        collected = inbox_module.collect(root, assignment, Path(inbox), notebooks, times)
        results = (
            _autograde(root, api, assignment, collected.students, **options) if collected.students else []
        )
    return collected, results


def _check_options(jobs: int = 1, sandbox: str = "auto", **_) -> None:
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    choose_kind(sandbox)  # no bubblewrap, or an rlimit sandbox that could write here: stop before anything


def autograde(
    root: Path,
    assignment: str,
    students: list[str],
    *,
    jobs: int = 1,
    limits: Limits = Limits(),
    sandbox: str = "auto",
    fresh: bool = False,
    feedback: bool = True,
    progress: bool = False,
) -> list[Result]:
    """Grade ``students``' submissions of ``assignment`` (already in ``submitted/``)."""
    _check_options(jobs, sandbox)
    with locked(root, assignment) as api:
        return _autograde(
            root,
            api,
            assignment,
            students,
            jobs=jobs,
            limits=limits,
            sandbox=sandbox,
            fresh=fresh,
            feedback=feedback,
            progress=progress,
        )


def _autograde(
    root: Path,
    api,
    assignment: str,
    students: list[str],
    *,
    jobs: int = 1,
    limits: Limits = Limits(),
    sandbox: str = "auto",
    fresh: bool = False,
    feedback: bool = True,
    progress: bool = False,
) -> list[Result]:
    """Grade ``students`` while :func:`locked` holds the locks."""
    db_url = api.coursedir.db_url
    backup_gradebook(root, db_url)
    # registers the assignment; keeps the release for the plan
    with gradebook_setup(db_url, api.coursedir.course_id, students):
        plan = staged_plan(root, assignment)
    verdicts = root / ".coursekit" / "verdicts" / assignment
    todo: list[tuple[str, str]] = []  # (student, cache key) still to grade
    done: queue.Queue = queue.Queue()
    for student in students:
        key = _key(root, assignment, student, plan, limits)
        if not fresh and _cached(verdicts / student, plan, key):
            done.put((student, key, None, True))
        else:
            todo.append((student, key))
    threads = []
    if todo:
        serialise_ast_parsing()
        work: queue.Queue = queue.Queue()
        for item in todo:
            work.put(item)
        for _ in range(min(jobs, len(todo))):
            t = threading.Thread(
                target=_worker_loop, args=(root, plan, work, done, limits, sandbox, verdicts), daemon=True
            )
            t.start()
            threads.append(t)
    results = record_all(root, assignment, plan, students, done, feedback, progress, verdicts)
    for t in threads:
        t.join()
    return results


@dataclass(frozen=True)
class Snapshot:
    """One student's submission, read once: the bytes that are graded are the bytes the verdict's
    cache key hashes, so a submission changed behind the autograder's back is graded again."""

    files: dict[str, bytes]  # path relative to submitted/<student>/<assignment> -> content
    notes: tuple[str, ...]  # what collecting the inbox noted for this student

    def key(self, plan: Plan, limits: Limits) -> str:
        digest = hashlib.sha256(
            plan.fingerprint.encode() + json.dumps(asdict(limits), sort_keys=True).encode()
        )
        for name, data in sorted(self.files.items()):
            digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
        digest.update(json.dumps(self.notes).encode())
        return digest.hexdigest()

    def timestamp(self) -> str | None:
        """The submission time collect wrote from the instructor's side (nbgrader's timestamp.txt)."""
        data = self.files.get("timestamp.txt")
        return data.decode("utf-8", "replace").strip() if data is not None else None


def snapshot(root: Path, assignment: str, student: str) -> Snapshot:
    """Read ``submitted/<student>/<assignment>`` (regular files only; links are not followed)."""
    from coursekit.inbox import collect_notes

    folder = root / "submitted" / student / assignment
    files = {}
    for top, dirs, names in os.walk(folder, followlinks=False):
        dirs.sort()
        for name in sorted(names):
            path = Path(top, name)
            if path.is_file() and not path.is_symlink():
                files[str(path.relative_to(folder))] = path.read_bytes()
    return Snapshot(files, tuple(collect_notes(root, assignment, student)))


def _key(root: Path, assignment: str, student: str, plan: Plan, limits: Limits) -> str:
    return snapshot(root, assignment, student).key(plan, limits)


def _cached(folder: Path, plan: Plan, key: str) -> bool:
    """The verdicts in ``folder`` were made with ``key``, and none waits to be graded again because
    a busy machine kept a check from being timed."""
    try:
        verdicts = [json.loads((folder / f"{nb.name}.json").read_text()) for nb in plan.notebooks]
    except (OSError, ValueError):
        return False
    return all(
        v.get("key") == key and not any(t.get("busy") for t in v.get("tests", {}).values()) for v in verdicts
    )


_AST_LOCK = threading.Lock()


def serialise_ast_parsing() -> None:
    """Let one thread at a time turn source into Python AST objects (``ast.parse``).

    CPython 3.11 and 3.12 count the depth of the AST objects they build in a counter shared by
    every thread (python/cpython#106905): two grading threads parsing at once, ours (which part
    calls which) or Hypothesis's (the text of a strategy's lambda), fail with "SystemError: AST
    constructor recursion depth mismatch", and a student went ungraded. Idempotent; nothing to
    do from 3.13 on."""
    import ast
    import functools
    import sys

    if sys.version_info >= (3, 13) or getattr(ast.parse, "serialised", False):
        return
    parse = ast.parse

    @functools.wraps(parse)
    def locked_parse(*args, **kwargs):
        with _AST_LOCK:
            return parse(*args, **kwargs)

    locked_parse.serialised = True
    ast.parse = locked_parse


def _worker_loop(
    root, plan: Plan, work: queue.Queue, done: queue.Queue, limits, sandbox, verdicts: Path
) -> None:
    worker = None
    try:
        while True:
            try:
                student, key = work.get_nowait()
            except queue.Empty:
                return
            try:
                # never hand a sandbox whose template the last student stopped or killed to the next one
                if worker is None or not worker.healthy():
                    if worker is not None:
                        worker.close()
                    worker = Worker(sandbox, limits, preload=preload_modules(plan))
                _grade_student(worker, root, plan, student, limits, verdicts)
                done.put((student, key, None, False))
            except Exception as e:  # the sandbox itself failed: record it, start a fresh one, go on
                log.exception("grading %s failed", student)
                if worker is not None:
                    worker.close()
                    worker = None
                done.put((student, key, f"{type(e).__name__}: {e}", False))
    finally:
        if worker is not None:
            worker.close()


def _grade_student(
    worker: Worker, root: Path, plan: Plan, student: str, limits: Limits, verdicts: Path
) -> None:
    snap = snapshot(root, plan.assignment, student)
    key = snap.key(plan, limits)
    deadline = time.monotonic() + limits.submission_seconds
    expected = {f"{nb.name}.ipynb" for nb in plan.notebooks}
    extra = sorted(name for name in snap.files if name not in expected and name != "timestamp.txt")
    out = verdicts / student
    out.mkdir(parents=True, exist_ok=True)
    for nb in plan.notebooks:
        verdict = grade_notebook(
            worker, nb, snap.files.get(f"{nb.name}.ipynb"), plan.files, deadline, plan.secret, plan.credit
        )
        verdict["notes"][:0] = snap.notes
        if extra:
            shown = ", ".join(extra[:10]) + (f" and {len(extra) - 10} more" if len(extra) > 10 else "")
            verdict["notes"].append(f"other files in your submission were not used: {shown}")
        verdict["key"] = key
        verdict["timestamp"] = snap.timestamp()
        verdict["sandbox"] = worker.kind  # "rlimit": graded without isolation (the class report says so)
        tmp = out / f".{nb.name}.json.tmp"
        tmp.write_text(json.dumps(verdict))
        tmp.replace(out / f"{nb.name}.json")  # atomic: an interrupted run never leaves half a verdict
