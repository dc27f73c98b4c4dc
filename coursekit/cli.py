"""The ``coursekit`` command: release exercises, autograde submissions, check the setup.

coursekit release [ASSIGNMENT ...] [--check]
coursekit autograde SUBMISSIONS --assignment ch01_attention [--jobs 2 | --scheduler tcp://HOST:8786]
                    [--csv grades.csv] [--times times.csv]
coursekit worker tcp://HOST:8786 [--nworkers N]   (a Dask worker that grades for --scheduler runs)
coursekit report --assignment ch01_attention
coursekit export [--format csv|canvas|moodle] [--out FILE]
coursekit formgrader [--port N]  (grade written answers by hand, in nbgrader's formgrader)
coursekit check NOTEBOOK          (students: run the public checks locally)
coursekit pretrain [NAME] [--out DIR] [--steps N] [--threads N]   (list, or regenerate, a committed checkpoint)
coursekit doctor [grading] [book] [training] [tests] [all]   (default: grading)
"""

from __future__ import annotations

import argparse
import logging
import sqlite3
import sys
import time
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from coursekit import course
from coursekit.sandbox import Limits, SandboxError


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


def _limits(args) -> Limits:
    if min(args.cell_timeout, args.check_timeout, args.timeout, args.memory) <= 0:
        raise ValueError("timeouts and the memory limit must be positive")
    return Limits(
        cell_seconds=args.cell_timeout,
        check_seconds=args.check_timeout,
        submission_seconds=args.timeout,
        memory=int(args.memory * 2**30),
    )


def cmd_autograde(args) -> int:
    from coursekit import autograde, exports, inbox, report

    root = _root(args)
    limits = _limits(args)
    if args.assignment not in course.assignments(root):
        raise ValueError(f"no such assignment in solutions/: {args.assignment!r}")
    times = inbox.read_times(Path(args.times)) if args.times else None
    started = time.monotonic()
    collected, results = autograde.grade_inbox(
        root,
        args.assignment,
        Path(args.submissions),
        times=times,
        jobs=args.jobs,
        limits=limits,
        sandbox=args.sandbox,
        fresh=args.fresh,
        feedback=not args.no_feedback,
        progress=sys.stderr.isatty(),
        scheduler=args.scheduler,
    )
    elapsed = time.monotonic() - started
    p = inbox.printable
    print(f"collected {len(collected.students)} submissions of {args.assignment} into {root / 'submitted'}")
    if collected.ignored:
        print(
            f"ignored {len(collected.ignored)} hidden or system entries: {p(', '.join(collected.ignored[:5]))}"
            f"{' ...' if len(collected.ignored) > 5 else ''}"
        )
    for r in collected.refused:
        print(f"NOT COLLECTED {p(r.entry)}: {p(r.reason)}")
    if results:
        width = max(len(r.student) for r in results)
        for r in results:
            extra = (
                f"  (not graded: {r.error})"
                if r.error
                else f"  [{r.notes[0]}{' ...' if len(r.notes) > 1 else ''}]"
                if r.notes
                else ""
            )
            print(f"{r.student:<{width}}  {r.score:g} / {r.max_score:g}{p(extra)}")
        cached = sum(r.cached for r in results)
        print(
            f"graded {len(results)} notebooks in {elapsed:.1f} s ({elapsed / len(results):.2f} s each"
            f"{f'; {cached} unchanged since the last run' if cached else ''})"
        )
    csv_path = Path(args.csv).resolve() if args.csv else root / "grades.csv"
    exports.export(root, csv_path)
    print(f"grades of every assignment: {csv_path}")
    rows = exports.grades(course.gradebook_url(root))
    waiting = exports.pending([g for g in rows if g.assignment == args.assignment])
    if waiting:
        print(
            f"{sum(waiting.values())} answers of {len(waiting)} students wait for a hand grade: "
            "coursekit formgrader (README: grading by hand)"
        )
    if args.sandbox == "rlimit" and any(not r.cached and not r.error for r in results):
        from coursekit.sandbox.host import rlimit_confinement

        print(
            "graded WITHOUT isolation (--sandbox rlimit, as you asked): student code "
            f"{rlimit_confinement().describe()}, but could read files outside it; the class report says so"
        )
    print(f"class report: {report.write_report(root, args.assignment)}")
    if not args.no_feedback:
        print(f"feedback (HTML, one per student): {root / 'feedback'}")
    return 1 if any(r.error for r in results) or collected.refused else 0


def cmd_export(args) -> int:
    from coursekit import exports

    root = _root(args)
    path = Path(args.out).resolve() if args.out else root / f"grades-{args.format}.csv"
    print(exports.export(root, path, args.format, allow_pending=args.allow_pending))
    waiting = exports.pending(exports.grades(course.gradebook_url(root)))
    if waiting:  # (only with --allow-pending: without it, export refused)
        print(exports.pending_warning(waiting), file=sys.stderr)
    return 0


