"""A class's submissions: collected, then each student graded, recorded and given feedback by one task.

A task (:func:`grade_and_record`) grades one student in a sandbox of its process, records the
verdicts in the gradebook (nbgrader's, in its own short transactions) and writes the feedback page.
Tasks run in this process (``jobs=1``), in ``jobs`` processes of this machine, or on the workers of a
Dask cluster (:mod:`coursekit.autograde.cluster`); no stage runs once for the whole class but the
plan and the backup, under the locks of :mod:`coursekit.autograde.gradebook`. Verdicts are cached
by the content of what was graded (a :class:`Snapshot`), the assignment and the grading code, so an
interrupted run resumes where it stopped, and a re-run gives identical scores.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from coursekit.autograde.grade import grade_notebook
from coursekit.autograde.gradebook import backup_gradebook, gradebook_setup, locked
from coursekit.autograde.plan import Plan, preload_modules, staged_plan
from coursekit.autograde.record import Result, not_graded, record_api, record_student, timed
from coursekit.sandbox import Limits, Worker, choose_kind

log = logging.getLogger(__name__)

__all__ = ["Run", "Snapshot", "autograde", "concurrent_url", "grade_and_record", "grade_inbox", "snapshot"]


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


def _check_options(jobs: int = 1, sandbox: str = "auto", scheduler: str | None = None, **_) -> None:
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if scheduler is not None and not re.fullmatch(r"(tcp|tls)://[^\s/]+:\d+", scheduler):
        raise ValueError(f"scheduler must be an address like tcp://HOST:8786, got {scheduler!r}")
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
    scheduler: str | None = None,
) -> list[Result]:
    """Grade ``students``' submissions of ``assignment`` (already in ``submitted/``)."""
    _check_options(jobs, sandbox, scheduler)
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
            scheduler=scheduler,
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
    scheduler: str | None = None,
) -> list[Result]:
    """Grade ``students`` while :func:`locked` holds the locks: each student is one task (grade in
    the sandbox, record in the gradebook, write the feedback page), run in this process
    (``jobs=1``), in ``jobs`` processes of this machine, or on the workers of the Dask ``scheduler``."""
    db_url = api.coursedir.db_url
    backup_gradebook(root, db_url)
    # registers the assignment; keeps the release for the plan
    with gradebook_setup(db_url, api.coursedir.course_id, students):
        plan = staged_plan(root, assignment)
    run = Run(Path(root), plan, limits, sandbox, feedback, concurrent_url(db_url))
    verdicts = run.verdicts
    tasks = []  # (student, cache key, whether the verdicts are cached)
    for student in students:
        key = _key(root, assignment, student, plan, limits)
        tasks.append((student, key, not fresh and _cached(verdicts / student, plan, key)))
    from tqdm import tqdm

    bar = tqdm(total=len(tasks), desc=f"grading {assignment}", unit="notebook", disable=not progress)
    results: dict[str, Result] = {}
    for result in _run_tasks(run, tasks, jobs, scheduler):
        results[result.student] = result
        bar.update(1)
    bar.close()
    return [results[s] for s in students]


@dataclass(frozen=True)
class Run:
    """What a grading process needs to grade and record any student of one run. Picklable: it travels
    to this machine's processes and to Dask workers, which find the course folder at ``root`` (one
    machine, or a folder every machine mounts) and the gradebook at ``db_url``."""

    root: Path
    plan: Plan
    limits: Limits
    sandbox: str
    feedback: bool
    db_url: str

    @property
    def verdicts(self) -> Path:
        return self.root / ".coursekit" / "verdicts" / self.plan.assignment


def concurrent_url(db_url: str) -> str:
    """``db_url`` for a writer that shares the gradebook with others: a SQLite writer waits up to
    60 s for another's short transaction instead of failing after pysqlite's default 5 s."""
    if db_url.startswith("sqlite:///") and "?" not in db_url:
        return db_url + "?timeout=60"
    return db_url


