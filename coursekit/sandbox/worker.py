"""The untrusted side: runs inside the sandbox and executes a student's code.

Three kinds of process, started as ``python -m coursekit.sandbox.worker FD ...``:

* the **template** (one per grading worker) imports torch, numpy, matplotlib and
  IPython once, then waits for commands on the control socket ``FD``. It never
  runs student code. For each submission it forks
* a **notebook process**, which applies the resource limits, runs the notebook's
  cells one at a time in a fresh IPython shell and reports their outputs. For each
  check the trusted side asks it to fork
* a **check process**: a copy of the notebook's final state, reseeded, that calls
  the student's functions on inputs the trusted side sends and sends back the
  results as data. It ends when the trusted side hangs up.

The template also watches the processes it started (count and memory) and kills
them all on request or when a limit is crossed. Nothing here decides a score:
the trusted side (:mod:`coursekit.sandbox.host`) reads every answer as hostile
data.

Over 500 lines: the untrusted side of the sandbox (the notebook's process, its proxies and what it
may send back) is the other protocol end, kept whole for the same reason as host.py.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import random
import re
import resource
import select
import shutil
import signal
import socket
import sys
import time
import traceback

from coursekit.sandbox import protocol

#: what a notebook process sees as its environment: nothing about grading
CLEAN_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    "PYTHONHASHSEED": "0",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TERM": "dumb",
}

#: the modules loaded before any student code ran (see :data:`RUNTIME_IMPORTS`)
TRUSTED_MODULES: dict = {}
#: the modules this file's and the wire format's functions import when they run, which a notebook's
#: process or a check process may do after student code: restored in ``sys.modules`` before every
#: check, should a cell have swapped one (tests/test_sandbox.py: the list is complete)
RUNTIME_IMPORTS = ("dis", "hashlib", "importlib", "io", "numpy", "torch", "types")

#: ``module.name`` of each watched reference (the course's own solution of a graded part) that the
#: student's code called; sent back with every answer (see :func:`_watch`)
REFERENCE_CALLS: set[str] = set()
_COURSEKIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _watch(watch) -> None:
    """Record calls of the references ``watch`` names (``[module, name]`` pairs) made by the student's
    code; calls from inside coursekit (a given model calling its own attention) do not count. A
    student who digs the original out of the wrapper is not seen: this is a signal for the
    instructor, next to the static one (:mod:`coursekit.integrity`), not a wall."""
    import importlib

    def record(label: str) -> None:
        caller = sys._getframe(2).f_code.co_filename
        if not caller.startswith(_COURSEKIT):
            REFERENCE_CALLS.add(label)

    def wrap_function(fn, label):
        def watched(*args, **kwargs):
            record(label)
            return fn(*args, **kwargs)

        watched.__name__, watched.__qualname__, watched.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        watched.__module__, watched.__wrapped__ = fn.__module__, fn
        return watched

    def wrap_init(init, label):
        def __init__(self, *args, **kwargs):
            record(label)
            return init(self, *args, **kwargs)

        return __init__

    REFERENCE_CODE.clear()
    for module_name, name in watch if isinstance(watch, list) else []:
        try:
            module = importlib.import_module(str(module_name))
            obj = getattr(module, str(name))
        except Exception:  # noqa: BLE001, S112 (nothing to watch)
            continue
        label = f"{module_name}.{name}"
        key = _code_key(obj)
        if key is not None:
            REFERENCE_CODE[key] = label
        if isinstance(obj, type):
            obj.__init__ = wrap_init(obj.__init__, label)
        elif callable(obj):
            setattr(module, str(name), wrap_function(obj, label))


#: code key (:func:`_code_key`) of each watched reference -> its ``module.name``
REFERENCE_CODE: dict[str, str] = {}
#: the prefix of a label in :data:`REFERENCE_CALLS` for a student's object that *is* a watched
#: reference's compiled code, however it arrived (``exec`` of its source, of a decoded string, ...)
CODE_COPY = "code:"


def _code_key(obj) -> str | None:
    """A fingerprint of the compiled code of a function, or of the functions a class defines: its
    instructions with the names, numbers and nested code they use; not its file, lines, strings
    (docstrings, messages) or local names, which a copy may change without changing what the code
    does, nor the call sequence CPython picks for a module it saw imported in the same compilation
    (``torch.exp(...)`` compiles to ``LOAD_ATTR`` in coursekit's files, to ``LOAD_METHOD`` in an
    ``exec``). ``None`` for anything else."""
    import dis
    import hashlib
    import types

    skip = {"RESUME", "PRECALL", "CACHE", "NOP", "PUSH_NULL", "EXTENDED_ARG"}
    jumps = set(dis.hasjrel) | set(dis.hasjabs)
    local = set(dis.haslocal) | set(dis.hasfree)

    def key(code) -> tuple:
        seq = []
        for ins in dis.get_instructions(code):
            op = "LOAD_ATTR" if ins.opname == "LOAD_METHOD" else ins.opname
            if op in skip:
                continue
            if ins.opcode in jumps or (op == "LOAD_CONST" and isinstance(ins.argval, str)):
                arg = None
            elif isinstance(ins.argval, types.CodeType):
                arg = key(ins.argval)
            elif ins.opcode in local:
                arg = ins.arg  # a local by its slot, not its name
            else:
                arg = repr(ins.argval)
            seq.append((op, arg))
        return tuple(seq)

    fn = getattr(obj, "__wrapped__", obj)
    if isinstance(fn, types.FunctionType):
        parts = [repr(key(fn.__code__))]
    elif isinstance(fn, type):
        parts = sorted(repr(key(v.__code__)) for v in vars(fn).values() if isinstance(v, types.FunctionType))
        if not parts:
            return None
    else:
        return None
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _copies_of_references(namespace: dict) -> set[str]:
    """Labels (``code:module.name``) of the watched references whose compiled code an object of the
    student's ``namespace`` has, defined outside coursekit (the wrapped originals are calls, seen by
    :func:`_watch`)."""
    found = set()
    if not REFERENCE_CODE:
        return found
    for value in list(namespace.values()):
        code = getattr(value, "__code__", None)
        if code is None and isinstance(value, type):
            methods = [v for v in vars(value).values() if hasattr(v, "__code__")]
            code = methods[0].__code__ if methods else None
        if code is None or str(code.co_filename).startswith(_COURSEKIT):
            continue
        try:
            label = REFERENCE_CODE.get(_code_key(value) or "")
        except Exception:  # noqa: BLE001, S112 (an object that resists inspection is no copy)
            continue
        if label:
            found.add(CODE_COPY + label)
    return found


def _with_calls(header: dict) -> dict:
    if REFERENCE_CALLS:
        header["refs"] = sorted(REFERENCE_CALLS)
    return header


MAX_TEXT = 64 * 1024  # characters of stdout/stderr kept per cell
MAX_DISPLAY = 2 << 20  # bytes of rich display data kept per cell


# --------------------------------------------------------------------------- template process


class Template:
    def __init__(self, ctrl: socket.socket, scratch: str, pid_namespace: bool, preload: list[str]):
        self.ctrl = ctrl
        self.scratch = scratch
        self.pid_namespace = pid_namespace
        self.limits: dict = {}
        self.session_sid: int | None = None
        self.killed_because: str | None = None
        #: check processes the memory watch killed (and the notebook kept): pid -> reason
        self.checks_killed: dict[int, str] = {}
        self.last_memory_check = 0.0
        self.last_pids: set[int] = set()  # the submission's processes at the last memory reading
        self.deferrals = 0  # readings in a row over by RSS while processes started
        started = time.monotonic()
        self.shell = _preload(preload)
        self.preload_seconds = time.monotonic() - started
        # what every process forked from here starts with; the memory limit comes on top of it
        self.baseline = _memory([os.getpid()], 0)[os.getpid()]
        _set_not_dumpable()

    def serve(self) -> None:
        protocol.send(
            self.ctrl,
            {
                "ready": True,
                "pid": os.getpid(),
                "preload_s": round(self.preload_seconds, 3),
                "pid_namespace": self.pid_namespace,
            },
        )
        while True:
            ready, _, _ = select.select([self.ctrl], [], [], 0.02)
            self.watch()
            if not ready:
                continue
            try:
                msg, _, _ = protocol.recv(self.ctrl, time.monotonic() + 30)
            except protocol.ProtocolError:
                self.kill_all()
                return
            op = msg.get("op")
            if op == "session":
                self.start_session(msg)
            elif op == "kill":
                self.kill_tree(int(msg["pid"]))
                protocol.send(self.ctrl, {"ok": True})
            elif op == "cpu":  # the CPU seconds a check process and what it started have used
                used, runnable = self.cpu_seconds(int(msg["pid"]))
                protocol.send(self.ctrl, {"ok": True, "seconds": used, "runnable": runnable})
            elif op == "status":  # with a pid: why that check process was killed, if the sandbox did
                why = self.checks_killed.pop(msg.get("pid"), None) or self.killed_because
                protocol.send(self.ctrl, {"ok": True, "killed_because": why})
            elif op == "reset":
                self.kill_all()
                why, self.killed_because = self.killed_because, None
                protocol.send(self.ctrl, {"ok": True, "killed_because": why})
            elif op == "exit":
                self.kill_all()
                return

    def start_session(self, msg: dict) -> None:
        self.kill_all()
        self.killed_because = None
        self.checks_killed.clear()
        self.limits = msg["limits"]
        workdir = os.path.join(self.scratch, "work")
        _wipe(workdir)
        os.makedirs(workdir)
        for name, data in msg.get("files", {}).items():  # data files shipped with the assignment
            with open(os.path.join(workdir, os.path.basename(name)), "wb") as f:
                f.write(bytes.fromhex(data))
        ours, theirs = socket.socketpair()
        # the modules preloaded here: no collection of the notebook's visits them. Collect first: this
        # process serves a whole class, and garbage frozen with them would never be freed
        gc.collect()
        gc.freeze()
        pid = os.fork()
        if pid == 0:  # the notebook process
            try:
                ours.close()
                self.ctrl.close()
                # The template stays unreadable to student code; the processes it forks for
                # that code are made readable again, so that the watch (the template) can read
                # their share of memory in /proc/PID/smaps_rollup, not just their RSS, which
                # would count the torch they share with the template once per process.
                _set_dumpable(True)
                NotebookProcess(
                    theirs, self.shell, workdir, self.limits, msg.get("seed", 0), msg.get("watch")
                ).serve()
            finally:
                os._exit(0)
        theirs.close()
        self.session_sid = pid  # the notebook process calls setsid(): its pid is its session id
        protocol.send(self.ctrl, {"ok": True, "pid": pid}, fds=[ours.fileno()])
        ours.close()

    # ---- watching and killing

    def members(self) -> list[int]:
        """Processes started for the current submission (never this one) that still run.

        A zombie (killed or exited, not yet reaped: in the sandbox's PID namespace its init reaps
        orphans, late on a loaded machine) runs nothing and holds no memory. It is not counted: a
        fork bomb's killed processes, lingering as zombies, must not count against the notebook
        started after it."""
        me = os.getpid()
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            if pid == me or pid == 1:
                continue
            if not self.pid_namespace and (self.session_sid is None or _stat(pid, 5) != self.session_sid):
                continue
            if _state(pid) not in (None, "Z", "X"):
                pids.append(pid)
        return pids

    def watch(self) -> None:
        if not self.limits:
            return
        pids = self.members()
        if len(pids) > self.limits["processes"]:
            self.killed_because = f"it started more than {self.limits['processes']} processes"
            self.kill_all()
            return
        now = time.monotonic()
        if now - self.last_memory_check < 0.1:
            return
        self.last_memory_check = now
        allowed = self.limits["memory"] + self.baseline
        # PSS only for a set of processes that did not change since the last reading: a process
        # busy forking holds the lock that reading its PSS waits on (see _memory)
        stable, self.last_pids = set(pids) == self.last_pids, set(pids)
        memory = _memory(pids, allowed if stable else None)
        used = sum(memory.values())
        if used <= allowed:
            self.deferrals = 0
            return
        if not stable and len(pids) <= PSS_PROCESSES and self.deferrals < DEFERRALS:
            # over by RSS just as a process started (a check, then the spare the next check will
            # use: on a busy machine they start readings apart): read their shares once the set is
            # stable, for a few readings at most (each process's address space has its own limit)
            self.deferrals += 1
            return
        self.deferrals = 0
        limit = f"{self.limits['memory'] / 2**30:.1f} GiB of memory"
        if not stable and len(pids) > PSS_PROCESSES:
            # more processes than the watch reads shares of, still multiplying (a fork bomb in its
            # first trees): ending the trees one at a time, each waited for on cores the others keep
            # busy, let them multiply for up to 40 s (both cores: 78 CPU-seconds); all at once, 0.2 s
            self.killed_because = (
                f"it started more than {PSS_PROCESSES} processes at once ({len(pids)}), still multiplying, "
                f"too fast to measure their memory against the limit of {limit}"
            )
            self.kill_all()
            return
        # Over the limit: end the largest trees of processes below the notebook's first (each
        # check with whatever it started; anything the cells started), before the notebook itself.
        # A check that took too much memory then fails on its own, and the later checks still run.
        trees: dict[int, int] = {}
        alive = set(pids)
        for pid in pids:
            root = self.tree_root(pid, alive)
            if root is not None:
                trees[root] = trees.get(root, 0) + memory[pid]
        if len(trees) > PSS_PROCESSES:
            # many trees at once (a fork bomb, a pool of workers) are not one check's doing, and
            # killing them one by one, each waited for, would keep the watch busy while they fork
            self.killed_because = f"its processes used more than {limit}"
            self.kill_all()
            return
        for root in sorted(trees, key=trees.get, reverse=True):
            if used <= allowed:
                return
            doomed = self.kill_tree(root)
            used -= sum(memory.get(p, 0) for p in doomed)
            for p in doomed:
                self.checks_killed[p] = f"its processes used more than {limit}"
        if sum(_memory(self.members(), allowed).values()) > allowed:
            self.killed_because = f"its processes used more than {limit}"
            self.kill_all()

    def tree_root(self, pid: int, members: set[int]) -> int | None:
        """The ancestor of ``pid`` just below the notebook's process (``pid`` itself for a check), or
        ``None`` for the notebook's process; an orphan is the root of its own tree."""
        seen = set()
        while pid != self.session_sid and pid not in seen:
            seen.add(pid)
            parent = _stat(pid, 3)
            if parent == self.session_sid or parent not in members:
                return pid
            pid = parent
        return None

    def kill_all(self, seconds: float = protocol.KILL_SECONDS) -> None:
        """Kill every process of the submission, and return once none runs (or after ``seconds``).
        A fork bomb's processes, killed on a loaded machine, can take longer to go than a fixed
        number of rounds: the notebook started next must not find them and be blamed for them."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pids = self.members()
            if not pids:
                break
            if self.pid_namespace:
                try:
                    os.kill(-1, signal.SIGKILL)  # every process in the namespace but this one and init
                except ProcessLookupError:
                    pass
            else:
                for pid in pids:
                    _kill(pid)
            _reap()
            time.sleep(0.005)
        _reap()

    def tree(self, root: int) -> set[int]:
        """``root`` and its descendants among the submission's processes (empty if ``root`` is not
        one of them, or is this process or init)."""
        if root in (os.getpid(), 1) or root not in self.members():
            return set()
        tree, changed = {root}, True
        while changed:
            changed = False
            for pid in self.members():
                if pid not in tree and _stat(pid, 3) in tree:
                    tree.add(pid)
                    changed = True
        return tree

    def cpu_seconds(self, root: int) -> tuple[float | None, bool]:
        """User and system CPU seconds of ``root`` and its descendants among the submission's
        processes, children it already waited for included (``None`` if ``root`` is not one of
        them), and whether one of them is running or ready to run now (not sleeping or blocked).
        What a check is timed by: unlike the wall clock, other programs on the cores do not count."""
        tree = self.tree(root)
        if not tree:
            return None, False
        # fields 14 to 17 of /proc/PID/stat: utime, stime, cutime, cstime (clock ticks)
        ticks = sum(_stat(pid, field) or 0 for pid in tree for field in (13, 14, 15, 16))
        return ticks / os.sysconf("SC_CLK_TCK"), any(_state(pid) == "R" for pid in tree)

    def kill_tree(self, root: int) -> set[int]:
        """Kill ``root`` and its descendants among the submission's processes; return their pids."""
        doomed = self.tree(root)
        for pid in doomed:
            _kill(pid)
        _reap()
        # SIGKILL only starts a process's end: until the kernel has torn it down, its memory still
        # counts. Answer once it has, so that the next check is not forked beside a dying one
        # (under load, a few killed 256 MiB checks added up past the submission's memory limit).
        _wait_until_dead(doomed, time.monotonic() + 5)
        return doomed


