"""``coursekit autograde``: nbgrader's gradebook and feedback, with student code sandboxed.

For every submission:

1. **Rebuild** the notebook on the release's structure (:mod:`coursekit.submission`):
   broken JSON, deleted, duplicated or retyped cells become plain notes, never a crash.
2. **Run** its code cells (not its test cells) in a sandbox (:mod:`coursekit.sandbox`),
   one cell at a time with a wall-clock cap; a cell that hangs or kills its process
   is skipped and the notebook is run again without it.
3. **Grade** each test cell on the trusted side: the cell is a thin call into
   ``coursekit.grading``, whose checks send inputs to a fresh, reseeded copy of
   the notebook's process and read the answers back as data. Hidden tests never
   enter the sandbox.
4. **Record** the result (a *verdict*) in ``.coursekit/verdicts/``; then nbgrader's
   own autograder runs on the rebuilt notebook with its ``Execute`` step replaced by
   :class:`ApplyVerdicts`, so the gradebook, manual grades, late penalties and
   feedback stay nbgrader's.

Sandboxing and grading run in parallel workers (``jobs``); one process writes the
gradebook, under a lock, after a backup. Verdicts are cached by the content of the
submission, the assignment and the grader code, so an interrupted run resumes where
it stopped and a re-run gives identical scores.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import importlib
import json
import logging
import os
import queue
import secrets
import shutil
import sqlite3
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

import coursekit
from coursekit import course, inert
from coursekit.grading import core, harness
from coursekit.sandbox import CellFailed, Limits, StudentError, Worker
from coursekit.sandbox.host import TEMPLATE_GONE
from coursekit.submission import Call, is_test_cell, nbgrader_meta, normalize, thin_calls

log = logging.getLogger(__name__)

VERDICT_VERSION = 1
HIDDEN_PLACEHOLDER = "# Hidden checks ran here when your notebook was graded; their results are below."
KEEP_BACKUPS = 20


# --------------------------------------------------------------------------- the assignment


@dataclass
class NotebookPlan:
    """What grading one notebook of an assignment needs, all from trusted files."""

    name: str
    release: nbformat.NotebookNode  # the students' version (answers blank, hidden tests removed)
    tests: dict[str, list[Call]]  # test cell grade id -> its thin calls (from the instructor's notebook)
    points: dict[str, float]  # grade id -> points, for every graded cell
    hidden: set[str]  # test cells whose checks students do not see
    parts: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)  # (answer cell, names it defines), in order
    part_of: dict[str, str] = field(default_factory=dict)  # test cell grade id -> its answer cell


@dataclass
class Plan:
    assignment: str
    notebooks: list[NotebookPlan]
    files: dict[str, bytes]  # data files shipped with the assignment
    fingerprint: str  # changes when the assignment or the grading code changes
    secret: bytes = b""  # the course's secret, mixed into the seeds of every check (see course_secret)


def plan_notebook(source: nbformat.NotebookNode, release: nbformat.NotebookNode, name: str) -> NotebookPlan:
    """Read the test cells of the instructor's notebook ``source`` (raises ``ValueError``
    if one is not a thin call into ``coursekit.grading``)."""
    tests, points, hidden, parts, part_of = {}, {}, set(), [], {}
    released = {nbgrader_meta(c).get("grade_id"): c for c in release.cells}
    for cell in source.cells:
        meta = nbgrader_meta(cell)
        gid = meta.get("grade_id")
        if meta.get("grade"):
            points[gid] = float(meta.get("points", 0))
        if cell.cell_type == "code" and meta.get("solution"):
            parts.append((gid, harness.defined_names(cell.source)))
        if is_test_cell(cell):
            if parts:
                part_of[gid] = parts[-1][0]
            tests[gid] = thin_calls(cell.source, f"test cell {gid!r} of {name}")
            for call in tests[gid]:
                _resolve(call)  # fail now, not while grading
            if gid in released and "coursekit.grading" not in released[gid].source:
                hidden.add(gid)
    return NotebookPlan(name, release, tests, points, hidden, parts, part_of)


def _resolve(call: Call):
    if not call.module.startswith("coursekit.grading."):
        raise ValueError(f"{call.module} is not a coursekit.grading module")
    module = importlib.import_module(call.module)
    fn = getattr(module, call.function, None)
    if not callable(fn):
        raise ValueError(f"{call.module} has no function {call.function}")
    return fn


def course_secret(root: Path) -> bytes:
    """The course's grading secret, created on first use in ``.coursekit/secret`` (readable by
    its owner only; never inside the sandbox). It is mixed into the seed of every check, so
    re-runs see the same inputs while nobody can compute them from the grading source."""
    path = root / ".coursekit" / "secret"
    path.parent.mkdir(exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    secret = path.read_text().strip()
    if len(secret) < 32:
        raise RuntimeError(f"{path} holds no usable secret; delete it and run again (the hidden inputs will change)")
    return secret.encode()


def load_plan(root: Path, assignment: str, release_dir: Path) -> Plan:
    source_dir = root / "solutions" / assignment
    notebooks, files = [], {}
    for path in sorted(source_dir.glob("*.ipynb")):
        source = nbformat.read(path, as_version=4)
        release = nbformat.read(release_dir / assignment / path.name, as_version=4)
        notebooks.append(plan_notebook(source, release, path.stem))
    for path in sorted(source_dir.rglob("*")):
        if path.is_file() and path.suffix != ".ipynb" and ".ipynb_checkpoints" not in path.parts:
            files[str(path.relative_to(source_dir))] = path.read_bytes()
    digest = hashlib.sha256()
    for nb in notebooks:
        digest.update(nbformat.writes(nb.release).encode())
        digest.update(json.dumps({k: [asdict(c) for c in v] for k, v in nb.tests.items()}, sort_keys=True, default=str).encode())
    for name, data in files.items():
        digest.update(name.encode() + hashlib.sha256(data).digest())
    digest.update(_code_fingerprint().encode())
    secret = course_secret(root)
    digest.update(hashlib.sha256(secret).digest())
    return Plan(assignment, notebooks, files, digest.hexdigest(), secret)


def _code_fingerprint() -> str:
    """A hash of coursekit's source: verdicts made by other grading code are not reused."""
    digest = hashlib.sha256()
    package = Path(coursekit.__file__).parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + path.read_bytes())
    return digest.hexdigest()


