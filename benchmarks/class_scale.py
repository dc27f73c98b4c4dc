"""A whole class graded end to end at every ``--jobs``: is every grade right, and what does not scale?

    .venv/bin/python benchmarks/class_scale.py                 # 200 students of Exercise 1, --jobs 1..cores
    .venv/bin/python benchmarks/class_scale.py --quick         # 8 students, one of each kind, --jobs 1
    .venv/bin/python benchmarks/class_scale.py --students 500 --jobs 1 2 4 --json out.json

The class is drawn with a fixed seed (:func:`draw_class`) from what students really hand in: full
marks, one or two of the catalogued mistakes (``tests/mutants/``), half-finished, untouched, broken
JSON, a notebook under another name in a folder, and hostile cases of ``tests/adversarial.py``. The
expected grade of each student follows from the catalogue: the same graders run in this process, with
the course's secret, on the student's answers (:func:`expected_score`); a hostile case's is written
beside it in ``tests/adversarial.py``.

Each ``--jobs C`` runs the whole cycle in a process of its own, confined to C cores of this machine
(``--jobs 1``: one core, sandbox included), on a fresh copy of the course (the same secret):
collect, grade, record, feedback (one task per student, ``coursekit.autograde.batch``), the class
report and the export. It reports per stage the wall and CPU seconds per student (``sandbox``: what
ran in the sandbox while the student was graded, the student's code and the checks), the serial
fraction (Amdahl's: fitted to the wall times of the runs on 1, 2, ... cores, and from the busy cores
of the widest run; the larger counts, see :func:`summarise`), the projected time for 1,000 and
10,000 students on 16 and 64 cores, and, last,
``class of N: graded as expected K/N; serial fraction F; cores busy U at --jobs C``
(U: the CPU seconds of every process of the run, sandboxes included, over C x wall seconds; the
cores' own counters, printed beside, check that sum on a quiet machine).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ASSIGNMENT = "ch01_attention"
#: hostile cases of tests/adversarial.py that need nothing but the course folder (no listener) and
#: finish quickly (a case that runs into a time limit measures the limit, not the grader)
HOSTILE = (
    "invalid_json",
    "not_a_notebook",
    "os_exit_in_answer",
    "patch_torch_checkers",
    "lying_tensor_subclass",
    "nan_output",
    "hard_coded_public_answers",
    "answer_deleted",
)
#: how the class is drawn: kind -> share of the students
KINDS = {
    "full": 0.30,
    "one_mistake": 0.25,
    "two_mistakes": 0.12,
    "half_finished": 0.10,
    "untouched": 0.05,
    "broken_json": 0.05,
    "renamed": 0.08,
    "hostile": 0.05,
}
STAGES = ("collect", "grade", "sandbox", "record", "feedback", "report", "export")


@dataclass(frozen=True)
class Student:
    name: str
    kind: str
    detail: str  # the mistakes, the parts answered, the hostile case
    expected: float
    data: bytes  # the notebook file's bytes
    filename: str | None = None  # a folder's notebook under this name; None: inbox/<name>.ipynb


def expected_score(assignment: str, nb, secret: bytes) -> float:
    """The autograded points ``nb`` earns, graded in this process by the same graders (no sandbox, no
    nbgrader) with the course's ``secret`` and credit policy: what the class run must give."""
    from coursekit.autograde.credit import Credit
    from coursekit.course import nbgrader_api
    from coursekit.grading import core, harness

    answers = {
        c.metadata["nbgrader"]["grade_id"]: c.source
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("solution") and c.cell_type == "code"
    }
    credit = Credit.from_config(nbgrader_api(ROOT).config)
    token = core.SECRET.set(secret)
    try:
        ns = harness.namespace(assignment, answers, release=True)
        total = 0.0
        for part in harness.parts(assignment):
            for outcome in harness.run_tests(part, ns):
                points = outcome.test.points
                total += points if outcome.failure is None else credit.score(points, list(outcome.clauses))
        return total
    finally:
        core.SECRET.reset(token)