def _preload(modules: list[str]):
    """Import the heavy modules once, in the template, and build the IPython shell."""
    os.environ.update(CLEAN_ENV)
    import importlib

    import numpy  # noqa: F401
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401

    for name in modules:
        importlib.import_module(name)
    for name in RUNTIME_IMPORTS:
        importlib.import_module(name)
    _warm_up(torch)
    shell = _make_shell()
    TRUSTED_MODULES.update(sys.modules)
    gc.collect()
    _collapse_to_huge_pages()
    return shell


#: ``madvise`` advice: back a range with 2 MiB pages now (Linux 6.1 or later)
MADV_COLLAPSE = 25


def _collapse_to_huge_pages() -> None:
    """Back the template's private memory (about 170 MiB of torch, graders and warmed-up kernels) with
    2 MiB pages where the kernel can, so that forking it is cheap.

    Every notebook's process is forked from the template and every check's process from a notebook's
    process. A fork copies one page-table entry per page the two processes will share, and the exit
    drops as many: for 4 KiB pages that was about 10 ms of system time per fork here, most of a
    grading's time in the kernel. With 2 MiB pages it is one entry per 512 pages; a write after the
    fork still copies only the 4 KiB it hits. Where the kernel cannot (an older kernel, no free huge
    page), nothing changes but the time."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        with open("/proc/self/maps") as f:
            maps = f.read().splitlines()
    except OSError:
        return
    huge = 2 << 20
    for line in maps:
        fields = line.split()
        anonymous = len(fields) < 6 or fields[5] == "[heap]"
        if not (anonymous and fields[1].startswith("rw") and fields[1].endswith("p")):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        start, end = -(-start // huge) * huge, end // huge * huge
        if end > start:
            libc.madvise(start, end - start, MADV_COLLAPSE)  # failure only leaves the small pages


def _touch_pages() -> None:
    """Copy now, in a check process that waits for its check, the pages that answering a request
    writes to (torch's and numpy's state, the wire format's code): after a fork each first write
    to a page copies it, which made the first answer of a check take several milliseconds.
    Whatever the student's cells changed, this never fails: it only warms up."""
    import io

    import torch

    try:
        x = torch.ones(2, 3)
        arrays: dict = {}
        header = protocol.encode({"result": (x @ x.T).softmax(-1)}, arrays, None)
        buf = io.BytesIO()
        protocol._savez(buf, **arrays)
        protocol.decode(header, protocol.read_arrays(buf.getvalue()))
    except Exception:  # noqa: BLE001 (e.g. a cell swapped the wire's writer: the check itself will say so)
        pass


def _warm_up(torch) -> None:
    """Run the common kernels once here, so that every forked process finds them initialised
    (the first matmul of a process costs a large fraction of a second)."""
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(2, 3, 4, 8, dtype=dtype, requires_grad=True)
        layer = torch.nn.Linear(8, 8).to(dtype)
        y = torch.softmax(x @ x.transpose(-2, -1) / 2.0, dim=-1) @ layer(x)
        y = y + torch.nn.functional.scaled_dot_product_attention(x, x, x)
        torch.nn.functional.layer_norm(torch.nn.functional.gelu(y), (8,)).sum().backward()
        torch.nn.functional.cross_entropy(y.reshape(-1, 8), torch.zeros(24, dtype=torch.long)).item()
    torch.broadcast_shapes((2, 1), (1, 3))  # imports sympy lazily: about 0.4 s
    # the first tensor on the meta device imports torch's meta kernels (about 800 modules, 0.8 s);
    # graders create tensors there to check a `device=` argument, in a fresh fork each time
    (torch.ones(2, 3, device="meta").tril() @ torch.ones(3, 2, device="meta")).softmax(-1)


def _make_shell():
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import CapturingDisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets import Type
    from traitlets.config import Config

    class Hook(DisplayHook):
        """Keeps the value of a cell's last expression as an ``execute_result``."""

        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            self.shell._outputs.append(
                {
                    "output_type": "execute_result",
                    "execution_count": self.shell.execution_count,
                    "data": format_dict,
                    "metadata": md_dict or {},
                }
            )

    class SandboxShell(InteractiveShell):
        displayhook_class = Type(Hook)

        def _showtraceback(self, etype, evalue, stb):
            text = str(evalue)
            if etype is MemoryError:
                text = f"out of memory (the limit is {self._memory_limit / 2**30:.1f} GiB of memory) {text}".strip()
                stb = [*stb[:-1], f"MemoryError: {text}\n"]
            self._outputs.append(
                {
                    "output_type": "error",
                    "ename": getattr(etype, "__name__", str(etype)),
                    "evalue": _short(text, 2000),
                    "traceback": [_short(line, 4000) for line in stb[-30:]],
                }
            )

        def _format_exception_for_storage(self, exception, filename=None, running_compiled_code=False):
            # IPython formats every exception a second time, for its history; skip that
            return {"ename": type(exception).__name__, "evalue": str(exception)[:200], "traceback": []}

        def showtraceback(
            self,
            exc_tuple=None,
            filename=None,
            tb_offset=None,
            exception_only=False,
            running_compiled_code=False,
        ):
            # Python's own formatting: IPython's takes seconds on a deep recursion
            etype, value, tb = exc_tuple or sys.exc_info()
            if etype is None:
                return
            if issubclass(etype, SyntaxError):
                return self.showsyntaxerror(filename)
            frames = [f for f in traceback.extract_tb(tb) if not f.filename.endswith("interactiveshell.py")]
            lines = traceback.format_list(frames[-12:]) + traceback.format_exception_only(etype, value)
            self._showtraceback(etype, value, ["Traceback (most recent call last):\n", *lines])

    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "nocolor"
    shell = SandboxShell.instance(config=config)
    shell._outputs = []
    shell._memory_limit = 0
    shell.display_pub = CapturingDisplayPublisher()
    try:
        shell.enable_matplotlib("inline")
    except Exception:  # matplotlib-inline missing: figures are simply not captured
        pass
    return shell


# --------------------------------------------------------------------------- notebook process


class NotebookProcess:
    def __init__(self, sock: socket.socket, shell, workdir: str, limits: dict, seed: int, watch=None):
        self.sock = sock
        REFERENCE_CALLS.clear()
        _watch(watch)
        self.shell = shell
        self.labels: dict[int, str] = {}  # execution count -> cell label, for hints
        self.template = os.getppid()
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.chdir(workdir)
        os.environ.clear()
        os.environ.update(CLEAN_ENV)
        os.environ["HOME"] = workdir
        os.environ["TMPDIR"] = workdir
        _limit(limits)
        shell._memory_limit = int(limits["memory"])
        _reseed(seed)

    def serve(self) -> None:
        while True:
            try:
                msg, _, _ = protocol.recv(self.sock)
            except protocol.ProtocolError:
                return
            op = msg.get("op")
            if op == "cell":
                reply = self.run_cell(str(msg["source"]), str(msg.get("label", "")))
                REFERENCE_CALLS.update(_copies_of_references(self.shell.user_ns))
                reply = _with_calls(reply)
                try:
                    protocol.send(self.sock, reply)
                except (TypeError, ValueError):  # the cell put values that are not JSON among its outputs
                    reply["outputs"] = [o for o in reply["outputs"] if _jsonable(o)]
                    protocol.send(self.sock, reply)
            elif op == "fork":
                self.fork_check()
            else:
                return

    def run_cell(self, source: str, label: str) -> dict:
        shell = self.shell
        shell._outputs = []
        shell.display_pub.outputs.clear()
        out, err = _Capped(), _Capped()
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        started = time.monotonic()
        try:
            self.labels[shell.execution_count] = label
            result = shell.run_cell(source, store_history=True)
            ok = result.success
        except BaseException as e:  # a SystemExit escaping IPython, or worse
            ok = False
            shell._outputs.append(
                {
                    "output_type": "error",
                    "ename": type(e).__name__,
                    "evalue": _short(str(e), 2000),
                    "traceback": [],
                }
            )
        finally:
            sys.stdout, sys.stderr = saved
            # a failed cell's frames (and whatever they hold) are kept alive for %debug: let them go
            sys.last_type = sys.last_value = sys.last_traceback = None
            shell.last_execution_result = None
            result = None
            if not ok:
                gc.collect()  # the exception's traceback and frames form cycles; free them now
        outputs = []
        if out.kept or out.dropped:
            outputs.append({"output_type": "stream", "name": "stdout", "text": out.value()})
        if err.kept or err.dropped:
            outputs.append({"output_type": "stream", "name": "stderr", "text": err.value()})
        size = 0
        for d in list(shell.display_pub.outputs):
            data = d.get("data") if isinstance(d, dict) else None
            data = {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}
            size += sum(len(v) for v in data.values())
            if size > MAX_DISPLAY:
                outputs.append(
                    {"output_type": "stream", "name": "stdout", "text": "[more display output was dropped]\n"}
                )
                break
            outputs.append({"output_type": "display_data", "data": data, "metadata": {}})
        count = shell.execution_count - 1
        for o in shell._outputs:  # the cell's code can append anything here: the trusted side sorts it out
            if isinstance(o, dict) and o.get("output_type") == "execute_result":
                o["execution_count"] = count
        outputs += shell._outputs if isinstance(shell._outputs, list) else []
        return {
            "ok": bool(ok),
            "outputs": outputs,
            "seconds": round(time.monotonic() - started, 3),
            "execution_count": count,
            "sandbox_harmed": _harmed(self.template),
        }

    def fork_check(self) -> None:
        """Fork a check process. The trusted side asks for it ahead of time (see
        ``Session.begin_check``): it waits for its first message, the seed of its check."""
        ours, theirs = socket.socketpair()
        # reap finished check processes so that they do not pile up as zombies
        _reap()
        # Undo a student's swap in sys.modules of a module the check process's own code imports
        # (RUNTIME_IMPORTS), here rather than in the child: every object a process writes to (a
        # reference count is a write) is a page it must copy after a fork. Only those, and only where
        # they differ: restoring the whole of sys.modules wrote to every module's object, which cost
        # the notebook's process a copied page per module after each fork (0.4 s of system time per
        # ch01 grading). A swap of any other module, or a student's thread racing this, only changes
        # what their own checks see, which their code controls anyway: the trusted side reads every
        # answer as hostile data.
        for name in RUNTIME_IMPORTS:
            if sys.modules.get(name) is not TRUSTED_MODULES[name]:
                sys.modules[name] = TRUSTED_MODULES[name]
        # Leave what exists now out of the child's garbage collections: a collection visits every
        # object it tracks, and each visit is a write that copies the object's page
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                self.sock.close()
                _touch_pages()  # while the trusted side is still busy with the check before
                first, _, _ = protocol.recv(theirs)
                _reseed(int(first["seed"]))
                CheckProcess(theirs, self.shell.user_ns, self.labels).serve()
            finally:
                os._exit(0)
        theirs.close()
        protocol.send(self.sock, {"ok": True, "pid": pid}, fds=[ours.fileno()])
        ours.close()


class _Capped:
    """A text stream that keeps the first ``MAX_TEXT`` characters."""

    def __init__(self):
        self.text: list[str] = []
        self.kept = 0
        self.dropped = 0

    def write(self, s) -> int:
        s = str(s)
        room = MAX_TEXT - self.kept
        if room > 0:
            self.text.append(s[:room])
            self.kept += min(len(s), room)
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def value(self) -> str:
        tail = f"\n[{self.dropped} more characters of output were dropped]\n" if self.dropped else ""
        return "".join(self.text) + tail

    def flush(self):
        pass

    def isatty(self):
        return False

    def fileno(self):
        raise OSError("captured stream has no file descriptor")

    @property
    def encoding(self):
        return "utf-8"


# --------------------------------------------------------------------------- check process


class CheckProcess:
    """Calls the student's objects on the inputs the trusted side sends."""

    def __init__(self, sock: socket.socket, namespace: dict, labels: dict[int, str]):
        self.sock = sock
        self.ns = namespace
        self.labels = labels
        self.handles: dict[int, object] = {}
        self.ids: dict[int, int] = {}  # id(object) -> handle

    def serve(self) -> None:
        while True:
            try:
                msg, arrays, _ = protocol.recv(self.sock)
            except protocol.ProtocolError:
                return
            try:
                reply = self.answer(msg, arrays)
            except BaseException as e:  # the student's code raised (or exited): report it as data
                reply = ({"raised": self.describe_error(e)}, {})
            header, out = reply
            header = _with_calls(header)
            try:
                protocol.send(self.sock, header, out, max_blob=protocol.REPLY_BLOB)
            except (TypeError, ValueError) as e:
                protocol.send(self.sock, {"unsendable": _short(f"{type(e).__name__}: {e}", 500)})

    def handle(self, obj) -> dict:
        key = id(obj)
        if key not in self.ids:
            self.ids[key] = len(self.handles) + 1
            self.handles[self.ids[key]] = obj
        t = type(obj)
        mro = [f"{c.__module__}.{c.__qualname__}" for c in t.__mro__][:20]
        return {"$h": self.ids[key], "type": t.__qualname__, "mro": mro}

    def resolve(self, ref: dict):
        if "$ref" in ref:
            return self.handles[int(ref["$ref"])]
        name = str(ref["name"])
        if name not in self.ns:
            raise NameError(f"name {name!r} is not defined (did you run the cell that defines it?)")
        return self.ns[name]

    def answer(self, msg: dict, arrays) -> tuple[dict, dict]:
        decode = lambda v: protocol.decode(v, arrays, lambda h: self.handles[int(h["$ref"])])  # noqa: E731
        target = self.resolve(msg["target"])
        op = msg.get("op")
        if op == "call":
            args = decode(msg.get("args", []))
            kwargs = decode(msg.get("kwargs", {"$dict": []}))
            result = target(*args, **kwargs)
            extra = {}
            if msg.get("return_args"):
                extra["args"] = list(args)
                extra["kwargs"] = kwargs
                extra["aliased"] = protocol.shares_memory(result, args, kwargs)
            if msg.get("backward") is not None:
                index, upstream = decode(msg["backward"])
                out = result if index is None else result[index]
                import torch

                if isinstance(out, torch.Tensor) and out.requires_grad:
                    (out * upstream).sum().backward()
                extra["grads"] = [a.grad if getattr(a, "requires_grad", False) else None for a in args]
            value = {"result": result, **extra}
        elif op == "getattr":
            value = {"result": getattr(target, str(msg["name"]))}
        elif op == "setattr":  # e.g. a grader setting one dropout's p to check it in isolation
            setattr(target, str(msg["name"]), decode(msg.get("value")))
            value = {"result": None}
        elif op == "list":
            value = {"result": list(target)}
        elif op == "len":
            value = {"result": len(target)}
        elif op == "getitem":
            value = {"result": target[decode(msg["key"])]}
        elif op == "value":  # a plain global such as a prediction (data comes back as data)
            value = {"result": target}
        else:
            raise ValueError(f"unknown operation {op!r}")
        out: dict = {}
        return {"ok": protocol.encode(value, out, self.handle)}, out

    def describe_error(self, e: BaseException) -> dict:
        where = ""
        for frame in reversed(traceback.extract_tb(e.__traceback__)):
            m = re.match(r"<ipython-input-(\d+)-", frame.filename or "")
            if m:
                label = self.labels.get(int(m.group(1)), "")
                cell = f" of your cell {label!r}" if label else " of your code"
                where = f"line {frame.lineno}{cell}: {(frame.line or '').strip()}"
                break
        return {"type": type(e).__name__, "message": _short(str(e), 2000), "where": _short(where, 500)}


# --------------------------------------------------------------------------- helpers


def _limit(limits: dict) -> None:
    """Apply the per-submission resource limits to this process and its children."""

    def setlimit(which, value):
        try:
            soft, hard = resource.getrlimit(which)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass

    vm = _vmsize()
    setlimit(resource.RLIMIT_AS, vm + int(limits["memory"]))
    setlimit(resource.RLIMIT_CPU, int(limits["cpu_seconds"]))
    setlimit(resource.RLIMIT_FSIZE, int(limits["file_size"]))
    setlimit(resource.RLIMIT_NPROC, int(limits["processes"]) + _user_processes())
    setlimit(resource.RLIMIT_NOFILE, 256)
    setlimit(resource.RLIMIT_CORE, 0)


def _reseed(seed: int) -> None:
    """Seed every generator, and give torch back the one thread the sandbox runs it with: a
    notebook that called ``torch.set_num_threads(8)`` would otherwise have its checks fight over
    the cores the other submissions are graded on (and miss their deadlines under load).

    torch's generator is the CPU's, seeded as ``torch.manual_seed`` seeds it: the sandbox has no
    other device, and ``torch.manual_seed`` also visits CUDA's, MPS's and XPU's modules, whose
    pages a freshly forked check process then copies (4 ms of every check's 11 before it answers)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.default_generator.manual_seed(seed)
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def _set_not_dumpable() -> None:
    """Keep other processes of the sandbox from reading or tracing this one."""
    _set_dumpable(False)


def _set_dumpable(on: bool) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, int(on), 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except OSError:
        pass


def _jsonable(value) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _harmed(template: int) -> bool:
    """True when the template this process was forked from is gone (this process was
    reparented), stopped, exiting, or has a signal pending that it does not expect: only the
    cell that just ran can have done it. (A SIGKILL takes effect asynchronously: a large
    process is seen exiting for milliseconds, so the state alone would miss it.)"""
    if os.getppid() != template:
        return True
    try:
        with open(f"/proc/{template}/stat") as f:
            data = f.read()
        fields = data[data.rindex(")") + 2 :].split()
        state, flags = fields[0], int(fields[6])
        if state in "TtZXx" or flags & 0x4:  # stopped, traced, dead; PF_EXITING
            return True
        with open(f"/proc/{template}/status") as f:
            pending = 0
            for line in f:
                if line.startswith(("SigPnd:", "ShdPnd:")):
                    pending |= int(line.split()[1], 16)
        return bool(pending & ~(1 << (signal.SIGCHLD - 1)))  # SIGCHLD: a child of it ended, as they do
    except (OSError, ValueError, IndexError):
        return True


def _stat(pid: int, field: int) -> int | None:
    """Field ``field`` (0-based, after the command name) of /proc/PID/stat, as an int."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
        return int(data[data.rindex(")") + 2 :].split()[field - 2])
    except (OSError, ValueError, IndexError):
        return None


def _wait_until_dead(pids: set[int], deadline: float) -> None:
    """Wait until each of ``pids`` has exited (gone, or a zombie holding no memory), or the deadline."""
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if _state(pid) not in (None, "Z", "X")}
        if alive:
            time.sleep(0.002)
            _reap()


