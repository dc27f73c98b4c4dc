"""The book build the browser tests read, started in the background when the session begins.

Building the book executes every page: about eight minutes, most of it one kernel on one core.
``tests/conftest.py`` starts it (:func:`start`) as soon as the collected tests include one that
needs the built book, so that the rest of the suite runs beside it on the other core; the
``book`` fixture of ``tests/test_book.py`` then waits for it (:func:`wait`). The build is the
README's command (``jupyter-book build . -W -n --keep-going``) in its own process group, which
the session kills if it ends first (``-x``, Ctrl-C): it touches no process it did not start.

Under pytest-xdist every worker collects the same tests and asks for the build; the first one
claims it (a claim file named after the run's ``testrunuid``, created exclusively), runs it and
writes its outcome to a result file beside the claim as soon as it ends; the other workers wait for
that file. The worker that runs the build waits for it before it exits (its own tests may end
first), unless the session was interrupted; it removes the two files at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def command(*options: str) -> list[str]:
    """``jupyter-book build . -W -n --keep-going [options]``, from this interpreter's environment."""
    return [
        str(Path(sys.executable).parent / "jupyter-book"),
        "build",
        ".",
        "-W",
        "-n",
        "--keep-going",
        *options,
    ]


def environment(edition: str = "student") -> dict[str, str]:
    bindir = Path(sys.executable).parent
    return dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", COURSEKIT_EDITION=edition)


class Build:
    """A running ``jupyter-book build`` of the repository, its output going to a temporary log."""

    def __init__(self) -> None:
        subprocess.run(
            [str(ROOT / "scripts" / "install_mathjax.sh")], check=True, cwd=ROOT, capture_output=True
        )
        self.log = tempfile.NamedTemporaryFile(prefix="book-build-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            command(),
            cwd=ROOT,
            env=environment(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as a whole, and only it
        )

    def wait(self, timeout: float = 1800) -> tuple[int, str]:
        """Wait for the build; return its exit code and, if it failed, what to read: the end of its
        output, then its causes (see :func:`causes`), last, where a CI log's tail shows them. A failed
        build's whole log is kept as ``_build/book-build.log``."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            code = -1
        self.log.flush()
        text = Path(self.log.name).read_text(errors="replace")
        if code == 0:
            return code, ""
        kept = ROOT / "_build" / "book-build.log"
        kept.parent.mkdir(exist_ok=True)
        shutil.copyfile(self.log.name, kept)
        return (
            code,
            f"{text[-3000:]}\n{causes(text, ROOT / '_build' / 'html' / 'reports')}\nwhole log: {kept}",
        )

    def stop(self) -> None:
        """Kill the build and every process it started (its kernels), if it is still running."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def close(self) -> None:
        self.stop()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


_CAUSE = re.compile(r"WARNING|ERROR|CRITICAL|Error:|Exception:|timed out|Timeout", re.IGNORECASE)


def causes(log: str, reports: Path, limit: int = 40) -> str:
    """Why a build failed, in a few lines: the log's warning and error lines (each once, in order;
    with ``-W`` any warning fails the build) and the last lines of each page's execution report,
    which Jupyter Book writes to ``_build/html/reports/`` when a cell raises."""
    seen, lines = set(), []
    for line in log.splitlines():
        line = line.strip()
        if _CAUSE.search(line) and line not in seen and "There was an error in building" not in line:
            seen.add(line)
            lines.append(line[:400])
    out = ["--- warnings and errors in the build log ---", *lines[:limit]]
    if len(lines) > limit:
        out.append(f"... and {len(lines) - limit} more")
    for report in sorted(reports.rglob("*.log")) if reports.is_dir() else []:
        tail = report.read_text(errors="replace").strip().splitlines()[-6:]
        out += [f"--- {report.relative_to(reports)} (last lines) ---", *tail]
    return "\n".join(out)


class Shared:
    """The build of this test run, as every process of the run sees it: the process that claims it
    (:func:`start`) runs a :class:`Build` and a thread that writes its outcome to ``result`` when
    it ends; the others wait for that file. Without xdist the run has one process, which claims."""

    def __init__(self, run: str, make_build=Build, folder: Path | None = None) -> None:
        folder = Path(folder or tempfile.gettempdir())
        self.claim = folder / f"coursekit-book-build-{run}.claim"
        self.result = folder / f"coursekit-book-build-{run}.json"
        self.build: Build | None = None
        try:
            os.close(os.open(self.claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # another worker of this run builds
        self.build = make_build()
        threading.Thread(target=self._record, daemon=True).start()

    def _record(self) -> None:
        code, output = self.build.wait()
        tmp = self.result.with_suffix(".tmp")
        tmp.write_text(json.dumps({"code": code, "output": output}))
        tmp.replace(self.result)  # whole or absent: a reader never sees half of it

    def wait(self, timeout: float = 1800) -> tuple[int, str]:
        """The build's exit code and, if it failed, what to read (see :meth:`Build.wait`)."""
        deadline = time.monotonic() + timeout
        while not self.result.exists():
            if time.monotonic() > deadline:
                return (
                    -1,
                    f"no book build result after {timeout:.0f} s (the worker that built it: {self.claim})",
                )
            time.sleep(0.5)
        outcome = json.loads(self.result.read_text())
        return outcome["code"], outcome["output"]

    def close(self, interrupted: bool) -> None:
        """End of this process's session. The builder lets the build finish for the other workers
        (unless the run was interrupted), then removes its log and the run's two files."""
        if self.build is None:
            return
        if interrupted:
            self.build.stop()
        else:
            self.wait()
        self.build.close()
        self.claim.unlink(missing_ok=True)
        self.result.unlink(missing_ok=True)


_shared: Shared | None = None


def run_id() -> str:
    """This test run's id: xdist's ``testrunuid``, the same in every worker, or one of our own."""
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def start() -> Shared:
    """Start the build once per test run (later calls, and other workers, get the same one)."""
    global _shared
    if _shared is None:
        _shared = Shared(run_id())
    return _shared


def finish(interrupted: bool = False) -> None:
    """End of the session: see :meth:`Shared.close`."""
    global _shared
    if _shared is not None:
        _shared.close(interrupted)
        _shared = None