def draw_class(
    n: int,
    seed: int,
    course: Path,
    assignment: str = ASSIGNMENT,
    *,
    scored: bool = True,
    every_kind: bool = False,
) -> list[Student]:
    """``n`` students drawn with ``seed`` (see the module's docstring), graded in advance by
    :func:`expected_score` with the secret of ``course`` (unless not ``scored``: their expected
    scores are then NaN). ``every_kind``: the kinds in turn, one of each first, not drawn."""
    import importlib

    import nbformat

    from coursekit.autograde.plan import course_secret
    from coursekit.grading import harness
    from tests import adversarial
    from tests.submissions import ROOT as REPO
    from tests.submissions import filled, load, replace_definition

    rng = random.Random(seed)
    secret = course_secret(course)
    reference = filled(assignment)
    release = load(REPO / "exercises" / assignment / f"{assignment}.ipynb")
    mutants = importlib.import_module(f"tests.mutants.{assignment}").MUTANTS
    parts = harness.parts(assignment)
    hostile = {c.name: c for c in adversarial.CASES if c.name in HOSTILE}
    ctx = adversarial.Context(course=str(course), port=9, secret="not-a-secret")
    if every_kind:
        kinds = [list(KINDS)[i % len(KINDS)] for i in range(n)]
    else:
        kinds = rng.choices(list(KINDS), weights=list(KINDS.values()), k=n)
    cache: dict[str, float] = {}  # a notebook's text -> its expected score (many students coincide)

    def scored(nb) -> tuple[float, bytes]:
        text = nbformat.writes(nb)
        if text not in cache:
            cache[text] = expected_score(assignment, nb, secret) if scored else float("nan")
        return cache[text], text.encode()

    students = []
    for i, kind in enumerate(kinds):
        name = f"s{i:04d}_{kind}"
        filename = None
        if kind in ("full", "renamed"):
            nb, detail = reference, "the instructor's answers"
            filename = "my attempt.ipynb" if kind == "renamed" else None
        elif kind in ("one_mistake", "two_mistakes"):
            chosen = []
            for m in rng.sample(mutants, len(mutants)):
                if all(m.part != c.part and m.target != c.target for c in chosen):
                    chosen.append(m)
                if len(chosen) == (1 if kind == "one_mistake" else 2):
                    break
            nb = reference
            for m in chosen:
                nb = replace_definition(nb, m.target, m.source)
            detail = " + ".join(m.name for m in chosen)
        elif kind == "half_finished":
            k = rng.randrange(1, len(parts))
            nb = release
            for part in parts[:k]:
                try:
                    nb = replace_definition(nb, part.name, part.source)
                except KeyError:  # a written answer: no definition to fill in
                    pass
            detail = f"the first {k} of {len(parts)} parts answered"
        elif kind == "untouched":
            nb, detail = release, "the release as it was handed out"
        if kind == "broken_json":
            data, expected, detail = (
                nbformat.writes(reference).encode()[: rng.randrange(100, 5000)],
                0.0,
                "cut",
            )
        elif kind == "hostile":
            case = hostile[rng.choice(sorted(hostile))]
            made = case.make(ctx)
            data = made if isinstance(made, bytes) else nbformat.writes(made).encode()
            expected, detail = float(case.expected), case.name
        else:
            expected, data = scored(nb)
        students.append(Student(name, kind, detail, expected, data, filename))
    return students


def write_inbox(students: list[Student], inbox: Path) -> None:
    for s in students:
        if s.filename is None:
            (inbox / f"{s.name}.ipynb").write_bytes(s.data)
        else:
            (inbox / s.name).mkdir()
            (inbox / s.name / s.filename).write_bytes(s.data)


def _cores_busy(cores: list[int]) -> float:
    """Seconds the CPUs ``cores`` have spent on anything but idling, from the kernel's counters
    (``/proc/stat``): every process on them, the run's and any other."""
    ticks = 0
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
                user, nice, system, idle, iowait = (int(x) for x in fields[:5])
                ticks += sum(int(x) for x in fields[:8]) - idle - iowait
    return ticks / os.sysconf("SC_CLK_TCK")


def _cpu_of_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one_run(course: Path, jobs: int, assignment: str) -> dict:
    """The whole cycle on ``course`` at ``jobs`` (in this process and its children): per stage, the
    total wall and CPU seconds; per student, the score."""
    from coursekit import exports, report
    from coursekit.autograde import batch
    from coursekit.autograde.record import timed
    from coursekit.sandbox import Limits, choose_kind

    totals: dict[str, list[float]] = {}
    started = time.perf_counter()
    collected = {}

    def collect_timed(*args, **kwargs):
        with timed(totals, "collect"):
            found = collect(*args, **kwargs)
        collected["n"] = len(found.students)
        return found

    from coursekit import inbox as inbox_module

    collect, inbox_module.collect = inbox_module.collect, collect_timed
    try:
        _, results = batch.grade_inbox(course, assignment, course / "inbox", jobs=jobs, limits=Limits())
    finally:
        inbox_module.collect = collect
    grading_wall = time.perf_counter() - started - totals["collect"][0]
    with timed(totals, "report"):
        report.write_report(course, assignment)
    with timed(totals, "export"):
        exports.export(course, course / "grades.csv")
    for r in results:
        for stage, (wall, cpu) in r.stages.items():
            was = totals.get(stage, [0.0, 0.0])
            totals[stage] = [was[0] + wall, was[1] + cpu]
    return {
        "jobs": jobs,
        "sandbox": choose_kind("auto"),  # the kind grade_inbox graded in (its default, "auto")
        "wall": time.perf_counter() - started,
        "grading_wall": grading_wall,
        "stages": totals,
        "scores": {r.student: r.score for r in results},
        "errors": {r.student: r.error for r in results if r.error},
    }