# --------------------------------------------------------------------------- grading one submission


def grade_notebook(worker: Worker, plan: NotebookPlan, raw: bytes | None, files: dict[str, bytes], deadline: float,
                   secret: bytes = b"") -> dict:
    """Grade one notebook (``raw`` is ``None`` when it was not submitted); return its verdict.
    ``secret`` is mixed into the seed of every check (see :func:`course_secret`)."""
    started = time.monotonic()
    if raw is None:
        norm = normalize(b"", plan.release)
        norm.notes[:] = [f"{plan.name}.ipynb was not submitted"]
    else:
        norm = normalize(raw, plan.release)
    verdict = {
        "version": VERDICT_VERSION, "notebook": plan.name, "notes": list(norm.notes),
        "normalized": json.loads(nbformat.writes(norm.notebook)), "outputs": {}, "tests": {},
    }
    session = None
    if norm.readable:
        cells = [(c.id, c.source, nbgrader_meta(c).get("grade_id") or f"added cell {c.id}") for c in norm.notebook.cells
                 if c.cell_type == "code" and not is_test_cell(c)]
        session = _run_notebook(worker, cells, files, deadline, verdict)
    for gid, calls in plan.tests.items():
        verdict["tests"][gid] = _grade_cell(session, calls, deadline, gid in plan.hidden, plan.points.get(gid, 0.0),
                                            None if norm.readable else norm.notes[0], secret)
    _name_earlier_parts(plan, norm.notebook, verdict["tests"])
    if session is not None:
        session.close()
    if worker.reset_after_student() == TEMPLATE_GONE:
        verdict["notes"].append(f"{TEMPLATE_GONE} The sandbox was replaced before the next notebook.")
    verdict["score"] = sum(t["score"] for t in verdict["tests"].values())
    verdict["max_score"] = sum(plan.points.values())
    verdict["seconds"] = round(time.monotonic() - started, 3)
    return verdict


