"""Fair under load: a check is timed by the CPU time of the student's process, not the wall clock.

A grading machine is often busy (another course grading, a book build). These tests make it busy for
the code they grade, check that correct code keeps its points, that code which spins or sleeps is
still stopped and told which, and that a check a busy machine kept from running is graded again
rather than blamed on the student. Busy means a fifth of a core: where the machine has cgroup v1's
``cpu`` controller and lets the test make a group (:func:`a_fifth_of_a_core`), the test and everything
it starts run in a group of their own whose CPU bandwidth is capped at 20 ms in every 100 ms, which is
what a process sees on a core shared with 4 spinning processes, without the 4 spinning; elsewhere, 4
spinning processes that the test starts and stops share its one core (:func:`spinning_beside`). The
test of a check starved below its neighbours' priority always spins: it needs neighbours. The load
stays on the test: the machine's other cores go on with whatever runs beside it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest

from coursekit.autograde import grade
from coursekit.sandbox import BUSY, CellFailed, Limits, MachineBusy, RemoteTimeout, Worker
from coursekit.sandbox.host import CellBusy
from tests.test_sandbox import KINDS

pytestmark = pytest.mark.slow  # starts sandboxes, and loads both cores for a minute or two

SPIN = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end:\n    pass\n"


@contextmanager
def on_one_core():
    """Run the block, and every process it starts (they inherit it), on one core of those this
    process may use; yields that core. The calling thread's own setting, restored at the end."""
    allowed = os.sched_getaffinity(0)
    core = max(allowed)
    os.sched_setaffinity(0, {core})
    try:
        yield core
    finally:
        os.sched_setaffinity(0, allowed)


@contextmanager
def spinning_beside(core: int, spinning: int = 4):
    """``spinning`` processes spinning on ``core`` beside the test, killed when the block ends."""
    # each in a session of its own, as another course's processes would be: with the kernel's
    # autogroup scheduling, processes of one session share one slice of the cores
    spinners = [
        subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True) for _ in range(spinning)
    ]
    try:
        for p in spinners:
            os.sched_setaffinity(p.pid, {core})
        time.sleep(0.5)
        yield
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait()


#: where cgroup v1 mounts its ``cpu`` controller
CPU_CONTROLLER = Path("/sys/fs/cgroup/cpu")
#: the bandwidth of a busy machine: 20 ms of CPU in every 100 ms, a core shared five ways
PERIOD_US, QUOTA_US = 100_000, 20_000


