"""The trusted side of the sandbox: start workers, run notebooks, call student code.

A :class:`Worker` is one sandbox (``bubblewrap`` when available) holding a
template process that has imported torch once; each submission is a
:class:`Session` in a fresh process forked from it. A grader talks to the
student's objects through :class:`Remote` proxies: every call sends its inputs as
data, runs in a check process forked from the notebook's final state, and returns
the results as data. Nothing the sandbox sends is trusted: frames are size-capped,
tensors are rebuilt as plain ``torch.Tensor`` objects, and every wait has a deadline.

Over 500 lines: the trusted side of the sandbox (starting bubblewrap, limits, the worker's health,
bounded replies) is one protocol end; splitting it would separate checks from what they guard.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import coursekit
from coursekit.sandbox import protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """Resource limits for one submission (wall-clock caps are enforced here, the rest inside)."""

    cell_seconds: float = 60.0  # CPU seconds per notebook cell (its wall clock: WALL_FACTOR times that)
    check_seconds: float = 20.0  # CPU seconds per grading check (its wall clock: WALL_FACTOR times that)
    submission_seconds: float = 600.0  # wall clock for the whole submission
    memory: int = 3 << 30  # bytes of memory, per process and for all of them together
    cpu_seconds: int = 900  # CPU time per process
    file_size: int = 64 << 20  # largest file a process may write
    disk: int = 256 << 20  # size of the writable scratch folder (bubblewrap only)
    processes: int = 64  # processes alive at once


class SandboxError(Exception):
    """The sandbox itself could not be started or stopped responding."""


class StudentError(Exception):
    """Something went wrong in the student's code; ``str()`` is the hint."""


class RemoteTimeout(StudentError):
    pass


class RemoteCrash(StudentError):
    pass


class MachineBusy(RemoteTimeout):
    """A check that the wall-clock safety net stopped while its process was kept waiting for a core:
    the grading machine was too busy to time it. Not the student's doing: the check is graded again
    (``coursekit.autograde.grade``), and never reported as an endless loop."""


#: A check is timed by the CPU time of its process (and of what it starts): load on the machine does
#: not count. The wall clock stops it at this many times its CPU budget, only as a safety net.
WALL_FACTOR = 5.0
#: how often the CPU time of a check that has not answered yet is read (seconds)
CPU_POLL = 0.25
#: the start of every message of a check stopped by a busy machine (see :class:`MachineBusy`)
BUSY = "could not be timed: the grading machine was too busy"


class _Clock:
    """Times one computation in the sandbox (a check, or a cell) by the CPU time of its process
    ``pid`` and what that process starts, as the sandbox reads them from /proc: other programs on
    the cores do not count. :meth:`wait` says why it must stop, if it must:

    * ``"loop"``: it computed for its whole CPU budget (an endless loop?);
    * ``"idle"``: it slept or blocked for as long (sampled each :data:`CPU_POLL`: neither running
      nor ready to run);
    * ``"busy"``: the wall-clock cap (:data:`WALL_FACTOR` times the budget, a safety net) came
      first: it was ready to run but kept waiting for a core, the busy machine's doing;
    * ``"wall"``: its CPU time cannot be read (the sandbox does not answer): the wall clock decides;
    * ``"deadline"``: ``until`` (the submission's time budget) came first.

    ``base``: the CPU seconds the process had used when the computation began (0 for a check
    process, forked for it: the kernel starts a child's times at 0). ``None`` for a notebook's
    process, which has computed before: then the first reading is the base (a cell that answers
    within :data:`CPU_POLL` costs no reading at all; what it computed before that is not counted).
    ``started`` and ``cap``: when the computation began, and its wall-clock cap (a check's process
    answers several requests, all within one budget and one cap)."""

    def __init__(
        self,
        worker,
        pid: int,
        budget: float,
        until: float | None = None,
        base: float | None = 0.0,
        started: float | None = None,
        cap: float | None = None,
    ):
        self.worker, self.pid, self.budget, self.base = worker, pid, budget, base
        self.started = time.monotonic() if started is None else started
        self.cap = self.started + budget * WALL_FACTOR if cap is None else cap
        self.until = self.cap if until is None else min(until, self.cap)
        self.used: float | None = 0.0  # CPU seconds since the start (None: they cannot be read)
        self.wall = 0.0
        self.idle, self._last = 0.0, time.monotonic()  # idle: while waiting here, not between requests

    def _usage(self) -> tuple[float | None, bool]:
        """(CPU seconds, running or ready to run now) of the process and what it started;
        ``(None, True)`` where the sandbox cannot tell."""
        try:
            reply = self.worker.command({"op": "cpu", "pid": self.pid})[0]
        except SandboxError:
            return None, True
        used = reply.get("seconds")
        return (float(used) if isinstance(used, (int, float)) else None), reply.get("runnable") is not False

    def wait(self, sock) -> str | None:
        """Wait until ``sock`` has something to read (``None``), or the computation must stop (why)."""
        while True:
            left = self.until - time.monotonic()
            if left > 0 and select.select([sock], [], [], min(CPU_POLL, left))[0]:
                return None
            total, runnable = self._usage()
            now = time.monotonic()
            self.idle, self._last = self.idle + (0.0 if runnable else now - self._last), now
            self.wall = now - self.started
            if total is not None and self.base is None:
                self.base = total
            self.used = None if total is None else max(0.0, total - self.base)
            if self.used is not None and self.used >= self.budget:
                return "loop"
            if self.used is None and self.wall >= self.budget:
                return "wall"
            if self.idle >= self.budget:
                return "idle"
            if now >= self.until:
                return "busy" if now >= self.cap else "deadline"