def _name_earlier_parts(plan: NotebookPlan, notebook, results: dict) -> None:
    """Start the failure of a part whose answer calls an earlier, failing part with "fix part N first"."""
    failed = {plan.part_of[gid] for gid, t in results.items() if not t["passed"] and gid in plan.part_of}
    answers = {nbgrader_meta(c).get("grade_id"): c.source for c in notebook.cells if nbgrader_meta(c).get("solution")}
    for answer, sentence in harness.fix_first(plan.parts, answers, failed).items():
        for gid, t in results.items():
            if plan.part_of.get(gid) == answer and not t["passed"] and not (t["failure"] or "").startswith("not graded"):
                t["failure"] = f"{sentence}.\n{t['failure'] or 'failed'}"


def _run_notebook(worker: Worker, cells, files, deadline: float, verdict: dict):
    """Run the code cells; skip (and note) any that hang or kill the process. Returns the session."""
    skipped: dict[str, str] = {}
    noted: set[str] = set()  # cells whose dropped outputs were noted (once, whatever the attempts)
    for _attempt in range(4):
        if worker.broken or not worker.alive():  # the student's code stopped or killed the sandbox's template
            worker.restart()
        session = worker.session(files=files)
        failed = None
        for cid, source, label in cells:
            if cid in skipped:
                continue
            try:
                reply = session.run_cell(source, label, deadline)
            except CellFailed as e:
                failed = (cid, label, str(e))
                break
            # the sandbox's answer is hostile data: keep only well-formed, inert outputs
            outputs, dropped = inert.clean_outputs(reply.get("outputs", []))
            count = reply.get("execution_count")
            verdict["outputs"][cid] = {"outputs": outputs, "execution_count": count if type(count) is int else None}
            if dropped and cid not in noted:
                noted.add(cid)
                where = f"the cell {label!r}" if not label.startswith("added cell") else "a cell you added"
                verdict["notes"].append(f"in {where}: {'; '.join(dropped[:3])}")
        if failed is None:
            session.revive = lambda: _revive(worker, cells, skipped, files, deadline)
            return session
        cid, label, why = failed
        session.close()
        skipped[cid] = why
        where = f"the cell {label!r}" if not label.startswith("added cell") else "a cell you added"
        verdict["notes"].append(f"{where} was stopped: {why}; the rest of the notebook ran without it")
        verdict["outputs"][cid] = {"outputs": [_error_output("Stopped", f"this cell was stopped by the autograder: {why}")],
                                   "execution_count": None}
        if time.monotonic() >= deadline:
            break
    verdict["notes"].append("your notebook could not be run to the end; the remaining checks failed")
    return None


def _revive(worker, cells, skipped, files, deadline):
    """A fresh notebook process with the same state, after the sandbox killed the last one."""
    if worker.broken or not worker.alive():
        worker.restart()
    session = worker.session(files=files)
    for cid, source, label in cells:
        if cid not in skipped:
            session.run_cell(source, label, deadline)
    return session


def _grade_cell(session, calls: list[Call], deadline: float, hidden: bool, points: float, unreadable: str | None,
                secret: bytes = b"") -> dict:
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
    tokens = core.SESSION.set(session), core.REPORT.set(lines), core.SECRET.set(secret)
    try:
        for call in calls:
            fn = _resolve(call)
            fn(*(session.remote(name) for name in call.args), **dict(call.kwargs))
        result["passed"], result["score"] = True, points
    except core.GradingFailure as e:
        result["failure"] = str(e)
        result["failed_checks"] = [[f"{e.part}: {name}", hint] for name, hint in e.failures]
    except StudentError as e:
        result["failure"] = str(e)
    except Exception as e:  # a bug in a grader: say so plainly, and keep grading the others
        log.exception("grader error")
        result["failure"] = f"internal error in the grader ({type(e).__name__}: {e}); please tell your instructor"
    finally:
        core.SESSION.reset(tokens[0])
        core.REPORT.reset(tokens[1])
        core.SECRET.reset(tokens[2])
        session.end_check()
    result["lines"] = lines
    return result


def _error_output(ename: str, evalue: str) -> dict:
    return {"output_type": "error", "ename": ename, "evalue": evalue, "traceback": [f"{ename}: {evalue}"]}