def cmd_worker(args) -> int:
    """A Dask worker for ``coursekit autograde --scheduler``: ``--nworkers`` processes of one thread."""
    from coursekit.autograde import cluster

    if args.nworkers < 1:
        raise ValueError(f"--nworkers must be at least 1, got {args.nworkers}")
    import shlex

    return cluster.start_worker(args.scheduler, args.nworkers, shlex.split(args.dask_args))


def cmd_formgrader(args) -> int:
    """nbgrader's formgrader for the course on 127.0.0.1, until Ctrl-C."""
    from coursekit import formgrader

    server = formgrader.serve(_root(args), args.port)
    print(f"formgrader of {_root(args)}: open {server.url}", flush=True)
    print(
        "grade the written answers (and comment), then press Generate Feedback (Manage Assignments) to "
        "write them into the students' feedback; Ctrl-C stops it",
        flush=True,
    )
    try:
        # poll, not one blocking wait: Ctrl-C is then handled within a second whatever the process
        # was blocked in when it came
        while server.poll() is None:
            time.sleep(0.5)
        return server.returncode
    except KeyboardInterrupt:
        formgrader.stop(server)
        return 0


def cmd_report(args) -> int:
    from coursekit import report

    print(report.write_report(_root(args), args.assignment))
    return 0


def cmd_check(args) -> int:
    from coursekit import autograde

    path = Path(args.notebook)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    result = autograde.check_notebook(path, sandbox=args.sandbox, limits=_limits(args))
    for line in result.lines:
        # a failure message holds one line per failed check: print them as lines, and escape what else
        # could steer the terminal (the notebook's own outputs may hold escape sequences)
        for piece in line.split("\n"):
            print(_printable(piece.removesuffix("\r")))
    print(
        f"public checks: {result.public_score:g} of {result.public_max:g} points"
        + (
            f"; hidden checks worth {result.hidden_max:g} more points run when your notebook is graded"
            if result.hidden_max
            else ""
        )
    )
    return 0 if result.public_score == result.public_max else 1


def cmd_doctor(args) -> int:
    """Check what the chosen jobs need, grouped by job; fail only if one of them is not ready."""
    from coursekit import doctor

    try:
        root = _root(args)
    except FileNotFoundError:
        root = None
    # plain `coursekit doctor` asks what `make setup` prepares: grading (the book's MathJax, Chromium
    # and PostgreSQL belong to `doctor book` and `doctor tests`; `doctor all` asks every job)
    jobs = doctor.JOBS if "all" in args.jobs else tuple(args.jobs) or ("grading",)
    ready, not_ready = [], []
    for job, lines in doctor.run_checks(root, jobs).items():
        print(job)
        for good, what, detail in lines:
            print(f"  [{'ok' if good else 'FAIL'}] {what}: {detail}")
        (ready if all(good for good, _, _ in lines) else not_ready).append(job)
    print(
        f"ready for: {', '.join(ready) or 'nothing'}"
        + (f"; NOT ready for: {', '.join(not_ready)}" if not_ready else "")
    )
    return 1 if not_ready else 0


