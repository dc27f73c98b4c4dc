"""The ``coursekit`` command: release exercises, autograde submissions, check the setup.

    coursekit release [ASSIGNMENT ...] [--check]
    coursekit autograde SUBMISSIONS --assignment ch01_attention [--csv grades.csv]
    coursekit doctor
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import platform
import shutil
import sys
from pathlib import Path

from coursekit import course


def _root(args) -> Path:
    return Path(args.course).resolve() if args.course else course.repo_root()


def cmd_release(args) -> int:
    root = _root(args)
    if args.check:
        problems = course.stale_releases(root)
        for p in problems:
            print(p)
        print("exercises/ is stale: run `coursekit release`" if problems else "exercises/ is current")
        return 1 if problems else 0
    for path in course.release(root, args.assignments or None):
        print(f"wrote {path.relative_to(root)}")
    return 0


def cmd_autograde(args) -> int:
    root = _root(args)
    students = course.collect(root, args.assignment, Path(args.submissions))
    print(f"collected {len(students)} submissions of {args.assignment} into {root / 'submitted'}")
    grades = course.autograde(root, args.assignment, students, feedback=not args.no_feedback)
    width = max(len(g.student) for g in grades)
    for g in grades:
        note = f"  (not graded: {g.error})" if g.error else ""
        print(f"{g.student:<{width}}  {g.score:g} / {g.max_score:g}{note}")
    csv_path = Path(args.csv).resolve()
    course.export_csv(root, csv_path)
    print(f"grades of every assignment: {csv_path}")
    if not args.no_feedback:
        print(f"feedback (HTML, one per student): {root / 'feedback'}")
    return 0


def cmd_doctor(args) -> int:
    """Check what the course needs; print one line per item; fail if anything is missing."""
    ok = True

    def report(good: bool, what: str, detail: str) -> None:
        nonlocal ok
        ok &= good
        print(f"[{'ok' if good else 'FAIL'}] {what}: {detail}")

    report(sys.version_info >= (3, 11), "python", platform.python_version())
    for dist in ("torch", "numpy", "matplotlib", "nbgrader", "jupyter-book", "sphinx", "nbval", "selenium"):
        try:
            report(True, dist, importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            report(False, dist, "not installed: pip install -r requirements.txt")
    for exe in ("chromium", "chromedriver"):
        path = shutil.which(exe)
        report(path is not None, exe, path or "not found (needed by the browser test): apt-get install chromium chromium-driver")
    try:
        root = course.repo_root()
        mathjax = root / "_vendor" / "mathjax" / "tex-chtml.js"
        report(mathjax.is_file(), "local MathJax", str(mathjax) if mathjax.is_file() else "missing: run `make mathjax`")
    except FileNotFoundError as e:
        report(False, "course folder", str(e))
    code = "import coursekit.attention, torch; print(torch.__version__)"
    try:
        from jupyter_client.manager import start_new_kernel

        km, kc = start_new_kernel(kernel_name="python3")
        try:
            reply = kc.execute_interactive(code, timeout=60, output_hook=lambda msg: None)
            report(reply["content"]["status"] == "ok", "python3 kernel", "imports coursekit and torch")
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    except Exception as e:  # any failure to start or run the kernel is the finding
        report(False, "python3 kernel", f"{type(e).__name__}: {e}")
    print("everything the course needs is here" if ok else "some checks failed (see above)")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="coursekit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--course", help="course folder (default: the nearest folder with nbgrader_config.py)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("release", help="regenerate exercises/ from solutions/ with nbgrader")
    p.add_argument("assignments", nargs="*", help="assignment ids (default: all)")
    p.add_argument("--check", action="store_true", help="only report whether exercises/ is current")
    p.set_defaults(func=cmd_release)

    p = sub.add_parser("autograde", help="collect a folder of submissions, autograde, write feedback and a CSV")
    p.add_argument("submissions", help="folder of <student>.ipynb or <student>/<notebook>.ipynb")
    p.add_argument("--assignment", required=True, help="assignment id, e.g. ch01_attention")
    p.add_argument("--csv", default="grades.csv", help="where to export grades (default: grades.csv)")
    p.add_argument("--no-feedback", action="store_true", help="skip the HTML feedback")
    p.set_defaults(func=cmd_autograde)

    p = sub.add_parser("doctor", help="check versions, Chromium, MathJax and the Jupyter kernel")
    p.set_defaults(func=cmd_doctor)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"coursekit {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