#: once an answer of the template has started to arrive, the rest of its few bytes come within this (s)
ARRIVAL_SECONDS = 5.0

#: What a student is told when the sandbox's own process (the template every notebook process is
#: forked from) stopped answering while their code ran: only their code runs beside it.
TEMPLATE_GONE = (
    "the autograder's own process in the sandbox stopped responding while your code ran: did your code "
    "signal a process it did not start (os.kill(os.getppid(), ...), os.kill(-1, ...), os.killpg)?"
)


class StudentRaised(StudentError):
    """The student's code raised ``type_name(message)`` at ``where``."""

    def __init__(self, type_name: str, message: str, where: str):
        self.type_name, self.message, self.where = type_name, message, where
        at = f" (at {where})" if where else ""
        # Exception's own __init__, never the builtin base's: UnicodeDecodeError's takes 5 arguments.
        Exception.__init__(self, f"your code raised {type_name}: {message}{at}")


@functools.cache
def _raised_class(type_name: str) -> type:
    """A StudentRaised that is also the builtin exception of that name, so that
    ``getattr(obj, name, None)`` and ``except KeyError`` work on remote objects."""
    import builtins

    base = getattr(builtins, type_name, None)
    if isinstance(base, type) and issubclass(base, Exception) and base.__module__ == "builtins":
        return type(
            f"Student{type_name}",
            (StudentRaised, base),
            {"__init__": StudentRaised.__init__, "__str__": StudentError.__str__},
        )
    return StudentRaised


# --------------------------------------------------------------------------- starting sandboxes


def bubblewrap_works() -> bool:
    """True when ``bwrap`` is installed and can create namespaces here."""
    return _probe_bwrap()