def _run_tasks(run: Run, tasks: list, jobs: int, scheduler: str | None):
    """Each task's :class:`Result`, in the order they finish."""
    if scheduler is not None:
        from coursekit.autograde import cluster

        yield from cluster.run_tasks(scheduler, run, tasks, grade_and_record)
        return
    if jobs == 1 or len(tasks) <= 1:
        try:
            for student, key, cached in tasks:
                yield grade_and_record(run, student, key, cached)
        finally:
            _close_state()
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # spawn: a fork of this process would copy its threads' locks and torch's thread pool mid-use
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=context) as pool:
        futures = {pool.submit(grade_and_record, run, *task): task for task in tasks}
        for future in as_completed(futures):
            student, key, cached = futures[future]
            try:
                yield future.result()
            except Exception as e:  # the grading process itself died: that student is not graded
                log.exception("grading %s failed", student)
                yield not_graded(run.plan, student, f"{type(e).__name__}: {e}")


#: each grading thread's sandbox and nbgrader API (thread id -> state), kept from one student to the
#: next of the same run: a process of the pool has one thread, a Dask worker as many as it is given
_STATES: dict[int, dict] = {}
_STATES_LOCK = threading.Lock()


def _close_state(ident: int | None = None) -> None:
    with _STATES_LOCK:
        state = _STATES.pop(threading.get_ident() if ident is None else ident, None)
    if state is not None and state.get("worker") is not None:
        state["worker"].close()


def _close_all() -> None:
    for ident in list(_STATES):
        _close_state(ident)


def _state(run: Run) -> dict:
    """The sandbox and the recording API of this thread for ``run`` (made on first use; a thread
    that served another run closes that run's sandbox first)."""
    ident = threading.get_ident()
    state = _STATES.get(ident)
    if state is None or state["run"] != run:
        serialise_ast_parsing()  # a Dask worker given several threads grades in them at once
        _close_state(ident)
        import multiprocessing.util

        state = {"run": run, "worker": None, "api": record_api(run.root, run.verdicts, run.db_url)}
        with _STATES_LOCK:
            if not _STATES:  # a pool's process (or a Dask worker) closes its sandboxes when it exits
                multiprocessing.util.Finalize(None, _close_all, exitpriority=10)
            _STATES[ident] = state
    return state


def grade_and_record(run: Run, student: str, key: str, cached: bool) -> Result:
    """One student, whole: grade the submission in the sandbox (unless ``cached``), record the
    verdicts in the gradebook in nbgrader's own transactions, write the feedback page. Runs in
    whichever process or machine the run gives it; grading the same student again replaces what an
    earlier, interrupted attempt recorded."""
    state = _state(run)
    error, stages = None, {}
    if not cached:
        try:
            worker = state["worker"]
            # never hand a sandbox whose template the last student stopped or killed to the next one
            if worker is None or not worker.healthy():
                if worker is not None:
                    worker.close()
                worker = state["worker"] = Worker(run.sandbox, run.limits, preload=preload_modules(run.plan))
                state["sandbox_cpu"] = 0.0  # its start (Python, torch, the preloaded modules) counts too
            with timed(stages, "grade"):
                _grade_student(worker, run.root, run.plan, student, run.limits, run.verdicts)
            # what the student's code and the checks computed in the sandbox, which the grade stage's
            # own CPU seconds cannot see (wall seconds: none of its own, they are the grade stage's)
            used = worker.cpu_seconds()
            stages["sandbox"] = [0.0, max(0.0, used - state["sandbox_cpu"])]
            state["sandbox_cpu"] = used
        except Exception as e:  # the sandbox itself failed: record nothing, start a fresh one, go on
            log.exception("grading %s failed", student)
            if state["worker"] is not None:
                state["worker"].close()
                state["worker"] = None
            error = f"{type(e).__name__}: {e}"
    return record_student(
        run.root, state["api"], run.plan, student, error, cached, run.feedback, run.verdicts, stages
    )


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