# --------------------------------------------------------------------------- nbgrader integration


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
                cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="\n".join(test["lines"]) + "\n")] if test["lines"] else []
                if not test["passed"]:
                    cell.outputs.append(nbformat.v4.new_output("error", ename="GradingFailure", evalue=test["failure"] or "failed",
                                                               traceback=[test["failure"] or "failed"]))
                cell.execution_count = None
            elif cell.get("id") in verdict["outputs"]:
                ran = verdict["outputs"][cell.id]
                cell.outputs = [nbformat.from_dict(o) for o in ran["outputs"]]
                cell.execution_count = ran.get("execution_count")
        if verdict["notes"]:  # notes quote file names and cell labels the student chose: literal text only
            text = "**Notes from the autograder**\n\n" + "\n".join(f"- {inert.markdown_text(n)}" for n in verdict["notes"])
            note = nbformat.v4.new_markdown_cell(text)
            note.id = "autograder-notes"
            nb.cells.insert(0, note)
        return nb, resources


class HideHiddenTests(NbGraderPreprocessor):
    """For the students' feedback: a test cell holding hidden tests shows a placeholder
    instead of its source (its results stay). The instructor's autograded copy is untouched."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and "BEGIN HIDDEN TESTS" in cell.source:
            cell.source = HIDDEN_PLACEHOLDER
        return cell, resources


def _feedback_preprocessors() -> list:
    from nbgrader.preprocessors import GetGrades
    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor

    return [HideHiddenTests, GetGrades, CSSHTMLHeaderPreprocessor]


# --------------------------------------------------------------------------- a batch


@dataclass
class Result:
    student: str
    score: float
    max_score: float
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # nbgrader could not record this student (should not happen)
    cached: bool = False
    seconds: float = 0.0


@contextlib.contextmanager
def course_lock(root: Path):
    """One autograde run per course at a time: the second one stops with a clear message."""
    folder = root / ".coursekit"
    folder.mkdir(exist_ok=True)
    with open(folder / "autograde.lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise RuntimeError(f"another `coursekit autograde` is running on this course ({holder}); wait for it to finish") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}, started {dt.datetime.now():%Y-%m-%d %H:%M:%S}")
        f.flush()
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()
            fcntl.flock(f, fcntl.LOCK_UN)


def backup_gradebook(root: Path, db_url: str) -> Path | None:
    """Copy the gradebook before a run writes to it: SQLite with its backup API (consistent
    while in use), PostgreSQL with ``pg_dump`` (custom format: restore with ``pg_restore``)."""
    from sqlalchemy import make_url

    url = make_url(db_url)
    if _is_server(db_url):
        return _pg_dump(root, url)
    if not db_url.startswith("sqlite:///"):
        log.warning("gradebook %s was not backed up: coursekit backs up SQLite and PostgreSQL gradebooks only",
                    url.render_as_string(hide_password=True))
        return None
    db = Path(db_url.removeprefix("sqlite:///"))
    if not db.is_file():
        return None
    target = _backup_path(root, ".db")
    with contextlib.closing(sqlite3.connect(db)) as src, contextlib.closing(sqlite3.connect(target)) as dst:
        src.backup(dst)
    _prune_backups(target.parent, ".db")
    return target


def _backup_path(root: Path, suffix: str) -> Path:
    folder = root / ".coursekit" / "backups"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"gradebook-{dt.datetime.now():%Y%m%d-%H%M%S-%f}{suffix}"


def _prune_backups(folder: Path, suffix: str) -> None:
    for old in sorted(folder.glob(f"gradebook-*{suffix}"))[:-KEEP_BACKUPS]:
        old.unlink()


def _pg_dump(root: Path, url) -> Path | None:
    """``pg_dump`` the PostgreSQL gradebook at ``url``; raise if it fails, warn if there is none."""
    from sqlalchemy import URL

    exe = shutil.which("pg_dump")
    if exe is None:
        log.warning("pg_dump not found: the PostgreSQL gradebook was NOT backed up before this run "
                    "(install the PostgreSQL client tools, e.g. apt-get install postgresql-client)")
        return None
    target = _backup_path(root, ".dump")
    # libpq's own URI (no "+driver"); the password goes in the environment, not on the command line
    dsn = URL.create("postgresql", username=url.username, host=url.host, port=url.port, database=url.database, query=url.query)
    env = dict(os.environ, **({"PGPASSWORD": url.password} if url.password else {}))
    done = subprocess.run([exe, "--format=custom", f"--file={target}", f"--dbname={dsn.render_as_string()}"],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        target.unlink(missing_ok=True)
        raise RuntimeError(f"pg_dump could not back up the gradebook, so nothing was graded: {course._last_line(done.stderr)}")
    _prune_backups(target.parent, ".dump")
    return target


@contextlib.contextmanager
def gradebook_lock(db_url: str, assignment: str):
    """One run per assignment and PostgreSQL gradebook at a time, from whichever course folder.
    A file gradebook needs no more than :func:`course_lock`, which covers its course folder."""
    if not _is_server(db_url):
        yield
        return
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(_advisory_lock(db_url, f"coursekit autograde {assignment}", wait=False))
        except BlockingIOError:
            raise RuntimeError(f"another `coursekit autograde` is grading {assignment} into this gradebook "
                               "(from another course folder); wait for it to finish") from None
        yield


@contextlib.contextmanager
def gradebook_setup(db_url: str, course_id: str, students: list[str]):
    """Create, one run at a time, the rows that runs from other course folders may create at
    the same moment in a shared PostgreSQL gradebook: tables, courses, students, and (in the
    block) the assignment. nbgrader looks a row up, then inserts it: two runs doing so at
    once fail with a duplicate key. A file gradebook has one writer at a time: nothing to do."""
    if not _is_server(db_url):
        yield
        return
    from nbgrader.api import Gradebook

    with _advisory_lock(db_url, "coursekit gradebook setup", wait=True):
        with Gradebook(db_url):  # the default course, which coursekit.report opens
            pass
        with Gradebook(db_url, course_id) as gb:
            for student in students:
                gb.update_or_create_student(student)
        yield


def check_gradebook(db_url: str) -> list[tuple[bool, str, str]]:
    """What ``coursekit doctor`` reports about a gradebook: ``(ok, what, detail)`` lines.

    A SQLite file needs nothing. A PostgreSQL server needs its driver (psycopg), ``pg_dump``
    for the backup taken before every run (a run without it warns and goes on, unbacked), and
    a server that accepts a connection; each missing piece gets a line that says how to fix it.
    """
    from sqlalchemy import make_url

    url = make_url(db_url)
    where = url.render_as_string(hide_password=True)
    if not _is_server(db_url):
        return [(True, "gradebook", f"{where} (a file: backed up with SQLite's backup API before each run)")]
    lines = []
    try:
        import psycopg  # noqa: F401 (the driver SQLAlchemy uses for postgresql:// URLs)
    except ImportError:
        return [(False, "gradebook driver", "psycopg is missing: pip install -r requirements.txt")]
    pg_dump = shutil.which("pg_dump")
    lines.append((pg_dump is not None, "pg_dump", pg_dump or "not found: runs would not be backed up "
                  "(apt-get install postgresql-client)"))
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import SQLAlchemyError

    engine = create_engine(db_url, connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as conn:
            version = conn.execute(text("SHOW server_version")).scalar()
        lines.append((True, "gradebook", f"{where} (PostgreSQL {version})"))
    except SQLAlchemyError as e:
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        lines.append((False, "gradebook", f"cannot connect to {where}: {reason}"))
    finally:
        engine.dispose()
    return lines


def _is_server(db_url: str) -> bool:
    from sqlalchemy import make_url

    return make_url(db_url).get_backend_name() == "postgresql"


@contextlib.contextmanager
def _advisory_lock(db_url: str, name: str, *, wait: bool):
    """Hold the PostgreSQL advisory lock ``name`` on a connection of its own; if not ``wait``,
    raise ``BlockingIOError`` when another session holds it."""
    from sqlalchemy import create_engine, make_url, text
    from sqlalchemy.exc import OperationalError

    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
    engine = create_engine(db_url)
    try:
        try:
            conn = engine.connect()
        except OperationalError as e:
            where = make_url(db_url).render_as_string(hide_password=True)
            raise RuntimeError(f"cannot connect to the gradebook {where}: {str(e.orig or e).strip()}") from None
        with conn:
            if wait:
                conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
            elif not conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": key}).scalar():
                raise BlockingIOError(name)
            conn.commit()  # the lock is the session's: no transaction stays open while it is held
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
    finally:
        engine.dispose()


def check_gradebook_readable(db_url: str, backups: Path) -> None:
    """Raise ``RuntimeError`` with one line if the SQLite gradebook at ``db_url`` exists but is
    not a sound database (before a run backs it up, collects or grades anything); the message
    points at ``backups``, the folder of copies earlier runs made."""
    if not db_url.startswith("sqlite:///"):
        return
    db = Path(db_url.removeprefix("sqlite:///"))
    if not db.exists():
        return  # nbgrader creates it
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
    except sqlite3.Error as e:
        verdict = str(e)
    if verdict != "ok":
        raise RuntimeError(f"the gradebook {db} is damaged ({verdict}); nothing was changed: restore the newest copy "
                           f"from {backups} or move it away to start a new gradebook")


@contextlib.contextmanager
def _locked(root: Path, assignment: str):
    """Hold the course's lock (and, for a PostgreSQL gradebook, the assignment's), with the
    gradebook checked, before anything in the course folder or the gradebook changes."""
    api = course._api(root)
    with course_lock(root), gradebook_lock(api.coursedir.db_url, assignment):
        check_gradebook_readable(api.coursedir.db_url, root / ".coursekit" / "backups")
        yield api


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
    with _locked(root, assignment) as api:
        collected = inbox_module.collect(root, assignment, Path(inbox), notebooks, times)
        results = _autograde(root, api, assignment, collected.students, **options) if collected.students else []
    return collected, results


def _check_options(jobs: int = 1, **_) -> None:
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")


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
    _check_options(jobs)
    with _locked(root, assignment) as api:
        return _autograde(root, api, assignment, students, jobs=jobs, limits=limits, sandbox=sandbox, fresh=fresh,
                          feedback=feedback, progress=progress)


def _autograde(root: Path, api, assignment: str, students: list[str], *, jobs: int = 1, limits: Limits = Limits(),
               sandbox: str = "auto", fresh: bool = False, feedback: bool = True, progress: bool = False) -> list[Result]:
    """Grade ``students`` while :func:`_locked` holds the locks."""
    db_url = api.coursedir.db_url
    backup_gradebook(root, db_url)
    # registers the assignment; keeps the release for the plan
    with gradebook_setup(db_url, api.coursedir.course_id, students), tempfile.TemporaryDirectory() as tmp:
        staging = course._api(root, **{"CourseDirectory.release_directory": tmp})
        course._check(staging.generate_assignment(assignment, force=True, create=True), f"registering {assignment}")
        plan = load_plan(root, assignment, Path(tmp))
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
        work: queue.Queue = queue.Queue()
        for item in todo:
            work.put(item)
        for _ in range(min(jobs, len(todo))):
            t = threading.Thread(target=_worker_loop, args=(root, plan, work, done, limits, sandbox, verdicts), daemon=True)
            t.start()
            threads.append(t)
    results = _record_all(root, assignment, plan, students, done, feedback, progress, verdicts)
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
        digest = hashlib.sha256(plan.fingerprint.encode() + json.dumps(asdict(limits), sort_keys=True).encode())
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
    try:
        return all(json.loads((folder / f"{nb.name}.json").read_text()).get("key") == key for nb in plan.notebooks)
    except (OSError, ValueError):
        return False


def _worker_loop(root, plan: Plan, work: queue.Queue, done: queue.Queue, limits, sandbox, verdicts: Path) -> None:
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
                    worker = Worker(sandbox, limits, preload=_preload(plan))
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


def _preload(plan: Plan) -> tuple[str, ...]:
    """The coursekit modules the notebooks import, loaded once in each sandbox's template."""
    modules = set()
    for nb in plan.notebooks:
        for cell in nb.release.cells:
            if cell.cell_type == "code":
                for line in cell.source.splitlines():
                    words = line.split()
                    if len(words) >= 2 and words[0] in ("from", "import") and words[1].startswith("coursekit."):
                        name = words[1].rstrip(",")
                        if not name.startswith("coursekit.grading"):
                            modules.add(name)
    return tuple(sorted(modules))