@functools.lru_cache(maxsize=1)
def _probe_bwrap() -> bool:
    exe = shutil.which("bwrap")
    if not exe:
        return False
    args = [exe, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"]
    try:
        return subprocess.run(args, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


KINDS = ("auto", "bwrap", "rlimit")

#: why ``auto`` refuses to grade, and the ways out, in one line
NO_BUBBLEWRAP = (
    "bubblewrap (bwrap) is missing or cannot create namespaces here, and coursekit does not run student code "
    "unisolated unless told to: install it (sudo apt-get install bubblewrap), or grade in a Linux VM or "
    "container that has it (macOS: see README, 'Grading without bubblewrap'), or pass --sandbox rlimit to "
    "grade without isolation knowingly"
)

#: the unprivileged user that ``rlimit`` runs student code as when coursekit runs as root
RLIMIT_USER = "nobody"


def choose_kind(kind: str = "auto", *, own_code: bool = False) -> str:
    """``"bwrap"`` or ``"rlimit"``, or :class:`SandboxError` with the fix, before anything runs.

    ``auto`` is bubblewrap, and never a silent fallback: without a working bubblewrap it refuses,
    unless ``own_code`` (``coursekit check``: students running their own notebook on their own
    machine, where isolation protects nobody), which then runs it in a plain child process.
    ``rlimit`` (named, never chosen for the grader) must be confined from writing outside its scratch
    folder (see :func:`rlimit_confinement`); for ``own_code`` it is confined where it can be.
    """
    if kind not in KINDS:
        raise ValueError(f"sandbox must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "bwrap" and not bubblewrap_works():
        raise SandboxError(
            "bubblewrap (bwrap) is missing or cannot create namespaces here: sudo apt-get install bubblewrap"
        )
    if kind == "auto":
        if bubblewrap_works():
            return "bwrap"
        if not own_code:
            raise SandboxError(NO_BUBBLEWRAP)
        kind = "rlimit"
    if kind == "rlimit" and not own_code:
        rlimit_confinement()  # raises when student code could write the course folder
    return kind


@dataclass(frozen=True)
class Confinement:
    """What keeps an ``rlimit`` sandbox from writing outside its scratch folder.

    ``user``: the unprivileged user (name, uid, gid) it runs as, when coursekit runs as root: files
    that only root may write (the course folder, the gradebook, the environment, as usually
    installed) are then out of its reach. ``landlock``: the Landlock ABI that restricts its writes to
    the scratch folder whoever it runs as (0: none). ``no_capabilities``: it stays root (that user
    cannot read the Python installation) but without any capability, so Landlock binds it.
    """

    user: tuple[str, int, int] | None
    landlock: int
    no_capabilities: bool = False

    def describe(self) -> str:
        how = []
        if self.user:
            how.append(f"runs as the user {self.user[0]}")
        if self.no_capabilities:
            how.append("runs as root without capabilities")
        if self.landlock:
            how.append(f"may write only in its scratch folder (Landlock ABI {self.landlock})")
        return " and ".join(how) if how else "is not confined"


def rlimit_confinement(own_code: bool = False) -> Confinement:
    """How an ``rlimit`` sandbox is confined here; :class:`SandboxError` when it cannot be (the
    grader's, ``own_code`` False) or ``Confinement(None, 0)`` (a student's own check)."""
    from coursekit.sandbox import landlock

    version = landlock.abi()
    if own_code:  # never switch users for a student's own check: their files may not be others'
        return Confinement(None, version)
    if os.geteuid() == 0:
        user = _unprivileged_user()
        problem = _unreadable_for(user)
        if not problem:
            return Confinement(user, version)
        if version >= 1:  # root without capabilities, held by Landlock (see Confinement)
            return Confinement(None, version, no_capabilities=True)
        raise SandboxError(
            f"--sandbox rlimit runs student code as the user {user[0]}, which cannot read {problem}, and this "
            "kernel has no Landlock to hold it otherwise: make the Python environment, coursekit and checkpoints/ "
            "readable by others (chmod -R o+rX, and o+x on the folders above them), or install bubblewrap (sudo "
            "apt-get install bubblewrap)"
        )
    if version < 1:
        raise SandboxError(
            "--sandbox rlimit cannot keep student code from writing your files here: it needs root (to run it as "
            f"the user {RLIMIT_USER}) or a Linux kernel with Landlock (5.13 or newer, enabled), and this machine "
            "has neither; install bubblewrap (sudo apt-get install bubblewrap) or grade in a Linux VM or container "
            "that has it"
        )
    return Confinement(None, version)


def _unprivileged_user() -> tuple[str, int, int]:
    import pwd

    try:
        entry = pwd.getpwnam(RLIMIT_USER)
    except KeyError:
        raise SandboxError(
            f"--sandbox rlimit runs student code as the user {RLIMIT_USER}, which this machine does not have"
        ) from None
    return entry.pw_name, entry.pw_uid, entry.pw_gid


def _rlimit_reads() -> list[str]:
    """What an ``rlimit`` sandbox's processes read besides the system: the interpreter and the
    environment, coursekit and the committed checkpoints."""
    paths = {sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parents[1])}
    paths.add(str(Path(coursekit.__file__).resolve().parent))
    checkpoints = _checkpoint_folder()
    if checkpoints:
        paths.add(checkpoints)
    return sorted(paths)


@functools.lru_cache(maxsize=4)
def _unreadable_for(user: tuple[str, int, int]) -> str | None:
    """The first of :func:`_rlimit_reads` (or the import of the sandbox's worker) that ``user``
    cannot read, or ``None``: found by trying, as that user, in a short-lived process."""
    probe = (
        "import os, sys\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        os.listdir(p)\n"
        "    except OSError:\n"
        "        print(p); sys.exit(1)\n"
        "try:\n"
        "    import coursekit.sandbox.worker\n"
        "except Exception as e:\n"
        "    print(f'what importing coursekit needs ({type(e).__name__}: {e})'); sys.exit(1)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(coursekit.__file__).resolve().parents[1])}
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe, *_rlimit_reads()],
            user=user[1],
            group=user[2],
            extra_groups=[],
            env=env,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"the Python interpreter {sys.executable} ({e})"
    return None if done.returncode == 0 else (done.stdout.strip() or done.stderr.strip()[-300:] or "?")


def _bwrap_command(limits: Limits) -> tuple[list[str], str]:
    """The bubblewrap command line and the scratch path inside the sandbox."""
    args = [
        shutil.which("bwrap"),
        "--unshare-all",
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        "1000",
        "--gid",
        "1000",
        "--ro-bind",
        "/usr",
        "/usr",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(64 << 20),
        "--tmpfs",
        "/tmp",
        "--size",
        str(limits.disk),
        "--tmpfs",
        "/scratch",
    ]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for etc in (
        "ld.so.cache",
        "ld.so.conf",
        "ld.so.conf.d",
        "fonts",
        "alternatives",
        "localtime",
        "mime.types",
    ):
        if os.path.exists(f"/etc/{etc}"):
            args += ["--ro-bind", f"/etc/{etc}", f"/etc/{etc}"]
    # the interpreter's installation, and the virtual environment (if any) at a neutral path,
    # so that nothing of the folder holding it (often the course folder) is visible
    interpreter = str(Path(sys.executable).resolve().parents[1])
    for prefix in sorted({sys.base_prefix, interpreter}):
        if not (prefix == "/usr" or prefix.startswith("/usr/")):
            args += ["--ro-bind", prefix, prefix]
    if sys.prefix != sys.base_prefix:
        args += ["--ro-bind", sys.prefix, "/opt/venv"]
    package = str(Path(coursekit.__file__).resolve().parent)
    args += ["--ro-bind", package, "/opt/coursekit/coursekit"]
    # the committed checkpoints (small trained models that experiment tables of the notebooks load),
    # read-only where coursekit.checkpoints looks for them: beside the package
    checkpoints = _checkpoint_folder()
    if checkpoints is not None:
        args += ["--ro-bind", checkpoints, "/opt/coursekit/checkpoints"]
    env = {"PYTHONPATH": "/opt/coursekit", "HOME": "/scratch", "MPLCONFIGDIR": "/tmp/matplotlib"}
    # matplotlib's font list, built once on this side, read-only inside a writable config folder: in
    # a folder it cannot write matplotlib ignores the list and builds it again in every sandbox
    for fontlist in _matplotlib_fontlists():
        args += ["--ro-bind", str(fontlist), f"/tmp/matplotlib/{fontlist.name}"]
    args += ["--clearenv", "--chdir", "/scratch"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args, "/scratch"


def _checkpoint_folder() -> str | None:
    """The host's folder of committed checkpoints (``coursekit.checkpoints.checkpoint_dir``, read
    here without importing torch), or ``None`` if there is none."""
    beside = Path(coursekit.__file__).resolve().parents[1] / "checkpoints"
    folder = Path(os.environ.get("COURSEKIT_CHECKPOINTS") or beside)
    return str(folder.resolve()) if folder.is_dir() else None


def _sandbox_python() -> str:
    """The interpreter path as seen inside the bubblewrap sandbox."""
    if sys.prefix != sys.base_prefix:
        return "/opt/venv/bin/" + Path(sys.executable).name
    return str(Path(sys.executable).resolve())


@functools.lru_cache(maxsize=1)
def _matplotlib_fontlists() -> list[Path]:
    """matplotlib's font lists on this side (``fontlist-v*.json`` in its cache folder), if any.
    Importing its font manager writes the list where it is missing: once per machine, not per sandbox."""
    try:
        import matplotlib
        import matplotlib.font_manager  # noqa: F401

        return sorted(Path(matplotlib.get_cachedir()).glob("fontlist-v*.json"))
    except Exception:
        return []


HOST_DIR_PREFIX = "coursekit-sandbox-"
#: the file in a worker's host folder that names the process owning it: "<pid> <start time>"
OWNER_FILE = "owner"


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat from the third on (the state letter: R, S, D, T, Z...), read at
    once; None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces and brackets


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (field 22 of /proc/<pid>/stat), which
    tells a process from a later one given the same pid; None if there is no such process."""
    fields = _stat_fields(pid)
    return fields[19] if fields else None


def _find_template(root: int, inner_pid) -> tuple[int, str] | None:
    """The pid and start time, as this side sees them, of the sandbox's template: the process among
    ``root`` and its descendants whose innermost pid (the last of ``NSpid`` in /proc/<pid>/status: its
    pid inside the sandbox's PID namespace, if it has one) is ``inner_pid``, the pid it reported."""
    if not isinstance(inner_pid, int):
        return None
    for pid in sorted(_descendants(root, _process_table())):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if nspid and nspid[-1] == str(inner_pid):
            started = _process_start(pid)
            return (pid, started) if started else None
    return None


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, CPU clock ticks of the process and of the children it waited for), for
    every process this side can see."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                data = f.read()
            fields = data[data.rindex(b")") + 2 :].split()
            # fields 4 and 14 to 17 of /proc/PID/stat: ppid; utime, stime, cutime, cstime
            table[int(entry.name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
    return table


def _descendants(root: int, table: dict[int, tuple[int, int]]) -> set[int]:
    """``root`` and every process below it in ``table`` (see :func:`_process_table`)."""
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, (parent, _) in table.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return tree


def sweep_stale_host_dirs(parent: str | None = None) -> list[str]:
    """Remove the host folders of workers whose owning process has ended without closing them (a run
    killed with SIGKILL leaves one behind in the temporary folder). A folder is removed only when its
    owner file names a process that no longer exists, so the folders of a live run (another course
    grading on the same machine, or one just being created, before its owner file is written) and
    of other users stay. Returns the folders removed."""
    parent = parent or tempfile.gettempdir()
    removed = []
    for folder in Path(parent).glob(HOST_DIR_PREFIX + "*"):
        try:
            if folder.is_symlink() or folder.stat().st_uid != os.getuid():
                continue
            pid, start = (folder / OWNER_FILE).read_text().split()
            if _process_start(int(pid)) == start:
                continue
        except (OSError, ValueError):  # gone meanwhile, no owner file yet, or not one of ours
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(str(folder))
    return removed


class Worker:
    """One sandbox with a template process; grades one submission at a time.

    The template only runs coursekit's code, but a student's process can signal it (stop or
    kill it). Every command therefore has a short deadline; a template that misses one is
    marked :attr:`broken` and never used again: :meth:`healthy` says so, and :meth:`restart`
    replaces the whole sandbox. A template that missed its deadline while still running (not
    stopped, not gone) is waited for once more (``BUSY_SECONDS``) before that: on a machine with
    every core taken, ending a fork bomb's processes can take longer than the deadline, and that
    is the machine's doing, not the student's.
    """

    COMMAND_SECONDS = 10.0  # to answer a command (it polls every 20 ms), on top of KILL_SECONDS (see command)
    BUSY_SECONDS = 60.0  # more, for a template that missed its deadline but still runs (see _await_reply)

    def __init__(
        self,
        kind: str = "auto",
        limits: Limits = Limits(),
        preload: tuple[str, ...] = (),
        *,
        own_code: bool = False,
    ):
        """``own_code``: a student running their own notebook (``coursekit check``): see :func:`choose_kind`."""
        self.kind = choose_kind(kind, own_code=own_code)
        #: how an ``rlimit`` sandbox is kept from writing outside its scratch folder (None for bubblewrap)
        self.confinement = rlimit_confinement(own_code) if self.kind == "rlimit" else None
        self.limits = limits
        self.preload = preload
        self._start()

    def _start(self) -> None:
        self.broken: str | None = None
        self._sessions: set[int] = set()  # notebook processes started (their own process groups)
        preload, limits = self.preload, self.limits
        sweep_stale_host_dirs()
        self._host_dir = tempfile.mkdtemp(prefix=HOST_DIR_PREFIX)
        Path(self._host_dir, OWNER_FILE).write_text(f"{os.getpid()} {_process_start(os.getpid())}\n")
        ours, theirs = socket.socketpair()
        python = [sys.executable, "-m", "coursekit.sandbox.worker"]
        if self.kind == "bwrap":
            wrap, scratch = _bwrap_command(limits)
            command = (
                wrap
                + [_sandbox_python()]
                + python[1:]
                + [
                    str(theirs.fileno()),
                    scratch,
                    f"pidns={os.readlink('/proc/self/ns/pid')}",
                    ",".join(preload),
                ]
            )
            env, user = None, {}
        else:
            scratch, command, env, user = self._rlimit_command(python + [str(theirs.fileno())])
            command += [scratch, "plain", ",".join(preload)]
        log = os.path.join(self._host_dir, "worker.log")
        log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._log = open(log_fd, "wb")
        self.proc = subprocess.Popen(
            command,
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            env=env,
            cwd=scratch if self.kind == "rlimit" else "/",
            start_new_session=True,
            **user,
        )
        theirs.close()
        self.ctrl = ours
        try:
            hello, _, _ = protocol.recv(self.ctrl, time.monotonic() + 180)
        except protocol.ProtocolError as e:
            self.close()
            raise SandboxError(f"the sandbox did not start ({e}); its log:\n{self.log_tail()}") from None
        if not hello.get("ready"):
            self.close()
            raise SandboxError(f"the sandbox sent {hello!r} instead of ready")
        self.preload_seconds = float(hello.get("preload_s", 0))
        self.pid_namespace = bool(hello.get("pid_namespace"))  # the template's kill_all may signal -1
        #: the template's pid and start time as this side sees them (None: not found)
        self._template = _find_template(self.proc.pid, hello.get("pid"))
        #: commands answered only in the second wait, by a template that was busy, not stopped
        self.late_replies = 0

    def _rlimit_command(self, python: list[str]) -> tuple[str, list[str], dict, dict]:
        """The scratch folder, the start of the command line, the environment and the user (``Popen``
        arguments) of an ``rlimit`` sandbox, as :attr:`confinement` says: a scratch folder owned by the
        unprivileged user it runs as, and the Landlock launcher in front of the worker."""
        scratch = os.path.join(self._host_dir, "scratch")
        os.makedirs(scratch, mode=0o700)
        package_parent = str(Path(coursekit.__file__).resolve().parents[1])
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": package_parent, "HOME": scratch, "LANG": "C.UTF-8"}
        user: dict = {}
        confinement = self.confinement or Confinement(None, 0)
        if confinement.user:
            _, uid, gid = confinement.user
            os.chmod(self._host_dir, 0o711)  # it may pass through to its scratch folder, and list nothing
            os.chown(scratch, uid, gid)
            user = {"user": uid, "group": gid, "extra_groups": []}
        if confinement.landlock:
            launcher = [sys.executable, "-I", "-S", str(Path(__file__).with_name("landlock.py"))]
            if confinement.no_capabilities:
                launcher.append("--drop-capabilities")
            python = [*launcher, scratch, "--", *python]
        return scratch, python, env, user

    def log_tail(self, n: int = 3000) -> str:
        try:
            return Path(self._host_dir, "worker.log").read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def cpu_seconds(self) -> float:
        """User and system CPU seconds used so far by the processes of this sandbox that are still
        running, and by every process they waited for (read from this side, in ``/proc``).

        Resource usage of children does not see them: bubblewrap's PID namespace keeps the CPU time
        of everything inside from reaching this process, however long it computed. A benchmark adds
        this to its own. ``0.0`` once the sandbox has stopped."""
        stats = _process_table()
        tree = _descendants(self.proc.pid, stats)
        return sum(stats[pid][1] for pid in tree if pid in stats) / os.sysconf("SC_CLK_TCK")

    def healthy(self, timeout: float = 5.0) -> bool:
        """True when the template is running and answers a status request within ``timeout`` s."""
        if self.broken or not self.alive():
            return False
        try:
            self.command({"op": "status"}, timeout=timeout)
        except SandboxError:
            return False
        return True

    def restart(self) -> None:
        """Replace this sandbox by a fresh one (same kind, limits and preloaded modules)."""
        self.close()
        self._start()

    def command(self, header: dict, want_fds: bool = False, timeout: float | None = None):
        if self.broken:
            raise SandboxError(f"the sandbox stopped responding ({self.broken})")
        try:
            protocol.send(self.ctrl, header)
            # the template answers between readings of its watch, which may be ending a
            # submission's processes (up to KILL_SECONDS): a command waits that long more
            self._await_reply(timeout or protocol.KILL_SECONDS + self.COMMAND_SECONDS)
            return protocol.recv(
                self.ctrl,
                time.monotonic() + ARRIVAL_SECONDS,
                max_blob=0,
                max_header=protocol.REPLY_HEADER,
                want_fds=want_fds,
            )
        except (protocol.ProtocolError, OSError) as e:
            self.broken = str(e) or type(e).__name__
            raise SandboxError(f"the sandbox stopped responding ({e})") from None

    def _await_reply(self, seconds: float) -> None:
        """Wait until the template's answer starts to arrive. One that misses ``seconds`` is waited
        for ``BUSY_SECONDS`` more if it still runs: it is busy (ending a submission's processes on a
        loaded machine). A stopped or vanished one is not: a student's code stopped or killed it.
        Nothing of the answer is read before it has started to arrive, so a late answer is read
        whole, as the answer to this command, and the next command gets its own.

        Raises:
            protocol.TimedOut: no answer in time.
        """
        if select.select([self.ctrl], [], [], seconds)[0]:
            return
        if not self._template_runs():
            raise protocol.TimedOut("no answer in time")
        self.late_replies += 1
        log.warning("the sandbox's template is %.0f s late to answer and still runs: waiting longer", seconds)
        if not select.select([self.ctrl], [], [], self.BUSY_SECONDS)[0]:
            raise protocol.TimedOut(f"no answer in {seconds + self.BUSY_SECONDS:.0f} s")

    def _template_runs(self) -> bool:
        """Whether the template process is there and not stopped (running, or sleeping between rounds
        of its work): read in /proc on this side."""
        if self._template is None or not self.alive():
            return False
        pid, started = self._template
        fields = _stat_fields(pid)  # one reading: the state of the process that started then
        return bool(fields) and fields[19] == started and fields[0] not in ("T", "t", "Z", "X")

    def reset_after_student(self) -> str | None:
        """:meth:`reset` for use while a student's code runs: if the template does not answer,
        the student's code is the only thing that can have stopped it, and the reason says so."""
        try:
            return self.reset()
        except SandboxError:
            return TEMPLATE_GONE

    def reset(self) -> str | None:
        """Kill every process of the current submission; return why the sandbox killed them, if it did."""
        reply, _, _ = self.command({"op": "reset"})
        return reply.get("killed_because")

    def kill(self, pid: int) -> None:
        self.command({"op": "kill", "pid": int(pid)})

    def session(
        self,
        files: dict[str, bytes] | None = None,
        seed: int = 0,
        watch: list[tuple[str, str]] = (),
        limits: Limits | None = None,
    ) -> Session:
        """A fresh notebook process. ``watch``: ``(module, name)`` of references whose calls by the
        student's code are recorded in :attr:`Session.reference_calls`. ``limits``: the notebook's
        time, memory and process limits where they are not the sandbox's own (its disk is the
        sandbox's, fixed when it started)."""
        reply, _, fds = self.command(
            {
                "op": "session",
                "limits": asdict(limits or self.limits),
                "seed": seed,
                "files": {k: v.hex() for k, v in (files or {}).items()},
                "watch": [[str(m), str(n)] for m, n in watch],
            },
            want_fds=True,
        )
        if not reply.get("ok") or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise SandboxError(f"the sandbox could not start a notebook process: {str(reply)[:200]}")
        pid = int(reply["pid"])
        self._sessions.add(pid)
        return Session(self, socket.socket(fileno=fds[0]), pid, limits or self.limits)

    def close(self) -> None:
        """Stop the sandbox and every process in it; a broken template is killed at once."""
        if not self.broken:
            try:
                protocol.send(self.ctrl, {"op": "exit"})
            except OSError:
                pass
        try:
            self.proc.wait(timeout=0 if self.broken else 5)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # a stopped process dies of SIGKILL too
            except ProcessLookupError:
                pass
            self.proc.wait()
        if self.kind == "rlimit":
            # without a PID namespace, notebook processes (each its own session) outlive a killed
            # template: end their process groups here
            for pid in self._sessions:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.ctrl.close()
        self._log.close()
        shutil.rmtree(self._host_dir, ignore_errors=True)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------- a submission


class CellFailed(Exception):
    """A cell could not finish: it ran out of time, or its process died."""


class CellBusy(CellFailed):
    """A cell that the wall-clock safety net stopped while its process was kept waiting for a core:
    the grading machine was too busy to run it in time. Not the student's doing: the notebook is run
    again (``coursekit.autograde.run``), and the cell is never reported as an endless loop."""


class Session:
    """One submission's notebook process, and the check processes forked from it."""

    def __init__(self, worker: Worker, sock: socket.socket, pid: int, limits: Limits | None = None):
        self.worker = worker
        self.sock = sock
        self.pid = pid
        self.limits = limits or worker.limits  # this notebook's (see Worker.session)
        self.channel: _Channel | None = None
        self.dead_because: str | None = None
        #: called to get a fresh session in the same state when the sandbox killed this one
        self.revive = None
        self.revivals = 0
        #: a check process was asked for ahead of time (its answer waits in ``sock``)
        self.spare = False
        #: ``module.name`` of the watched references the student's code called (as the sandbox says)
        self.reference_calls: set[str] = set()

    def heard(self, reply: dict) -> None:
        """Note the reference calls an answer reports (hostile data: strings only, bounded)."""
        refs = reply.get("refs")
        if isinstance(refs, list):
            self.reference_calls.update(str(r)[:200] for r in refs[:50] if isinstance(r, str))

    def run_cell(self, source: str, label: str, deadline: float) -> dict:
        """Run one cell; return its outputs. Raises :class:`CellFailed` with a plain reason
        (:class:`CellBusy` where a busy machine kept it from running in time).

        Like a check, a cell is timed by the CPU time of the notebook's process and what it starts
        (``cell_seconds``, see :class:`_Clock`), with a wall-clock cap of :data:`WALL_FACTOR` times
        that only as a safety net; ``deadline`` (the submission's budget) still holds."""
        limit = self.limits.cell_seconds
        self._drop_spare()  # forked before this cell: it would not see what the cell does
        clock = _Clock(self.worker, self.pid, limit, until=deadline, base=None)
        try:
            protocol.send(self.sock, {"op": "cell", "source": source, "label": label})
            why = clock.wait(self.sock)
            if why is None:
                reply, _, _ = protocol.recv(
                    self.sock,
                    max(clock.until, time.monotonic() + CPU_POLL),  # the answer has started to arrive
                    max_blob=0,
                    max_header=protocol.REPLY_HEADER,
                )
        except protocol.TimedOut:
            why = "sending"
        except (protocol.Closed, OSError):
            why = self.worker.reset_after_student()
            self.dead_because = why or "its process ended (os._exit, a crash, or a resource limit)"
            raise CellFailed(self.dead_because) from None
        except protocol.ProtocolError as e:
            self.dead_because = self.worker.reset_after_student() or f"its output could not be read ({e})"
            raise CellFailed(self.dead_because) from None
        if why is not None:
            used, wall = clock.used or 0.0, clock.wall
            budget = {
                "loop": f"did not finish within {limit:g} s of CPU time (an endless loop?)",
                "idle": f"did not finish within {limit:g} s: it waited {wall:.0f} s while computing for "
                f"{used:.1f} s (a sleep, or waiting for something that never comes?)",
                "wall": f"did not finish within {limit:g} s",
                "deadline": "the submission used up its time budget",
                "busy": f"{BUSY} to run it (it computed for {used:.1f} s in {wall:.0f} s)",
                "sending": "did not finish sending its outputs in time",
            }[why]
            killed = self.worker.reset_after_student()  # the sandbox's own reason comes first
            self.dead_because = killed or budget
            raise (CellBusy if why == "busy" and not killed else CellFailed)(self.dead_because)
        if not isinstance(reply, dict):
            raise CellFailed("its process sent a malformed answer")
        if reply.get("sandbox_harmed") is True:  # the cell stopped or killed the template
            self.worker.broken = self.dead_because = TEMPLATE_GONE
            raise CellFailed(TEMPLATE_GONE)
        self.heard(reply)
        return reply

    # ---- checks

    def _drop_spare(self) -> None:
        """Take the answer of a check process asked for ahead of time, and close it (it then exits)."""
        if not self.spare:
            return
        self.spare = False
        try:
            _, _, fds = protocol.recv(
                self.sock, time.monotonic() + 30, max_blob=0, max_header=protocol.REPLY_HEADER, want_fds=True
            )
        except (protocol.ProtocolError, OSError):
            return  # the notebook's process is gone: what comes next finds out
        for fd in fds:
            os.close(fd)

    def _adopt_revived(self) -> bool:
        """Replace a dead notebook process by a fresh one (at most twice per submission)."""
        if self.revive is None or self.revivals >= 2:
            return False
        self.revivals += 1
        try:
            fresh = self.revive()
        except CellBusy:  # the machine's doing, not the student's: the test cell is graded again
            raise MachineBusy(f"this check {BUSY} to run your notebook again") from None
        except (CellFailed, SandboxError):
            return False
        self.sock.close()
        self.sock, self.pid, self.dead_because = fresh.sock, fresh.pid, None
        self.spare = False
        return True

    def begin_check(self, name: str, seed: int | None = None) -> None:
        """Start a check process, forked from the notebook's final state and reseeded with ``seed``
        (default: derived from ``name``).

        Each check asks for the next one's process as soon as it starts, so that the fork (a few
        milliseconds for a process holding torch) overlaps the grading of this check: that process
        waits for its seed, sent here as its first message."""
        self.end_check()
        if self.dead_because and not self._adopt_revived():
            raise RemoteCrash(f"your notebook's process is gone: {self.dead_because}")
        if seed is None:
            seed = zlib.crc32(name.encode())
        try:
            if not self.spare:
                protocol.send(self.sock, {"op": "fork"})
            self.spare = False
            reply, _, fds = protocol.recv(
                self.sock, time.monotonic() + 30, max_blob=0, max_header=protocol.REPLY_HEADER, want_fds=True
            )
        except (protocol.ProtocolError, OSError):
            self.spare = False
            self.dead_because = self.worker.reset_after_student() or "its process ended"
            if self._adopt_revived():
                return self.begin_check(name, seed)
            raise RemoteCrash(f"your notebook's process is gone: {self.dead_because}") from None
        if len(fds) != 1 or not isinstance(reply, dict) or not reply.get("ok"):
            for fd in fds:
                os.close(fd)
            self.dead_because = "its process misbehaved"
            self.worker.reset_after_student()
            raise RemoteCrash("your notebook's process did not start a check")
        sock = socket.socket(fileno=fds[0])
        with contextlib.suppress(OSError):  # a check process already gone shows at the first request
            protocol.send(sock, {"seed": seed})
        self.channel = _Channel(
            self,
            sock,
            int(reply.get("pid", -1)),
            time.monotonic() + self.limits.check_seconds * WALL_FACTOR,
        )
        try:
            protocol.send(self.sock, {"op": "fork"})
            self.spare = True
        except OSError:
            pass  # the notebook's process is gone: the next check finds out, and revives it

    def end_check(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def current(self) -> _Channel:
        if self.channel is None:
            self.begin_check("outside a check")
        return self.channel

    def remote(self, name: str) -> Remote:
        """A proxy for the global ``name`` of the student's notebook."""
        return Remote(self, {"name": name}, name, ())

    def close(self) -> None:
        self.end_check()
        try:
            self.sock.close()
        except OSError:
            pass


class _Channel:
    """The connection to one check process."""

    def __init__(self, session: Session, sock: socket.socket, pid: int, deadline: float):
        self.session, self.sock, self.pid, self.deadline = session, sock, pid, deadline
        self.started = time.monotonic()
        self.broken: str | None = None

    def _await_answer(self) -> None:
        """Wait until the check process answers, timing it by its CPU time (:class:`_Clock`). It is
        stopped once it has computed for its CPU budget (``check_seconds``: "an endless loop?"), or
        has slept or blocked for as long, or, as a safety net, at the wall-clock cap: then it was
        ready to run but kept waiting for a core, the busy machine's doing (:class:`MachineBusy`),
        never the student's."""
        budget = self.session.limits.check_seconds
        clock = _Clock(self.session.worker, self.pid, budget, started=self.started, cap=self.deadline)
        why = clock.wait(self.sock)
        used, wall = clock.used, clock.wall
        if why == "loop":
            self._stop(f"did not finish within {budget:g} s of CPU time (an endless loop?)", RemoteTimeout)
        if why == "wall":  # its CPU time cannot be read: the wall clock decides, and claims no loop
            self._stop(f"did not finish within {budget:g} s", RemoteTimeout)
        if why == "idle":  # neither computing nor waiting for a core: sleeping, or blocked
            self._stop(
                f"waited {wall:.0f} s while computing for {used or 0:.1f} s (a sleep, or waiting for "
                "something that never comes?)",
                RemoteTimeout,
            )
        if why is not None:  # computing, slowly: kept waiting for a core
            self._stop(
                f"{BUSY} (your code ran {used or 0:.1f} s of CPU in {wall:.0f} s; it is graded again)",
                MachineBusy,
            )

    def _stop(self, why: str, kind: type) -> None:
        self._kill()
        self.broken = why
        raise kind(f"your code {why}" if kind is not MachineBusy else f"this check {why}")

    def request(self, header: dict, values: dict) -> dict:
        if self.broken:
            raise RemoteCrash(self.broken)
        arrays: dict = {}
        for key, value in values.items():
            header[key] = protocol.encode(value, arrays, self._ref)
        try:
            protocol.send(self.sock, header, arrays)
            self._await_answer()
            reply, out, _ = protocol.recv(
                self.sock,
                max(self.deadline, time.monotonic() + CPU_POLL),  # the answer has started to arrive
                max_blob=protocol.REPLY_BLOB,
                max_header=protocol.REPLY_HEADER,
            )
        except protocol.TimedOut:
            self._stop("did not finish sending its answer in time", RemoteTimeout)
        except (protocol.Closed, ConnectionError):
            why = self._why_gone()
            self.broken = f"the process running your code ended ({why})"
            raise RemoteCrash(self.broken) from None
        except (protocol.ProtocolError, OSError) as e:
            self._kill()
            self.broken = f"your code's answer could not be read: {e}"
            raise RemoteCrash(self.broken) from None
        if not isinstance(reply, dict):
            raise RemoteCrash("the process running your code sent a malformed answer")
        self.session.heard(reply)
        if "raised" in reply:
            r = reply["raised"] if isinstance(reply["raised"], dict) else {}
            cls = _raised_class(str(r.get("type", "Exception"))[:100])
            raise cls(
                str(r.get("type", "Exception"))[:100],
                str(r.get("message", ""))[:2000],
                str(r.get("where", ""))[:500],
            )
        if "unsendable" in reply:
            raise StudentError(
                f"your code returned something that cannot be graded: {str(reply['unsendable'])[:300]}"
            )
        if "ok" not in reply:
            raise RemoteCrash("the process running your code sent a malformed answer")
        value = protocol.decode(reply["ok"], out, self._handle)
        if not isinstance(value, dict):
            raise RemoteCrash("the process running your code sent a malformed answer")
        return value

    def _kill(self) -> None:
        try:
            self.session.worker.kill(self.pid)
        except SandboxError:
            pass  # the template is gone, and the check process with it; the next check starts a fresh sandbox

    def _why_gone(self) -> str:
        try:
            why = self.session.worker.command({"op": "status", "pid": self.pid})[0].get("killed_because")
        except SandboxError:
            return TEMPLATE_GONE
        return why or "os._exit, a crash, or a resource limit such as memory"

    def _ref(self, obj) -> dict:
        if isinstance(obj, Remote) and obj._channel is self and "$h" in obj._ref:
            return {"$ref": obj._ref["$h"]}
        raise TypeError(f"cannot send {type(obj).__name__} to the sandbox")

    def _handle(self, h: dict) -> Remote:
        if "$h" not in h:
            raise protocol.ProtocolError("unexpected reference")
        mro = tuple(str(m)[:200] for m in h.get("mro", [])[:20]) if isinstance(h.get("mro"), list) else ()
        return Remote(
            self.session, {"$h": int(h["$h"])}, str(h.get("type", "object"))[:100], mro, channel=self
        )

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Remote:
    """A student's object that lives in the sandbox; calls and attributes go over the wire.

    Values that are data (tensors, numbers, strings, containers) come back as
    plain local objects; anything else comes back as another :class:`Remote`.
    """

    __slots__ = ("_session", "_ref", "_type", "_mro", "_channel")

    def __init__(
        self,
        session: Session,
        ref: dict,
        type_name: str,
        mro: tuple[str, ...],
        channel: _Channel | None = None,
    ):
        self._session, self._ref, self._type, self._mro, self._channel = session, ref, type_name, mro, channel

    def _request(self, op: str, **values) -> dict:
        channel = self._session.current()
        if self._channel is not None and self._channel is not channel:
            raise RuntimeError("a sandbox object was used after its check ended")
        target = self._ref if "name" in self._ref else {"$ref": self._ref["$h"]}
        header = {"op": op, "target": target}
        for key in ("return_args",):
            if key in values:
                header[key] = values.pop(key)
        return channel.request(header, values)

    def __call__(self, *args, **kwargs):
        return self._request("call", args=list(args), kwargs=kwargs)["result"]

    def _probe(self, args: tuple, kwargs: dict, backward):
        return self._request("call", args=list(args), kwargs=kwargs, return_args=True, backward=backward)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._request("getattr", name=name)["result"]

    def _set(self, name: str, value) -> None:
        """``setattr`` on the object in the sandbox (``value`` crosses as data)."""
        self._request("setattr", name=str(name), value=value)

    def __iter__(self):
        return iter(self._request("list")["result"])

    def __len__(self) -> int:
        n = self._request("len")["result"]
        if type(n) is not int or n < 0:
            raise StudentError(f"len() of your {self._type} is not a non-negative int")
        return n

    def __getitem__(self, key):
        return self._request("getitem", key=key)["result"]

    def __repr__(self) -> str:
        return f"<{self._type} in the sandbox>"

    def _value(self):
        """The object itself when it is data (a number, a string, a tuple of them); otherwise
        another :class:`Remote`."""
        return self._request("value")["result"]

    @property
    def type_name(self) -> str:
        return self._type

    def is_a(self, qualified: str) -> bool:
        return qualified in self._mro
