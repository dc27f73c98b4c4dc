"""Per-notebook grading time: ``coursekit autograde`` against plain ``nbgrader autograde``.

    .venv/bin/python benchmarks/grading.py [--students 20] [--quick] [--json out.json]

The same submissions of Exercise 1 (the reference, the instructor's notebook, the
untouched release and mutants of the catalogue) are graded, in one run, by

* plain nbgrader: one ``nbgrader autograde ch01_attention`` call for the class (a
  kernel per notebook, the tests in the student's kernel);
* ``coursekit autograde --jobs 1`` and ``--jobs 2``: sandboxed, from a fresh course
  folder each (no cached verdicts), including starting the sandboxes.

Neither writes feedback. Prints seconds per notebook and the ratios. ``--quick`` grades one
notebook, by plain nbgrader and ``--jobs 1`` only: it checks that the benchmark runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ASSIGNMENT = "ch01_attention"


def make_course(parent: Path, name: str, n: int) -> tuple[Path, Path]:
    import nbformat

    from tests.mutants.ch01_attention import MUTANTS
    from tests.submissions import course_folder, filled, load, replace_definition

    root, inbox = course_folder(parent, name)
    reference = filled(ASSIGNMENT)
    notebooks = [
        ("reference", reference),
        ("untouched", load(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")),
        ("solution", load(ROOT / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")),
    ]
    notebooks += [(m.name, replace_definition(reference, m.target, m.source)) for m in MUTANTS]
    while len(notebooks) < n:
        notebooks.append((f"reference{len(notebooks)}", reference))
    for student, nb in notebooks[:n]:
        nbformat.write(nb, inbox / f"{student}.ipynb")
    return root, inbox


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--students", type=int, default=20)
    parser.add_argument(
        "--quick", action="store_true", help="1 notebook, --jobs 1 only: checks that the benchmark runs"
    )
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if args.quick:
        args.students = 1
    from coursekit import course
    from coursekit import inbox as inbox_module
    from coursekit.sandbox import bubblewrap_works

    bindir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # plain nbgrader
        root, inbox = make_course(tmp, "plain", args.students)
        students = inbox_module.collect(root, ASSIGNMENT, inbox, [f"{ASSIGNMENT}.ipynb"]).students
        api = course.nbgrader_api(root, **{"CourseDirectory.release_directory": str(tmp / "release")})
        course.expect_success(api.generate_assignment(ASSIGNMENT, force=True, create=True), "registering")
        started = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "nbgrader",
                "autograde",
                ASSIGNMENT,
                "--force",
                f"--CourseDirectory.root={root}",
                f"--Exchange.root={tmp / 'exchange'}",
            ],
            cwd=root,
            env=env,
            check=True,
            capture_output=True,
        )
        results["plain nbgrader autograde"] = time.perf_counter() - started
        # coursekit, one and two workers
        # quick: one notebook, which --jobs 2 grades in-process as --jobs 1 does (one task, no pool)
        for jobs in (1,) if args.quick else (1, 2):
            root, inbox = make_course(tmp, f"coursekit{jobs}", args.students)
            started = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "coursekit.cli",
                    "--course",
                    str(root),
                    "autograde",
                    str(inbox),
                    "--assignment",
                    ASSIGNMENT,
                    "--no-feedback",
                    "--jobs",
                    str(jobs),
                    "--csv",
                    str(root / "grades.csv"),
                ],
                cwd=root,
                env=env,
                check=True,
                capture_output=True,
            )
            results[f"coursekit autograde --jobs {jobs}"] = time.perf_counter() - started
    n = len(students)
    base = results["plain nbgrader autograde"]
    print(
        f"# grading {n} notebooks of {ASSIGNMENT} on {platform.machine()}, {os.cpu_count()} cores, "
        f"python {platform.python_version()}, sandbox: {'bubblewrap' if bubblewrap_works() else 'rlimit fallback'}"
    )
    print(f"{'method':34s} {'total s':>8s} {'s/notebook':>11s} {'vs plain':>9s}")
    for name, seconds in results.items():
        print(f"{name:34s} {seconds:8.1f} {seconds / n:11.2f} {base / seconds:8.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"notebooks": n, "seconds": results}, indent=2))


if __name__ == "__main__":
    main()