def cmd_pretrain(args) -> int:
    from coursekit import checkpoints

    if args.list or args.name is None:
        folder = Path(args.out) if args.out else checkpoints.checkpoint_dir()
        for name, e in checkpoints.REGISTRY.items():
            present = all(p.is_file() for p in checkpoints.files(name, folder))
            print(f"{name:<16} {e.about}{'' if present else ' [not in ' + str(folder) + ']'}")
        print("regenerate one: coursekit pretrain NAME")
        return 0
    checkpoints.entry(args.name)  # an unknown name fails before any thread setting
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    record = checkpoints.pretrain(args.name, args.out, steps=args.steps)
    metrics = record["metrics"]
    shown = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}
    shown.update(
        {
            f"{k}.{j}": w
            for k, v in metrics.items()
            if isinstance(v, dict) and k != "train"
            for j, w in v.items()
            if isinstance(w, (int, float))
        }
    )
    written = ", ".join(p.name for p in checkpoints.files(args.name, args.out))
    print(f"wrote {written} to {checkpoints.files(args.name, args.out)[0].parent}: {shown}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="coursekit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--course", help="course folder (default: the nearest folder with nbgrader_config.py)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("release", help="regenerate exercises/ from solutions/ with nbgrader")
    p.add_argument("assignments", nargs="*", help="assignment ids (default: all)")
    p.add_argument("--check", action="store_true", help="only report whether exercises/ is current")
    p.set_defaults(func=cmd_release)

    def sandbox_options(p):
        p.add_argument(
            "--sandbox",
            default="auto",
            choices=["auto", "bwrap", "rlimit"],
            help="auto (the default): bubblewrap, and no grading where it does not work; rlimit: no isolation, "
            "only resource limits and no writes outside its scratch folder, only when you name it (check: "
            "without bubblewrap auto runs your notebook in a plain process)",
        )
        p.add_argument(
            "--cell-timeout",
            type=float,
            default=Limits.cell_seconds,
            help="CPU seconds per notebook cell, the cell's process and what it starts (default %(default)s; "
            "its wall clock is capped at 5 times that)",
        )
        p.add_argument(
            "--check-timeout",
            type=float,
            default=Limits.check_seconds,
            help="CPU seconds per grading check, whatever else runs on the machine; the wall clock "
            "stops a check at 5 times that (default %(default)s)",
        )
        p.add_argument(
            "--timeout",
            type=float,
            default=Limits.submission_seconds,
            help="seconds per submission (default %(default)s)",
        )
        p.add_argument(
            "--memory",
            type=float,
            default=Limits.memory / 2**30,
            help="GiB of memory per submission (default %(default)s)",
        )

    p = sub.add_parser(
        "autograde",
        help="collect a folder of submissions, grade them in a sandbox, write feedback, a CSV and a report",
    )
    p.add_argument("submissions", help="folder of <student>.ipynb or <student>/<notebook>.ipynb")
    p.add_argument("--assignment", required=True, help="assignment id, e.g. ch01_attention")
    p.add_argument(
        "--csv", help="where to write every grade of the course (default: grades.csv in the course folder)"
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="students graded at once, each in a process of its own (default 1)",
    )
    p.add_argument(
        "--scheduler",
        help="grade on the workers of this Dask scheduler (tcp://HOST:8786) instead of this machine's "
        "processes; every worker sees the course folder at the same path (README: Large classes)",
    )
    p.add_argument(
        "--fresh", action="store_true", help="regrade everyone, even submissions unchanged since the last run"
    )
    p.add_argument(
        "--times",
        help="CSV of submission times (student,timestamp in ISO 8601) for late penalties; "
        "default: each notebook's modification time in the inbox",
    )
    p.add_argument("--no-feedback", action="store_true", help="skip the HTML feedback")
    sandbox_options(p)
    p.set_defaults(func=cmd_autograde)

    p = sub.add_parser(
        "export", help="write every grade of the course as a CSV: ours, or an LMS's import format"
    )
    p.add_argument(
        "--format",
        choices=["csv", "canvas", "moodle"],
        default="csv",
        help="csv: a row per assignment and student, with status and times; canvas, moodle: their "
        "gradebook import files (not submitted = an empty cell)",
    )
    p.add_argument("--out", help="file to write (default: grades-<format>.csv in the course folder)")
    p.add_argument(
        "--allow-pending",
        action="store_true",
        help="write even while answers wait for a hand grade (their totals lack those points; a warning "
        "names the students); without it the export refuses",
    )
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "formgrader", help="grade written answers by hand: nbgrader's formgrader for the course, on 127.0.0.1"
    )
    p.add_argument("--port", type=int, help="port on 127.0.0.1 (default: a free one)")
    p.set_defaults(func=cmd_formgrader)

    p = sub.add_parser(
        "worker",
        help="grade for `autograde --scheduler`: a Dask worker with the course's sandbox (README: Large classes)",
    )
    p.add_argument("scheduler", help="the Dask scheduler's address, tcp://HOST:8786")
    p.add_argument("--nworkers", type=int, default=1, help="grading processes (default 1; up to the cores)")
    p.add_argument(
        "--dask-args",
        default="",
        help='more options of `dask worker`, in one string: --dask-args="--host 10.0.0.5 --memory-limit 8GB"',
    )
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("report", help="(re)write the class report of an assignment")
    p.add_argument("--assignment", required=True)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "check", help="students: run a notebook and its public checks, as the autograder would"
    )
    p.add_argument("notebook")
    sandbox_options(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser(
        "pretrain", help="list the committed checkpoints, or retrain one from scratch and record its metrics"
    )
    p.add_argument("name", nargs="?", help="bert-small, gpt-char or seq2seq-numbers (none: list them)")
    p.add_argument("--list", action="store_true", help="list the checkpoints and what each is")
    p.add_argument("--out", help="folder to write into (default: the repository's checkpoints/)")
    p.add_argument(
        "--steps", type=int, help="a shortened run of this many steps (a smoke test; not for committing)"
    )
    p.add_argument("--threads", type=int, help="torch threads (the committed checkpoints were trained on 1)")
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser("doctor", help="is this machine ready to grade, build the book, train, run the tests?")
    p.add_argument(
        "jobs",
        nargs="*",
        metavar="JOB",
        help="grading, book, training, tests or all (default: grading); fails only if one of these is not ready",
    )
    p.set_defaults(func=cmd_doctor)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError, RuntimeError, SandboxError) as e:
        print(f"coursekit {args.command}: {_printable(str(e))}", file=sys.stderr)
        return 2
    except (sqlite3.Error, SQLAlchemyError) as e:  # a gradebook nbgrader could not read or write
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        print(
            f"coursekit {args.command}: the gradebook could not be used ({_printable(reason)}); "
            "nothing after this point was recorded",
            file=sys.stderr,
        )
        return 2


def _printable(text: str) -> str:
    from coursekit.inbox import printable

    return printable(text)


if __name__ == "__main__":
    sys.exit(main())
