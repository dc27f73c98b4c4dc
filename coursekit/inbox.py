"""Collect an untrusted folder of student submissions into nbgrader's ``submitted/`` layout.

An instructor downloads submissions (an LMS zip, say), unpacks them into an *inbox* and runs
``coursekit autograde INBOX --assignment A``. Everything in the inbox is written by students
or by their tools, so this module treats it as hostile:

* no symbolic link is ever followed (a link to ``solutions/`` or to a classmate's notebook
  would otherwise be graded as the student's work); folders are walked through file
  descriptors with ``O_NOFOLLOW``, so a folder swapped for a link mid-run is not followed
  either, and every file read is checked to be the regular file that was listed;
* only regular files are read (opening a FIFO would hang the batch);
* system clutter (``.ipynb_checkpoints``, ``__MACOSX``, ``._foo`` and other hidden entries)
  is ignored at every depth;
* one odd entry refuses that student only, never the batch;
* the submission time comes from the instructor's side (a CSV of times, or the notebook's
  modification time), never from a ``timestamp.txt`` a student put in the folder;
* every name shown to a person goes through :func:`printable` first.

Each student's submission is built in a temporary folder under ``submitted/`` and then
renamed into place, so a failure never leaves half a submission; the notes collecting made
for a student (shown to them by the autograder) are stored in
``.coursekit/collect/<assignment>/<student>.json``.

This module needs a POSIX system (``O_NOFOLLOW``, ``os.scandir`` on a file descriptor).

Over 500 lines: collecting an untrusted inbox is one careful procedure (no links, one entry per
student, sizes, names and times checked before anything is copied), and its refusals are documented
where they happen.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import logging
import os
import secrets
import shutil
import stat
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from coursekit._files import read_json, write_json
from coursekit.course import STUDENT_ID, assignments

log = logging.getLogger(__name__)

#: A notebook larger than this refuses its student (real notebooks are well under 10 MiB).
MAX_NOTEBOOK_BYTES = 100 * 2**20
#: Other files of a student's folder that are kept (copied into ``submitted/``), at most.
MAX_EXTRA_FILES = 200
MAX_EXTRA_BYTES = 64 * 2**20
#: A student's folder with more entries, or nested deeper, is refused rather than half-read.
MAX_ENTRIES = 10_000
MAX_DEPTH = 32

#: Names that tools, not students, put in folders; ignored at every depth (so are hidden names).
SYSTEM_NAMES = frozenset({".ipynb_checkpoints", "__MACOSX", "Thumbs.db", "desktop.ini"})

#: nbgrader reads ``timestamp.txt`` with this format (``parse_utc`` takes the zone name).
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f UTC"
#: Submission times :func:`read_times` accepts (UTC, end excluded): before 1970 is a typo (year
#: 0001 or 0024), and a time must stay a valid date whatever zone it is shown in.
TIMES_RANGE = (dt.datetime(1970, 1, 1, tzinfo=dt.UTC), dt.datetime(9999, 1, 1, tzinfo=dt.UTC))

_ID_RULE = (
    "student ids are 1 to 64 characters: letters A-Z and a-z, digits, '.', '_' and '-', "
    "starting with a letter or a digit"
)
_NOTES_FORMAT, _NOTES_VERSION = "coursekit-collect-notes", 1
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_CHUNK = 1 << 20


# --------------------------------------------------------------------------- printable


def _escaped(ch: str) -> bool:
    code = ord(ch)
    if code < 0x20 or 0x7F <= code <= 0x9F:  # C0, DEL, C1
        return True
    # Cf: bidi and format controls (U+202A-202E, U+2066-2069, U+200B-200F, U+FEFF, ...);
    # Cs: lone surrogates (undecodable bytes in a file name); Zl, Zp: line breaks in disguise.
    return code > 0x7F and unicodedata.category(ch) in ("Cf", "Cs", "Zl", "Zp")


def printable(text: str) -> str:
    """Escape the characters of ``text`` that could steer a terminal or hide text in a log.

    Control characters (every C0 one, tab and newline included; DEL; C1), Unicode format
    and bidi controls (U+200B-U+200F, U+202A-U+202E, U+2066-U+2069, U+FEFF, ...), line and
    paragraph separators, and lone surrogates (undecodable bytes in a file name) become
    ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``. Letters of every script, spaces and
    backslashes are kept, so applying it twice changes nothing more.

    Example: ``"a\\x1b[31mb\\u202ec"`` -> ``"a\\\\x1b[31mb\\\\u202ec"`` (the ESC and the
    right-to-left override are shown as escapes; ``"café"`` stays ``"café"``).

    Args:
        text: untrusted text, e.g. a file name from a student's submission.

    Returns:
        The text with those characters escaped.
    """
    if text.isprintable() and text.isascii():
        return text
    out = []
    for ch in text:
        if not _escaped(ch):
            out.append(ch)
        elif ord(ch) <= 0xFF:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return "".join(out)


# --------------------------------------------------------------------------- submission times


def read_times(path: Path) -> dict[str, dt.datetime]:
    """Read an instructor's CSV of submission times.

    The file has the header ``student,timestamp`` and one row per student, e.g.
    ``alice,2024-03-01T17:59:00+01:00``. Timestamps are ISO 8601; a time without a zone is
    local time. Blank lines are skipped.

    Args:
        path: the CSV file.

    Returns:
        ``{student: time}`` with every time aware and in UTC, e.g.
        ``{"alice": datetime(2024, 3, 1, 16, 59, tzinfo=timezone.utc)}``.

    A bad file is refused whole, and nothing is graded: a row skipped would give its student no
    late penalty (or one from the wrong time) without anyone noticing, while the instructor who
    wrote the file can fix the line named and run again.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: naming the file, the line and the problem, for a file that cannot be read
            or is not UTF-8, a missing or different header, a row without exactly two fields, a
            student id that is not valid, a timestamp that is not ISO 8601 or falls outside
            :data:`TIMES_RANGE` (year 1970 to 9998, in UTC), or a student listed twice (ids
            compared without case, as :func:`collect` does).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except FileNotFoundError:
        raise
    except OSError as e:  # a folder, a file we may not read
        raise ValueError(f"{path}: cannot be read ({e.strerror or e})") from None
    rows = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(rows, None)
        if header is None or [h.strip().lower() for h in header] != ["student", "timestamp"]:
            shown = printable(",".join(header)) if header else "nothing"
            raise ValueError(f"{path}, line 1: expected the header 'student,timestamp', got '{shown}'")
        times: dict[str, dt.datetime] = {}
        lines: dict[str, int] = {}
        for row in rows:
            line = rows.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != 2:
                raise ValueError(
                    f"{path}, line {line}: expected 2 fields (student,timestamp), got {len(row)}"
                )
            student, stamp = row[0].strip(), row[1].strip()
            if not STUDENT_ID.fullmatch(student):
                raise ValueError(
                    f"{path}, line {line}: '{printable(student)}' is not a valid student id ({_ID_RULE})"
                )
            same = next((s for s in times if s.casefold() == student.casefold()), None)
            if same is not None:
                raise ValueError(
                    f"{path}, line {line}: student {student} is listed twice (first on line {lines[same]}"
                    + (f", as {same}: ids are compared without case)" if same != student else ")")
                )
            try:
                when = dt.datetime.fromisoformat(stamp)
            except ValueError:
                raise ValueError(
                    f"{path}, line {line}: '{printable(stamp)}' is not an ISO 8601 time "
                    f"(e.g. 2024-03-01T17:59:00+01:00)"
                ) from None
            try:
                utc = when.astimezone(dt.UTC)  # a naive time is taken as local time
            except (OverflowError, ValueError, OSError):
                utc = None
            if utc is None or not TIMES_RANGE[0] <= utc < TIMES_RANGE[1]:
                raise ValueError(
                    f"{path}, line {line}: '{printable(stamp)}' is out of range: submission times "
                    f"must fall between the years {TIMES_RANGE[0].year} and {TIMES_RANGE[1].year - 1} (in UTC)"
                )
            times[student] = utc
            lines[student] = line
    except csv.Error as e:
        raise ValueError(f"{path}, line {rows.line_num}: {e}") from None
    return times


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Refused:
    """An inbox entry that was not collected, and why (both safe to print)."""

    entry: str
    reason: str