def measure(template: Path, jobs: int, assignment: str, work: Path) -> dict:
    """:func:`one_run` in a fresh process on a fresh copy of ``template``, confined to ``jobs`` of
    this machine's cores (it and every process it starts), with the CPU seconds of every process of
    the run: those the run's processes report when they are reaped, plus those of the sandboxes,
    which bubblewrap's PID namespace hides from them (each task reads them, see
    :meth:`coursekit.sandbox.Worker.cpu_seconds`). The cores' own counters check the sum."""
    course = work / f"jobs{jobs}"
    shutil.copytree(template, course)
    out = work / f"jobs{jobs}.json"
    cores = sorted(os.sched_getaffinity(0))[:jobs]
    before, busy = _cpu_of_children(), _cores_busy(cores)
    wall = time.perf_counter()
    subprocess.run(
        [sys.executable, __file__, "--one-run", str(course), "--jobs", str(jobs), "--assignment", assignment],
        check=True,
        stdout=open(out, "w"),  # noqa: SIM115 (closed when the process exits)
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"},
        preexec_fn=lambda: os.sched_setaffinity(0, cores),
    )
    result = json.loads(out.read_text())
    result["process_wall"] = time.perf_counter() - wall
    result["cores"] = len(cores)
    result["cpu"] = _cpu_of_children() - before
    if result.get("sandbox") == "bwrap":  # an rlimit sandbox is a child this process reaps: counted above
        result["cpu"] += result["stages"].get("sandbox", [0.0, 0.0])[1]
    result["cores_counted_cpu"] = _cores_busy(cores) - busy
    return result


def serial_fraction(runs: list[dict]) -> float:
    """Amdahl's serial fraction s, fitted by least squares to T(c) = T(1) (s + (1 - s) / c) over the
    runs' wall times, each run on c cores (exact for two runs)."""
    t1 = next(r["process_wall"] for r in runs if r["cores"] == 1)
    xs = [(1 - 1 / r["cores"], r["process_wall"] / t1 - 1 / r["cores"]) for r in runs if r["cores"] > 1]
    if not xs:
        return float("nan")
    return max(0.0, min(1.0, sum(x * y for x, y in xs) / sum(x * x for x, _ in xs)))


