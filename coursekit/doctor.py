"""``coursekit doctor``: is this machine ready for a job of the course?

Checks are grouped by the job that needs them, and a job is ready when all of its checks pass:

* ``grading``: autograding a class (the packages, bubblewrap, the course folder and its gradebook);
* ``book``: building the book (Jupyter Book, the local MathJax, a Python kernel that imports coursekit);
* ``training``: regenerating the committed checkpoints (torch, a writable ``checkpoints/``);
* ``tests``: the whole test suite (Chromium and its driver, bubblewrap, PostgreSQL's server tools).

So ``coursekit doctor grading`` does not fail on a missing MathJax, which grading never uses.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import platform
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["JOBS", "run_checks"]

JOBS = ("grading", "book", "training", "tests")

#: job -> the Python distributions it imports
PACKAGES = {
    "grading": ("torch", "numpy", "nbgrader", "nh3", "hypothesis"),
    "book": ("jupyter-book", "sphinx", "matplotlib", "ipykernel"),
    "training": ("torch", "numpy", "tqdm"),
    "tests": ("pytest", "nbval", "selenium", "transformers", "tiktoken", "hypothesis"),
}

Line = tuple[bool, str, str]  # (ok, what, detail)


def _python() -> Line:
    return (
        sys.version_info >= (3, 11),
        "python",
        platform.python_version() + ("" if sys.version_info >= (3, 11) else ": 3.11 or newer is needed"),
    )


def _package(dist: str) -> Line:
    try:
        return True, dist, importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False, dist, "not installed: pip install -r requirements.txt (or make setup)"


def _bubblewrap() -> Line:
    from coursekit.sandbox import bubblewrap_works

    ok = bubblewrap_works()
    return (
        ok,
        "bubblewrap",
        (
            "works (student code is sandboxed)"
            if ok
            else "missing or blocked: coursekit autograde refuses to grade; sudo apt-get install bubblewrap "
            "(scripts/system_deps.sh), or --sandbox rlimit to grade without isolation knowingly"
        ),
    )


def _executable(name: str, why: str, package: str) -> Line:
    path = shutil.which(name)
    return (
        path is not None,
        name,
        path or f"not found ({why}): apt-get install {package} (scripts/system_deps.sh)",
    )


def _postgres() -> Line:
    found = glob.glob("/usr/lib/postgresql/*/bin/pg_ctl") or (
        [shutil.which("pg_ctl")] if shutil.which("pg_ctl") else []
    )
    return (
        bool(found),
        "PostgreSQL server tools",
        (
            found[0]
            if found
            else "not found (the PostgreSQL gradebook test "
            "starts a throwaway server): apt-get install postgresql"
        ),
    )


def _mathjax(root: Path) -> Line:
    path = root / "_vendor" / "mathjax" / "tex-chtml.js"
    return path.is_file(), "local MathJax", str(path) if path.is_file() else "missing: run `make mathjax`"


def _gradebook(root: Path) -> Iterator[Line]:
    from coursekit import course
    from coursekit.autograde import check_gradebook

    yield from check_gradebook(course.gradebook_url(root))


def _checkpoints(root: Path) -> Line:
    folder = root / "checkpoints"
    ok = folder.is_dir() and os.access(folder, os.W_OK)
    return ok, "checkpoints folder", str(folder) + ("" if ok else ": missing or not writable")


def _kernel() -> Line:
    code = "import coursekit.attention, torch; print(torch.__version__)"
    try:
        from jupyter_client.manager import start_new_kernel

        km, kc = start_new_kernel(kernel_name="python3")
        try:
            reply = kc.execute_interactive(code, timeout=60, output_hook=lambda msg: None)
            return reply["content"]["status"] == "ok", "python3 kernel", "imports coursekit and torch"
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    except Exception as e:  # noqa: BLE001 (any failure to start or run the kernel is the finding)
        return False, "python3 kernel", f"{type(e).__name__}: {e}"


def _course(root: Path | None, lines: Callable[[Path], Iterator[Line]]) -> Iterator[Line]:
    if root is None:
        yield (
            False,
            "course folder",
            "no nbgrader_config.py here or above: run from the course folder (or --course)",
        )
    else:
        yield from lines(root)


def run_checks(root: Path | None, jobs: tuple[str, ...] = JOBS) -> dict[str, list[Line]]:
    """job -> its check lines, for each of ``jobs`` (``root`` is the course folder, or ``None``)."""
    unknown = [j for j in jobs if j not in JOBS]
    if unknown:
        raise ValueError(f"unknown job(s) {unknown}; choose from {list(JOBS)}")
    found: dict[str, list[Line]] = {}
    for job in jobs:
        lines = [_python(), *(_package(d) for d in PACKAGES[job])]
        if job == "grading":
            lines += [_bubblewrap(), *_course(root, _gradebook)]
        elif job == "book":
            lines += [*_course(root, lambda r: iter([_mathjax(r)])), _kernel()]
        elif job == "training":
            lines += list(_course(root, lambda r: iter([_checkpoints(r)])))
        elif job == "tests":
            lines += [
                _bubblewrap(),
                _executable("chromium", "the browser tests", "chromium"),
                _executable("chromedriver", "the browser tests", "chromium-driver"),
                _postgres(),
                _executable("pg_dump", "backing up a PostgreSQL gradebook", "postgresql-client"),
            ]
        found[job] = lines
    return found