@dataclass(frozen=True)
class Collected:
    """What :func:`collect` did with an inbox.

    Attributes:
        students: sorted ids of the students collected into ``submitted/``.
        refused: entries not collected (the student's earlier copy, if any, is kept).
        ignored: top-level system or hidden entries that were skipped (printable).
        notes: per collected student, the student-facing notes (printable).
    """

    students: list[str]
    refused: list[Refused] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    notes: dict[str, list[str]] = field(default_factory=dict)


class _Refuse(Exception):
    """A per-student problem: the student is refused with this reason."""


@dataclass(frozen=True)
class _File:
    parts: tuple[str, ...]  # path relative to the student's entry (empty for a top-level notebook)
    size: int
    mtime_ns: int
    dev: int
    ino: int

    @property
    def rel(self) -> str:
        return "/".join(self.parts)

    @property
    def name(self) -> str:
        return self.parts[-1]


def _ignored(name: str) -> bool:
    return name.startswith(".") or name in SYSTEM_NAMES


def _is_notebook(name: str) -> bool:
    return name.lower().endswith(".ipynb")


def _listing(names: list[str], limit: int = 10) -> str:
    shown = ", ".join(printable(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _utc(ns: int) -> dt.datetime:
    seconds, rest = divmod(ns, 10**9)
    return dt.datetime.fromtimestamp(seconds, dt.UTC) + dt.timedelta(microseconds=rest // 1000)


# --------------------------------------------------------------------------- reading the inbox


def _walk(
    fd: int, prefix: tuple[str, ...], depth: int, budget: list[int], files: list[_File], notes: list[str]
) -> None:
    """List the regular files under the open folder ``fd`` without following any link."""
    with os.scandir(fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        budget[0] -= 1
        if budget[0] < 0:
            raise _Refuse(
                f"the folder holds more than {MAX_ENTRIES} files and folders: hand in only the notebook"
            )
        if _ignored(entry.name):
            continue
        parts = prefix + (entry.name,)
        rel = printable("/".join(parts))
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            notes.append(f"skipped {rel}: it is a link, and links are not followed; hand in the file itself")
        elif stat.S_ISDIR(st.st_mode):
            if depth >= MAX_DEPTH:
                raise _Refuse(f"folders are nested more than {MAX_DEPTH} deep (at {rel})")
            sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
            try:
                _walk(sub, parts, depth + 1, budget, files, notes)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            files.append(_File(parts, st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino))
        else:
            notes.append(f"skipped {rel}: not a regular file")


def _copy(dir_fd: int, src: _File, dest: Path, limit: int) -> None:
    """Copy ``src`` (relative to the open folder ``dir_fd``) to ``dest``, through no link, after
    checking that it is still the regular file that was listed; keep its modification time.
    Problems reading raise :class:`_Refuse`; problems writing propagate."""
    fds = []
    try:
        try:
            current = dir_fd
            names = src.parts or ()
            for name in names[:-1]:
                current = os.open(name, _DIR_FLAGS, dir_fd=current)
                fds.append(current)
            fd = os.open(names[-1], _FILE_FLAGS, dir_fd=current)
            fds.append(fd)
            st = os.fstat(fd)
        except OSError as e:
            raise _Refuse(f"{printable(src.rel)} could not be read ({e.strerror or e})") from None
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (src.dev, src.ino):
            raise _Refuse(f"{printable(src.rel)} changed while it was being collected: run again")
        dest.parent.mkdir(parents=True, exist_ok=True)
        written = 0
        with open(dest, "xb") as out:
            while True:
                try:
                    chunk = os.read(fd, _CHUNK)
                except OSError as e:
                    raise _Refuse(f"{printable(src.rel)} could not be read ({e.strerror or e})") from None
                if not chunk:
                    break
                written += len(chunk)
                if written > limit:
                    raise _Refuse(f"{printable(src.rel)} grew while it was being collected: run again")
                out.write(chunk)
        os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _choose(candidates: list[_File], notebooks: list[str], notes: list[str]) -> dict[str, _File]:
    """Which of a folder's notebooks is graded as which of ``notebooks`` (see :func:`collect`)."""
    chosen: dict[str, _File] = {}
    for name in notebooks:
        top = [c for c in candidates if c.parts == (name,)]
        nested = [c for c in candidates if c.name == name and len(c.parts) > 1]
        if top:
            chosen[name] = top[0]
        elif len(nested) == 1:
            chosen[name] = nested[0]
            notes.append(
                f"{name} was found at {printable(nested[0].rel)} (not at the top of your folder) and graded"
            )
        elif nested:
            raise _Refuse(
                f"several copies of {name} and none at the top of the folder: "
                f"{_listing([c.rel for c in nested])}: keep one and run again"
            )
    used = {c.parts for c in chosen.values()}
    loose = [c for c in candidates if c.parts not in used]
    missing = [name for name in notebooks if name not in chosen]
    if missing and len(notebooks) == 1 and len(loose) == 1:
        chosen[missing[0]] = loose[0]
        notes.append(f"your notebook {printable(loose[0].rel)} was graded as {missing[0]}")
        loose, missing = [], []
    if missing and loose:
        raise _Refuse(
            f"no {_listing(missing)} in the folder, but other notebooks: {_listing([c.rel for c in loose])}: "
            f"keep one{' per part' if len(notebooks) > 1 else ''}, named as expected, and run again"
        )
    if loose:
        notes.append(f"also in your folder, not graded: {_listing([c.rel for c in loose])}")
    if not candidates:
        notes.append("no notebook (.ipynb) was found in your submission: it is graded as not submitted")
    elif missing:
        notes.append(
            f"{_listing(missing)} {'was' if len(missing) == 1 else 'were'} not found in your submission: "
            "graded as not submitted"
        )
    return chosen


@dataclass
class _Plan:
    """One student's submission, read and decided, before anything is written."""

    chosen: dict[str, _File]
    extras: list[_File]
    notes: list[str]
    mtime_ns: int  # the entry's own modification time (a folder's, or a lone notebook's)


def _plan_folder(fd: int, notebooks: list[str], mtime_ns: int) -> _Plan:
    files: list[_File] = []
    notes: list[str] = []
    try:
        _walk(fd, (), 0, [MAX_ENTRIES], files, notes)
    except OSError as e:
        raise _Refuse(f"the folder could not be read ({e.strerror or e})") from None
    candidates, extras = [], []
    for f in files:
        if f.name.lower() == "timestamp.txt":
            notes.append(
                f"ignored {printable(f.rel)}: the submission time comes from the instructor's records"
            )
        elif _is_notebook(f.name):
            candidates.append(f)
        else:
            extras.append(f)
    chosen = _choose(candidates, notebooks, notes)
    return _Plan(chosen, _keep(extras, notebooks, notes), notes, mtime_ns)


def _keep(extras: list[_File], notebooks: list[str], notes: list[str]) -> list[_File]:
    """The other files that are copied too: plain names, within the caps."""
    kept, odd, over = [], [], []
    total = 0
    for f in extras:
        if printable(f.rel) != f.rel or f.parts[0] in notebooks or f.parts[0].lower() == "timestamp.txt":
            odd.append(f.rel)
        elif len(kept) >= MAX_EXTRA_FILES or total + f.size > MAX_EXTRA_BYTES:
            over.append(f.rel)
        else:
            kept.append(f)
            total += f.size
    if odd:
        notes.append(f"not kept, as their names could be mistaken for something else: {_listing(odd)}")
    if over:
        notes.append(
            f"not kept (other files are kept up to {MAX_EXTRA_FILES} files and "
            f"{MAX_EXTRA_BYTES // 2**20} MiB): {_listing(over)}"
        )
    return kept


# --------------------------------------------------------------------------- writing submitted/


def _write(
    root: Path, assignment: str, student: str, inbox_fd: int, entry: str, plan: _Plan, times: dict | None
) -> tuple[list[str], dt.datetime | None]:
    """Stage the student's submission in ``submitted/`` and swap it into place."""
    notes = list(plan.notes)
    for f in plan.chosen.values():
        if f.size > MAX_NOTEBOOK_BYTES:
            raise _Refuse(
                f"{printable(_inbox_rel(entry, f))} is {f.size / 2**20:.0f} MiB; notebooks over "
                f"{MAX_NOTEBOOK_BYTES // 2**20} MiB are not graded (clear large outputs and save again)"
            )
    if times is not None:
        when = times.get(student)
        if when is None:
            notes.append(
                "no submission time for you is in the instructor's records: no late penalty was computed"
            )
        else:
            when = when.astimezone(dt.UTC)
    else:
        when = _utc(max((f.mtime_ns for f in plan.chosen.values()), default=plan.mtime_ns))

    submitted = root / "submitted"
    submitted.mkdir(parents=True, exist_ok=True)
    staging = submitted / f".coursekit-collect-{secrets.token_hex(8)}"
    staging.mkdir()
    try:
        if plan.chosen and not plan.chosen[next(iter(plan.chosen))].parts:  # a lone <student>.ipynb
            ((name, f),) = plan.chosen.items()
            _copy(inbox_fd, _File((entry,), f.size, f.mtime_ns, f.dev, f.ino), staging / name, f.size)
        else:
            try:
                folder = os.open(entry, _DIR_FLAGS, dir_fd=inbox_fd) if plan.chosen or plan.extras else None
            except OSError as e:
                raise _Refuse(f"the folder could not be opened ({e.strerror or e})") from None
            try:
                for name, f in plan.chosen.items():
                    _copy(folder, f, staging / name, f.size)
                for f in plan.extras:
                    _copy(folder, f, staging.joinpath(*f.parts), f.size)
            finally:
                if folder is not None:
                    os.close(folder)
        if when is not None:
            (staging / "timestamp.txt").write_text(when.strftime(TIMESTAMP_FORMAT) + "\n", encoding="utf-8")
        dest = submitted / student / assignment
        dest.parent.mkdir(parents=True, exist_ok=True)
        old = None
        if dest.exists() or dest.is_symlink():
            old = submitted / f".coursekit-old-{secrets.token_hex(8)}"
            os.rename(dest, old)
        try:
            os.rename(staging, dest)
        except BaseException:
            if old is not None:
                os.rename(old, dest)
            raise
        if old is not None:
            _remove(old)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    source = {name: printable(_inbox_rel(entry, f)) for name, f in plan.chosen.items()}
    write_json(
        _notes_path(root, assignment, student),
        {
            "format": _NOTES_FORMAT,
            "version": _NOTES_VERSION,
            "notes": notes,
            "timestamp": when.isoformat() if when is not None else None,
            "source": source,
        },
    )
    return notes, when


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        shutil.rmtree(path)


def _inbox_rel(entry: str, f: _File) -> str:
    return "/".join((entry, *f.parts)) if f.parts else entry


def _notes_path(root: Path, assignment: str, student: str) -> Path:
    folder = root / ".coursekit" / "collect" / assignment
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{student}.json"


def collect_notes(root: Path, assignment: str, student: str) -> list[str]:
    """The notes :func:`collect` made for a student's submission (to show to the student).

    Args:
        root: the course folder.
        assignment: the assignment id, e.g. ``ch01_attention``.
        student: the student id.

    Returns:
        The notes, each safe to print; an empty list if the student was never collected.

    Raises:
        ValueError: if ``student`` is not a valid student id, or the notes file is damaged.
    """
    if not STUDENT_ID.fullmatch(student) or not STUDENT_ID.fullmatch(assignment):
        raise ValueError(
            f"not a student id and assignment: '{printable(student)}', '{printable(assignment)}'"
        )
    path = root / ".coursekit" / "collect" / assignment / f"{student}.json"
    if not path.is_file():
        return []
    return list(read_json(path, _NOTES_FORMAT, _NOTES_VERSION, "coursekit collect notes file")["notes"])


# --------------------------------------------------------------------------- collect


def _check_notebooks(notebooks: list[str]) -> None:
    if isinstance(notebooks, str) or not notebooks:
        raise ValueError(f"notebooks must be a non-empty list of notebook file names, got {notebooks!r}")
    for name in notebooks:
        if (
            not isinstance(name, str)
            or Path(name).name != name
            or not name.endswith(".ipynb")
            or _ignored(name)
        ):
            raise ValueError(f"notebooks must be plain file names ending in .ipynb, got {name!r}")
    if len(set(notebooks)) != len(notebooks):
        raise ValueError(f"notebooks are listed twice: {notebooks}")


def collect(
    root: Path, assignment: str, inbox: Path, notebooks: list[str], times: dict | None = None
) -> Collected:
    """Copy an untrusted folder of submissions into ``root/submitted/<student>/<assignment>/``.

    Each top-level entry of ``inbox`` is one student: ``<student>.ipynb`` (single-notebook
    assignments only) or a folder ``<student>/``. Ids must match
    :data:`coursekit.course.STUDENT_ID`. No link is followed and only regular files are read;
    ``.ipynb_checkpoints``, ``__MACOSX``, ``Thumbs.db``, ``desktop.ini`` and hidden entries
    (``._foo``, ``.DS_Store``) are ignored at every depth.

    In a folder, each expected notebook is the top-level file of that name; else the one
    nested file of that name; else, for a single-notebook assignment, the folder's only
    notebook (renamed). Several candidates and none of them right refuse the student. A folder
    with no notebook is collected without one (graded as not submitted). Other files are
    kept, up to :data:`MAX_EXTRA_FILES` files and :data:`MAX_EXTRA_BYTES` bytes; a student's
    ``timestamp.txt`` is never copied. nbgrader's ``timestamp.txt`` is written from
    ``times[student]`` if ``times`` is given (no time for a student missing from it), else
    from the modification time of the chosen notebook (the latest of them, or the folder's).

    Ids that differ only by case (``alice`` and ``Alice``, in the inbox, or one in the inbox and
    the other already in ``submitted/``) refuse the inbox's entries for them, naming the others.
    A student's problems refuse that student only (their earlier ``submitted/`` copy is kept);
    a collected student's copy is replaced whole, through a rename. Notes for the student are
    stored for :func:`collect_notes`. Nothing in ``inbox`` is modified.

    Args:
        root: the course folder.
        assignment: the assignment id, a folder of ``root/solutions``.
        inbox: the folder of submissions.
        notebooks: the assignment's notebook file names, e.g. ``["ch01_attention.ipynb"]``.
        times: ``{student: aware datetime}`` of submission times (see :func:`read_times`).

    Returns:
        A :class:`Collected`: students collected, entries refused with reasons, top-level
        entries ignored, and each collected student's notes.

    Raises:
        FileNotFoundError: if ``inbox`` is not a folder.
        ValueError: for an unknown assignment, bad ``notebooks`` or ``times``, an inbox that
            overlaps the course's ``submitted/`` folder, or an inbox with no submission at all
            (nothing collected and nothing refused).
    """
    root, inbox = Path(root), Path(inbox)
    if assignment not in assignments(root):
        raise ValueError(f"no such assignment in {root / 'solutions'}: '{printable(assignment)}'")
    _check_notebooks(notebooks)
    if not inbox.is_dir():
        raise FileNotFoundError(f"submissions folder {inbox} does not exist or is not a folder")
    submitted, resolved = (root / "submitted").resolve(), inbox.resolve()
    if submitted == resolved or resolved in submitted.parents or submitted in resolved.parents:
        raise ValueError(
            f"the inbox {inbox} overlaps the course's submitted/ folder: give the folder of downloaded submissions"
        )
    if times is not None:
        wrong = sorted(str(k) for k, v in times.items() if not isinstance(v, dt.datetime))
        if wrong:
            raise ValueError(
                f"times must map student ids to datetimes (see read_times); not for: {_listing(wrong)}"
            )

    inbox_fd = os.open(inbox, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        return _collect(root, assignment, inbox, inbox_fd, notebooks, times)
    finally:
        os.close(inbox_fd)


def _collect(
    root: Path, assignment: str, inbox: Path, inbox_fd: int, notebooks: list[str], times: dict | None
) -> Collected:
    refused: list[Refused] = []
    ignored: list[str] = []
    groups: dict[str, list[tuple[str, os.stat_result]]] = {}
    with os.scandir(inbox_fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        name = entry.name
        if _ignored(name):
            ignored.append(printable(name))
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as e:
            refused.append(Refused(printable(name), f"could not be read ({e.strerror or e})"))
            continue
        if stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode) or _is_notebook(name):
            student = name[: -len(".ipynb")] if _is_notebook(name) and not stat.S_ISDIR(st.st_mode) else name
            groups.setdefault(student, []).append((name, st))
        elif stat.S_ISREG(st.st_mode):
            refused.append(
                Refused(
                    printable(name),
                    "not a notebook or a folder: unzip archives first, and give "
                    "each student a <student>.ipynb or a <student>/ folder",
                )
            )
        else:
            refused.append(
                Refused(
                    printable(name), "not a regular file or a folder (a FIFO, socket or device): not read"
                )
            )

    by_case = _same_but_case(root, groups)
    students: list[str] = []
    notes: dict[str, list[str]] = {}
    for student, group in sorted(groups.items()):
        if student in by_case:
            for name, _ in group:
                refused.append(Refused(printable(name), by_case[student]))
            continue
        if len(group) > 1:
            refused.append(
                Refused(
                    printable(student),
                    f"several entries for this student: {_listing([n for n, _ in group])}: "
                    "keep one and run again",
                )
            )
            continue
        ((name, st),) = group
        try:
            plan = _plan(inbox_fd, name, student, st, notebooks, assignment)
            notes[student], _ = _write(root, assignment, student, inbox_fd, name, plan, times)
        except _Refuse as e:
            refused.append(Refused(printable(name), str(e)))
            continue
        students.append(student)
        log.debug("collected %s from %s", student, printable(name))

    if not students and not refused:
        raise ValueError(
            f"no submissions in {inbox}: expected <student>.ipynb or <student>/<notebook>.ipynb"
            + (f" (ignored: {_listing(ignored)})" if ignored else "")
        )
    return Collected(sorted(students), sorted(refused, key=lambda r: r.entry), ignored, notes)


def _same_but_case(root: Path, groups: dict) -> dict[str, str]:
    """The students of the inbox whose ids differ only by case from another's, in the inbox or
    already in ``submitted/``, each with the reason it is refused.

    ``alice`` and ``Alice`` are one student to an LMS that matches logins without case, and one
    folder on a disk that ignores case (macOS, Windows): grading both would leave one grade
    overwriting the other in the export, or one submission overwriting the other. Refusing them
    loses nothing (the inbox is not changed, earlier copies are kept) and says which to rename.
    """
    valid = [s for s in groups if STUDENT_ID.fullmatch(s)]
    try:
        with os.scandir(root / "submitted") as it:
            earlier = [e.name for e in it if not _ignored(e.name) and STUDENT_ID.fullmatch(e.name)]
    except OSError:
        earlier = []
    spellings: dict[str, set[str]] = {}
    for s in valid:
        spellings.setdefault(s.casefold(), set()).add(s)
    reasons = {}
    for s in valid:
        others = sorted(spellings[s.casefold()] - {s})
        if others:
            reasons[s] = (
                f"{s} and {_listing(others)} differ only by case, which an LMS or a disk may not tell "
                "apart: rename the entries to one spelling (or to different ids) and run again"
            )
            continue
        before = sorted(e for e in earlier if e.casefold() == s.casefold() and e != s)
        if before:
            reasons[s] = (
                f"{s} differs only by case from {_listing(before)}, already in submitted/, which an "
                f"LMS or a disk may not tell apart: rename the entry to {before[0]} (or to another id) "
                "and run again"
            )
    return reasons


def _plan(
    inbox_fd: int, name: str, student: str, st: os.stat_result, notebooks: list[str], assignment: str
) -> _Plan:
    """Decide what to collect for one top-level entry, reading nothing but listings."""
    if stat.S_ISLNK(st.st_mode):
        raise _Refuse("a symbolic link, and links are not followed: put the real file or folder in the inbox")
    if not STUDENT_ID.fullmatch(student):
        raise _Refuse(f"'{printable(student)}' is not a valid student id ({_ID_RULE}): rename the entry")
    if stat.S_ISDIR(st.st_mode):
        if _is_notebook(name):
            raise _Refuse("a folder named like a notebook: give each student a <student>/ folder")
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=inbox_fd)
        except OSError as e:
            raise _Refuse(f"the folder could not be opened ({e.strerror or e})") from None
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise _Refuse("the folder changed while it was being collected: run again")
            return _plan_folder(fd, notebooks, st.st_mtime_ns)
        finally:
            os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        raise _Refuse("not a regular file or a folder (a FIFO, socket or device): not read")
    if len(notebooks) != 1:
        raise _Refuse(
            f"{assignment} has {len(notebooks)} notebooks ({_listing(notebooks)}): "
            f"hand in a folder {student}/ holding them"
        )
    return _Plan(
        {notebooks[0]: _File((), st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino)}, [], [], st.st_mtime_ns
    )
