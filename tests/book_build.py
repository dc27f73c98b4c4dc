"""The book build the browser tests read, started in the background when the session begins.

Building the book executes every page: about eight minutes, most of it one kernel on one core.
``tests/conftest.py`` starts it (:func:`start`) as soon as the collected tests include one that
needs the built book, so that the rest of the suite runs beside it on the other core; the
``book`` fixture of ``tests/test_book.py`` then waits for it (:func:`wait`). The build is the
README's command (``jupyter-book build . -W -n --keep-going``) in its own process group, which
the session kills if it ends first (``-x``, Ctrl-C): it touches no process it did not start.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
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


_build: Build | None = None


def start() -> Build:
    """Start the build once per session (later calls return the same one)."""
    global _build
    if _build is None:
        _build = Build()
    return _build


def finish() -> None:
    """End of the session: stop a build nobody waited for, and remove its log."""
    global _build
    if _build is not None:
        _build.close()
        _build = None