def summarise(runs: list[dict], n: int) -> dict:
    """The serial fraction, two ways, and the projections made with the larger (none of the three
    without a run on more than one core, as in ``--quick``).

    * ``walls``: :func:`serial_fraction`. It sees whatever slows the wider runs (their cores contending
      for memory or the kernel), but also the machine's own drift between the runs, which on a shared
      virtual machine is as large as what it measures: two ``--jobs 1`` runs of this benchmark half
      an hour apart took 917 s and 1,046 s, their record and feedback stages (code that did not
      change between them) 15% slower in the second.
    * ``busy``: from the widest run alone, s = (1/U - 1) / (c - 1), U its busy cores: the share of the
      work that left cores idle, free of drift but blind to contention. The runs' CPU seconds per
      student, printed side by side, show contention where there is any.
    """
    widest = max(runs, key=lambda r: r["cores"])
    if widest["cores"] == 1:
        return {
            "serial_fraction": None,
            "serial_fraction_walls": None,
            "serial_fraction_busy": None,
            "projected_seconds": {},
        }
    walls = serial_fraction(runs)
    busy = (
        (1 / widest["busy"] - 1) / (widest["cores"] - 1)
        if widest["cores"] > 1 and widest["busy"]
        else float("nan")
    )
    s = max(walls, busy)
    t1 = next(r["process_wall"] for r in runs if r["cores"] == 1) / n
    return {
        "serial_fraction": s,
        "serial_fraction_walls": walls,
        "serial_fraction_busy": busy,
        "projected_seconds": {
            f"{students} students on {c} cores": students * t1 * (s + (1 - s) / c)
            for students in (1_000, 10_000)
            for c in (16, 64)
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--students", type=int, default=200)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="one student of each kind, --jobs 1 only: checks that it runs (no serial fraction)",
    )
    ap.add_argument(
        "--jobs", type=int, nargs="+", help="default: 1 .. the machine's cores (each run on as many)"
    )
    ap.add_argument("--assignment", default=ASSIGNMENT)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the result as JSON to this file")
    ap.add_argument("--one-run", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_run:
        print(json.dumps(one_run(Path(args.one_run), args.jobs[0], args.assignment)))
        return 0
    n = len(KINDS) if args.quick else args.students
    cores = len(os.sched_getaffinity(0))
    # quick: one run; every kind graded as expected on one core (the pool of --jobs 2 is tested by the
    # suite's own class, tests/test_autograde.py, and a second run doubled the quick mode's cost)
    jobs = sorted(set(args.jobs or ([1] if args.quick else range(1, cores + 1))))
    if 1 not in jobs:
        jobs = [1, *jobs]
    from tests.submissions import course_folder

    with tempfile.TemporaryDirectory(prefix="coursekit-class-") as tmp:
        work = Path(tmp)
        template, inbox = course_folder(work, "template")
        drawn = time.perf_counter()
        students = draw_class(n, args.seed, template, args.assignment, every_kind=args.quick)
        drawn = time.perf_counter() - drawn
        write_inbox(students, inbox)
        runs = [measure(template, j, args.assignment, work) for j in jobs]
    expected = {s.name: s.expected for s in students}
    for r in runs:
        r["as_expected"] = sum(abs(r["scores"].get(s, -1) - e) < 1e-6 for s, e in expected.items())
        r["wrong"] = {
            s: [r["scores"].get(s), e] for s, e in expected.items() if abs(r["scores"].get(s, -1) - e) >= 1e-6
        }
        r["busy"] = r["cpu"] / (r["cores"] * r["process_wall"]) if r["process_wall"] else 0.0
    summary = summarise(runs, n)
    s, projections = summary["serial_fraction"], summary["projected_seconds"]
    result = {
        "assignment": args.assignment,
        "students": n,
        "kinds": {k: sum(st.kind == k for st in students) for k in KINDS},
        "seconds_to_draw_and_grade_in_process": drawn,
        "runs": runs,
        **summary,
    }
    last = runs[-1]
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{n} students of {args.assignment}: {result['kinds']}")
    for r in runs:
        print(
            f"\n--jobs {r['jobs']} on {r['cores']} core(s): {r['process_wall']:.1f} s wall, {r['cpu']:.1f} s CPU "
            f"(the cores' counters: {r['cores_counted_cpu']:.1f} s), busy {r['busy']:.0%}"
        )
        print(f"  {'stage':<9} {'wall s/student':>15} {'CPU s/student':>14}")
        for stage in STAGES:
            wall, cpu = r["stages"].get(stage, [0.0, 0.0])
            shown = f"{wall / n:>15.3f}" if stage != "sandbox" else f"{'(in grade)':>15}"
            print(f"  {stage:<9} {shown} {cpu / n:>14.3f}")
        for student, (got, want) in list(r["wrong"].items())[:10]:
            print(f"  NOT AS EXPECTED {student}: {got} (expected {want})")
    one = next(r for r in runs if r["cores"] == 1)
    for r in runs:
        if r is not one:
            print(f"CPU seconds per student, --jobs {r['jobs']} / --jobs 1: {r['cpu'] / one['cpu']:.3f}")
    if s is None:
        print("serial fraction: needs a run on more than one core (--jobs 1 2)")
    else:
        print(
            f"serial fraction (Amdahl): {summary['serial_fraction_walls']:.3f} fitted to the runs' wall "
            f"times, {summary['serial_fraction_busy']:.3f} from the busy cores of the widest run; the "
            f"larger: {s:.3f}"
        )
    for what, seconds in projections.items():
        print(f"projected: {what}: {seconds / 60:.0f} min")
    print(
        f"class of {n}: graded as expected {last['as_expected']}/{n}"
        + ("" if s is None else f"; serial fraction {s:.3f}")
        + f"; cores busy {last['busy']:.0%} at --jobs {last['jobs']}"
    )
    return 0 if all(r["as_expected"] == n for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
