"""The gradebook's safety: one run per course (and per assignment of a shared PostgreSQL
gradebook) at a time, a backup before every run, and a damaged gradebook refused in one line.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import logging
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

from coursekit import course

log = logging.getLogger(__name__)

__all__ = [
    "KEEP_BACKUPS",
    "course_lock",
    "backup_gradebook",
    "gradebook_lock",
    "gradebook_setup",
    "check_gradebook",
    "check_gradebook_readable",
    "is_server",
    "locked",
]

KEEP_BACKUPS = 20


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
            raise RuntimeError(
                f"another `coursekit autograde` is running on this course ({holder}); wait for it to finish"
            ) from None
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
    if is_server(db_url):
        return _pg_dump(root, url)
    if not db_url.startswith("sqlite:///"):
        log.warning(
            "gradebook %s was not backed up: coursekit backs up SQLite and PostgreSQL gradebooks only",
            url.render_as_string(hide_password=True),
        )
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
        log.warning(
            "pg_dump not found: the PostgreSQL gradebook was NOT backed up before this run "
            "(install the PostgreSQL client tools, e.g. apt-get install postgresql-client)"
        )
        return None
    target = _backup_path(root, ".dump")
    # libpq's own URI (no "+driver"); the password goes in the environment, not on the command line
    dsn = URL.create(
        "postgresql",
        username=url.username,
        host=url.host,
        port=url.port,
        database=url.database,
        query=url.query,
    )
    env = dict(os.environ, **({"PGPASSWORD": url.password} if url.password else {}))
    done = subprocess.run(
        [exe, "--format=custom", f"--file={target}", f"--dbname={dsn.render_as_string()}"],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        target.unlink(missing_ok=True)
        raise RuntimeError(
            f"pg_dump could not back up the gradebook, so nothing was graded: {course.last_line(done.stderr)}"
        )
    _prune_backups(target.parent, ".dump")
    return target


@contextlib.contextmanager
def gradebook_lock(db_url: str, assignment: str):
    """One run per assignment and PostgreSQL gradebook at a time, from whichever course folder.
    A file gradebook needs no more than :func:`course_lock`, which covers its course folder."""
    if not is_server(db_url):
        yield
        return
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(_advisory_lock(db_url, f"coursekit autograde {assignment}", wait=False))
        except BlockingIOError:
            raise RuntimeError(
                f"another `coursekit autograde` is grading {assignment} into this gradebook "
                "(from another course folder); wait for it to finish"
            ) from None
        yield


@contextlib.contextmanager
def gradebook_setup(db_url: str, course_id: str, students: list[str]):
    """Create, one run at a time, the rows that runs from other course folders may create at
    the same moment in a shared PostgreSQL gradebook: tables, courses, students, and (in the
    block) the assignment. nbgrader looks a row up, then inserts it: two runs doing so at
    once fail with a duplicate key. A file gradebook has one writer at a time: nothing to do."""
    if not is_server(db_url):
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
    if not is_server(db_url):
        return [(True, "gradebook", f"{where} (a file: backed up with SQLite's backup API before each run)")]
    lines = []
    try:
        import psycopg  # noqa: F401 (the driver SQLAlchemy uses for postgresql:// URLs)
    except ImportError:
        return [(False, "gradebook driver", "psycopg is missing: pip install -r requirements.txt")]
    pg_dump = shutil.which("pg_dump")
    lines.append(
        (
            pg_dump is not None,
            "pg_dump",
            pg_dump or "not found: runs would not be backed up (apt-get install postgresql-client)",
        )
    )
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


def is_server(db_url: str) -> bool:
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
            raise RuntimeError(
                f"cannot connect to the gradebook {where}: {str(e.orig or e).strip()}"
            ) from None
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


def _quick_check(db: Path, mode: str) -> str:
    """SQLite's ``quick_check`` of ``db`` opened in ``mode`` (``ro``, ``rw``): "ok", or what is wrong."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode={mode}", uri=True)) as conn:
            return conn.execute("PRAGMA quick_check").fetchone()[0]
    except sqlite3.Error as e:
        return str(e)


def check_gradebook_readable(db_url: str, backups: Path) -> None:
    """Raise ``RuntimeError`` with one line if the SQLite gradebook at ``db_url`` exists but is
    not a sound database (before a run backs it up, collects or grades anything); the message
    points at ``backups``, the folder of copies earlier runs made."""
    if not db_url.startswith("sqlite:///"):
        return
    db = Path(db_url.removeprefix("sqlite:///"))
    if not db.exists():
        return  # nbgrader creates it
    verdict = _quick_check(db, "ro")
    if verdict != "ok" and any(db.with_name(db.name + end).exists() for end in ("-journal", "-wal")):
        # a run killed in the middle of a write leaves its journal ("hot"): a read-only connection
        # cannot roll it back and reports a read-only database; a read-write one rolls it back, as
        # SQLite does on any open, and leaves the gradebook as the last finished write left it
        verdict = _quick_check(db, "rw")
    if verdict != "ok":
        raise RuntimeError(
            f"the gradebook {db} is damaged ({verdict}); nothing was changed: restore the newest copy "
            f"from {backups} or move it away to start a new gradebook"
        )


@contextlib.contextmanager
def locked(root: Path, assignment: str):
    """Hold the course's lock (and, for a PostgreSQL gradebook, the assignment's), with the
    gradebook checked, before anything in the course folder or the gradebook changes."""
    api = course.nbgrader_api(root)
    with course_lock(root), gradebook_lock(api.coursedir.db_url, assignment):
        check_gradebook_readable(api.coursedir.db_url, root / ".coursekit" / "backups")
        yield api