def _cpu_group() -> Path | None:
    """This process's group of cgroup v1's ``cpu`` controller, if this user may make groups in it."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            group = CPU_CONTROLLER / path.lstrip("/")
            writable = os.access(group, os.W_OK) and (group / "cpu.cfs_quota_us").is_file()
            return group if writable else None
    return None


@contextmanager
def a_fifth_of_a_core():
    """Run the block, and every process it starts (they inherit the group), in a cgroup of its own
    capped at a fifth of a core; yields ``False`` without one (no cgroup v1 ``cpu``, or no right to
    make a group), ``True`` otherwise. At the end this process, and what it started that still
    runs, go back to the group they came from, and the group is removed."""
    parent = _cpu_group()
    if parent is None:
        yield False
        return
    group = parent / f"coursekit-busy-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(QUOTA_US))
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        if group.is_dir():
            group.rmdir()
        yield False
        return
    try:
        yield True
    finally:
        (parent / "cgroup.procs").write_text(str(os.getpid()))
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                (parent / "cgroup.procs").write_text(pid)
            except ProcessLookupError:  # it ended meanwhile
                pass
        group.rmdir()


@contextmanager
def busy_machine():
    """A fifth of a core for the block and what it starts: a capped group of its own, or else one
    core shared with 4 spinning processes."""
    with a_fifth_of_a_core() as capped:
        if capped:
            yield
            return
    with on_one_core() as core, spinning_beside(core):
        yield


def test_a_fifth_of_a_core_slows_what_runs_in_it_and_leaves_no_group_behind(monkeypatch):
    """0.3 s of CPU take at least a second in the capped group (1.5 s at a fifth of a core); after
    it this process is back in its group and the capped one is gone. Without a group to make, the
    block runs uncapped and is told so (the tests then spin beside it)."""
    parent = _cpu_group()
    with a_fifth_of_a_core() as capped:
        if not capped:
            pytest.skip("no cgroup v1 cpu controller this user may make groups in: the tests spin instead")
        inside = _cpu_group()
        started, cpu = time.monotonic(), time.process_time()
        while time.process_time() - cpu < 0.3:
            pass
        wall = time.monotonic() - started
    assert inside.parent == parent and inside.name.startswith("coursekit-busy-")
    assert wall > 1.0, f"0.3 s of CPU took {wall:.2f} s: the group did not cap it"
    assert _cpu_group() == parent and not inside.exists()
    monkeypatch.setattr(sys.modules[__name__], "_cpu_group", lambda: None)
    with a_fifth_of_a_core() as capped:
        assert capped is False


@pytest.mark.parametrize("kind", KINDS)
def test_a_check_is_timed_by_its_cpu_not_by_the_load_beside_it(kind):
    """On a busy machine (a fifth of a core), a check that needs about 0.6 s of CPU takes
    several times that on the wall clock: it is within its 1.5 s CPU budget and passes. A check that
    spins is still stopped, as an endless loop once it used its budget (or, kept from a core until
    the wall cap, as the machine's doing); one that sleeps is stopped and told it waited, not that
    it looped. A cell is timed the same way: 0.6 s of CPU within a 1.5 s budget."""
    limits = Limits(cell_seconds=1.5, check_seconds=1.5)
    with busy_machine(), Worker(kind, limits) as worker:
        session = worker.session()
        deadline = time.monotonic() + 300
        code = (
            "import time\n"
            "def work(n):\n    t = time.process_time()\n"
            "    while time.process_time() - t < n:\n        pass\n    return n\n"
            "def spin(x):\n    while True:\n        pass\n"
            "def sleep(x):\n    time.sleep(1000)\n"
        )
        assert session.run_cell(code, "answer", deadline)["ok"]
        started = time.monotonic()
        assert session.run_cell("work(0.6)", "a cell that needs 0.6 s of CPU", deadline)["ok"]
        assert time.monotonic() - started > 1.5  # longer than the cell's budget on the wall clock
        session.begin_check("needs 0.6 s of CPU")
        started = time.monotonic()
        assert session.remote("work")(0.6) == 0.6
        assert time.monotonic() - started > 1.5  # longer than the budget on the wall clock: load
        session.end_check()
        session.begin_check("spins")
        with pytest.raises(RemoteTimeout) as spun:
            session.remote("spin")(1)
        # A spin gets its 1.5 s of CPU before the 7.5 s cap where it gets a fifth of a core; it shares
        # that fifth with the sandbox's own processes (and, spinning beside it, other programs on the
        # machine, a book build, can take more): then the cap stops it, and the machine takes the blame.
        if isinstance(spun.value, MachineBusy):  # it had used less than its 1.5 s (printed to 0.1 s)
            assert float(re.search(r"ran (\d+\.\d) s of CPU", str(spun.value))[1]) <= 1.5
        else:
            assert "did not finish within 1.5 s of CPU time (an endless loop?)" in str(spun.value)
        session.end_check()
        session.begin_check("sleeps")
        with pytest.raises(
            RemoteTimeout, match=r"waited \d+ s while computing for 0\.\d s \(a sleep"
        ) as caught:
            session.remote("sleep")(1)
        assert not isinstance(caught.value, MachineBusy)
        session.end_check()
        session.close()


@pytest.mark.parametrize("kind", [k for k in KINDS if k == "bwrap"])  # rlimit's Landlock: no /proc writes
def test_a_check_kept_waiting_by_a_busy_machine_is_not_the_students(kind):
    """A check process that barely gets a core (it lowers its own priority, and its session's, below
    the spinning processes) reaches the wall cap having used little CPU while it waited to run: the machine was
    busy, and it says so (``MachineBusy``), never "an endless loop". A starved cell likewise
    (``CellBusy``: the notebook runs again)."""
    limits = Limits(cell_seconds=1.0, check_seconds=1.0)
    with on_one_core() as core, Worker(kind, limits) as worker, spinning_beside(core):
        session = worker.session()
        deadline = time.monotonic() + 300
        code = (
            "import os, time\ndef starved(n):\n    os.nice(19)\n"
            "    with open('/proc/self/autogroup', 'w') as f:\n        f.write('19')\n"  # its session's share
            "    t = time.process_time()\n"
            "    while time.process_time() - t < n:\n        pass\n    return n\n"
        )
        assert session.run_cell(code, "answer", deadline)["ok"]
        session.begin_check("starved")
        with pytest.raises(MachineBusy, match=BUSY) as caught:
            session.remote("starved")(0.9)
        assert "endless loop" not in str(caught.value)
        session.end_check()
        with pytest.raises(CellFailed, match=BUSY) as stopped:  # a cell, the same way
            session.run_cell("starved(0.9)", "a starved cell", deadline)
        assert type(stopped.value) is CellBusy and "endless loop" not in str(stopped.value)
        session.close()


def test_a_cell_stopped_by_load_is_graded_again_and_never_scored_as_the_students(monkeypatch):
    """``_grade_cell`` grades a cell again when a busy machine stopped one of its checks; twice, the
    cell is *not graded* (and the batch says so), never 0 for the student."""
    busy = {
        "passed": False,
        "score": 0.0,
        "failure": "x",
        "failed_checks": [["p: c", f"this check {BUSY} (...)"]],
    }
    good = {"passed": True, "score": 2.0, "failure": None}
    answers = iter([dict(busy), dict(good)])
    monkeypatch.setattr(grade, "_grade_cell_once", lambda *a, **k: next(answers))
    assert grade._grade_cell(None, [], 0, False, 2.0, None) == good
    monkeypatch.setattr(grade, "_grade_cell_once", lambda *a, **k: dict(busy))
    result = grade._grade_cell(None, [], 0, False, 2.0, None)
    assert result["busy"] and result["score"] == 0 and result["failure"].startswith("not graded: ")
    assert "endless loop" not in result["failure"]


@pytest.mark.bubblewrap
def test_correct_alternatives_keep_full_marks_on_a_busy_machine(tmp_path):
    """Two notebooks holding every correct alternative of Exercise 1's catalogue (the first and the
    second of each part; a part without one keeps the reference's answer), autograded one after the
    other with a 2 s CPU budget per check on a busy machine (a fifth of a core): full marks, as on a
    quiet machine, after a grading that waited for a core most of its time. (The reference itself is
    graded on a quiet machine by test_autograde.py; the pool of --jobs 2 by test_autograde.py and
    test_adversarial.py. Alone on a quiet machine this test took 84 CPU-seconds with 4 spinning
    processes, 27 in a capped group.)"""
    from coursekit import autograde
    from tests.submissions import course_folder, filled, points
    from tests.test_grading_ch01_attention import ALTERNATIVES

    assignment = "ch01_attention"
    root, inbox = course_folder(tmp_path)
    reference = filled(assignment)
    by_part: dict[str, list[str]] = {}
    for gid, _, source in ALTERNATIVES:
        by_part.setdefault(gid, []).append(source)
    for i in range(2):
        nb = nbformat.from_dict(nbformat.from_dict(reference))
        for cell in nb.cells:
            choices = by_part.get(cell.metadata.get("nbgrader", {}).get("grade_id"), [])
            if choices:
                cell.source = choices[min(i, len(choices) - 1)]
        nbformat.write(nb, inbox / f"alternatives{i + 1}.ipynb")
    auto, _ = points(assignment)
    with busy_machine():
        _, results = autograde.grade_inbox(
            root, assignment, inbox, limits=Limits(check_seconds=2.0), feedback=False, jobs=1
        )
    assert {r.student: (r.score, r.error) for r in results} == {
        s: (auto, None) for s in ("alternatives1", "alternatives2")
    }
    # and the machine was busy: wall seconds over CPU seconds were 0.6 on a quiet machine (the sandbox
    # computes beside this process), 3.6 on a fifth of a core (not 5: the sandbox's start counts its
    # CPU seconds, not its wall seconds)
    wall = sum(r.stages[stage][0] for r in results for stage in ("grade", "record"))
    cpu = sum(seconds for r in results for _, seconds in r.stages.values())
    assert wall > 2 * cpu, [r.stages for r in results]