def _grade_student(worker: Worker, root: Path, plan: Plan, student: str, limits: Limits, verdicts: Path) -> None:
    snap = snapshot(root, plan.assignment, student)
    key = snap.key(plan, limits)
    deadline = time.monotonic() + limits.submission_seconds
    expected = {f"{nb.name}.ipynb" for nb in plan.notebooks}
    extra = sorted(name for name in snap.files if name not in expected and name != "timestamp.txt")
    out = verdicts / student
    out.mkdir(parents=True, exist_ok=True)
    for nb in plan.notebooks:
        verdict = grade_notebook(worker, nb, snap.files.get(f"{nb.name}.ipynb"), plan.files, deadline, plan.secret)
        verdict["notes"][:0] = snap.notes
        if extra:
            shown = ", ".join(extra[:10]) + (f" and {len(extra) - 10} more" if len(extra) > 10 else "")
            verdict["notes"].append(f"other files in your submission were not used: {shown}")
        verdict["key"] = key
        verdict["timestamp"] = snap.timestamp()
        tmp = out / f".{nb.name}.json.tmp"
        tmp.write_text(json.dumps(verdict))
        tmp.replace(out / f"{nb.name}.json")  # atomic: an interrupted run never leaves half a verdict


def _record_all(root, assignment, plan: Plan, students, done: queue.Queue, feedback, progress, verdicts: Path) -> list[Result]:
    """The single writer: for each finished student, run nbgrader on the rebuilt notebook."""
    from tqdm import tqdm

    api = course._api(
        root,
        **{
            "CourseDirectory.submitted_directory": str(root / ".coursekit" / "normalized"),
            "Autograde.autograde_preprocessors": _autograde_preprocessors(),
            "ApplyVerdicts.verdict_dir": str(verdicts),
            "GenerateFeedback.preprocessors": _feedback_preprocessors(),
            "NbGraderAPI.log_level": "ERROR",  # "removing existing assignment" on every re-run is expected
        },
    )
    try:  # nbgrader's own database code warns about its session handling; not ours to fix
        from sqlalchemy.exc import SAWarning

        warnings.filterwarnings("ignore", category=SAWarning)
    except ImportError:
        pass
    results: dict[str, Result] = {}
    bar = tqdm(total=len(students), desc=f"grading {assignment}", unit="notebook", disable=not progress)
    while len(results) < len(students):
        student, key, error, cached = done.get()
        results[student] = _record(root, api, plan, student, error, cached, feedback, verdicts)
        bar.update(1)
    bar.close()
    return [results[s] for s in students]