def _state(pid: int) -> str | None:
    """The one-letter state of /proc/PID/stat (R, S, D, Z, ...), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
        return data[data.rindex(")") + 2]
    except (OSError, ValueError, IndexError):
        return None


#: the most processes whose proportional share of memory the watch reads (see :func:`_memory`)
PSS_PROCESSES = 8
#: readings in a row (0.1 s apart) that the watch waits for starting processes to settle before
#: it counts them by RSS (see :meth:`Template.watch`)
DEFERRALS = 5


def _memory(pids: list[int], allowed: int | None, budget: float = 0.05, cap: float = 1.0) -> dict[int, int]:
    """Bytes of memory each process really uses, as far as a limit of ``allowed`` bytes needs
    (``None``: their RSS only, for processes that may be forking).

    Their resident sizes (RSS, ``/proc/PID/statm``: cheap) first; when those add up to more than
    ``allowed``, the processes' proportional shares (PSS, ``/proc/PID/smaps_rollup``) instead, the
    largest first, so that pages a forked process still shares with its parent (the torch every
    process inherits from the template) are not counted once per process. Reading a PSS walks the
    process's memory map under a lock that a process busy forking holds, and waits for it: so PSS
    is read only while there are at most :data:`PSS_PROCESSES` processes (a notebook, a check and
    what they started, not a fork bomb), the same ones as at the watch's last reading (the caller
    passes ``None`` otherwise), and for ``budget`` seconds of this thread's CPU time and ``cap``
    seconds of wall time at most; the rest keep their RSS, so that forking processes cannot keep
    the watch from counting and killing them. (CPU time: on a busy machine the readings wait for a
    core, and a wall-clock budget alone would leave processes counted by RSS, over the limit.)"""
    page = os.sysconf("SC_PAGE_SIZE")
    rss = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                rss[pid] = int(f.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            rss[pid] = 0
    if allowed is None or sum(rss.values()) <= allowed or len(pids) > PSS_PROCESSES:
        return rss
    memory = dict(rss)
    spent, end = time.thread_time() + budget, time.monotonic() + cap
    for pid in sorted(pids, key=rss.get, reverse=True):
        if time.thread_time() > spent or time.monotonic() > end:
            break
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        memory[pid] = int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError, IndexError):
            pass
    return memory


def _vmsize() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _user_processes() -> int:
    uid = os.getuid()
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _wipe(path: str) -> None:
    def unlock(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=unlock)


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + f"... [{len(text) - n} more characters]"


def in_own_pid_namespace(host_namespace: str) -> bool:
    """Whether this process runs in a PID namespace other than ``host_namespace`` (the host's
    ``/proc/self/ns/pid`` link). Only then may :meth:`Template.kill_all` signal ``-1``: outside a
    namespace of its own that would reach every process of this user, other courses' included."""
    try:
        return os.readlink("/proc/self/ns/pid") != host_namespace
    except OSError:
        return False


def main(argv: list[str]) -> None:
    fd, scratch = int(argv[0]), argv[1]
    pidns = argv[2].startswith("pidns=") and in_own_pid_namespace(argv[2].removeprefix("pidns="))
    preload = [m for m in argv[3].split(",") if m] if len(argv) > 3 else []
    ctrl = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    Template(ctrl, scratch, pidns, preload).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