def _autograde_preprocessors() -> list:
    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.preprocessors import AssignLatePenalties, CheckCellMetadata, IgnorePattern, LimitOutput, SaveAutoGrades

    return [ApplyVerdicts, IgnorePattern, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]


def _record(root: Path, api, plan: Plan, student: str, error: str | None, cached: bool, feedback: bool, verdicts: Path) -> Result:
    from nbgrader.api import Gradebook, MissingEntry

    if error is not None:
        # the sandbox failed on this student (not their code's fault): record nothing, say so
        return Result(student, 0.0, sum(sum(nb.points.values()) for nb in plan.notebooks), [], f"not graded: {error}")
    notes, seconds = [], 0.0
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
        nbformat.write(nbformat.from_dict(verdict["normalized"]), staged / f"{nb.name}.ipynb")
    outcome = api.autograde(plan.assignment, student, force=True, create=True)
    error = None
    if not outcome.get("success"):
        error = course._last_line(outcome.get("error") or outcome.get("log") or "unknown error")
        log.warning("nbgrader could not record %s: %s", student, error)
    elif feedback:
        fb = api.generate_feedback(plan.assignment, student, force=True)
        if not fb.get("success"):
            log.warning("feedback for %s failed: %s", student, course._last_line(fb.get("error", "")))
        for page in (root / "feedback" / student / plan.assignment).glob("*.html"):
            inert.harden_html_file(page)  # no script runs and nothing is fetched where the feedback is opened
    with Gradebook(api.coursedir.db_url) as gb:
        max_score = gb.find_assignment(plan.assignment).max_score
        try:
            score = gb.find_submission(plan.assignment, student).score
        except MissingEntry:
            score = 0.0
    return Result(student, float(score), float(max_score), notes, error, cached, seconds)


# --------------------------------------------------------------------------- students: coursekit check


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
    with Worker(kind, limits, preload=_preload(Plan("check", [plan], {}, ""))) as worker:
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
