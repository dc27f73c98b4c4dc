"""The timing rule of checks and cells (``coursekit.sandbox.host._Clock``), without a sandbox.

A computation in the sandbox is timed by the CPU time of its process, which the sandbox reads
from /proc. Here a fake sandbox answers those readings from a script (CPU seconds as a function
of the wall clock, and whether the process is ready to run), so that each case of the rule is
shown in a fraction of a second: spinning through the budget is "an endless loop?", sleeping is
waiting, and being kept from a core until the wall cap is the busy machine's doing.
"""

from __future__ import annotations

import socket
import time

import pytest

from coursekit.autograde import run
from coursekit.sandbox import BUSY, CellFailed, Limits, MachineBusy, RemoteTimeout, SandboxError, host
from coursekit.sandbox.host import CellBusy, Session, _Channel, _Clock

POLL = 0.01  # seconds between readings here (the sandbox's is host.CPU_POLL)
BUDGET = 0.2  # CPU seconds of every computation here


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    monkeypatch.setattr(host, "CPU_POLL", POLL)


class FakeSandbox:
    """Answers ``cpu`` requests from ``script(wall seconds since creation) -> (CPU s, runnable)``;
    ``None`` as CPU seconds: the sandbox does not answer."""

    def __init__(self, script, limits: Limits = Limits(cell_seconds=BUDGET, check_seconds=BUDGET)):
        self.script, self.limits = script, limits
        self.started = time.monotonic()
        self.readings = self.killed = self.resets = 0

    def command(self, header, **_):
        assert header == {"op": "cpu", "pid": 7}
        self.readings += 1
        used, runnable = self.script(time.monotonic() - self.started)
        if used is None:
            raise SandboxError("the sandbox stopped responding (test)")
        return {"ok": True, "seconds": used, "runnable": runnable}, None, []

    def kill(self, pid):
        assert pid == 7
        self.killed += 1

    def reset_after_student(self):
        self.resets += 1
        return None


def spinning(t):
    return t, True


def sleeping(t):
    return 0.001, False


def starved(t):  # ready to run all along, but given a tenth of a core
    return 0.1 * t, True


def slowed(t):  # given half a core: it still computes through its budget before the wall cap
    return 0.5 * t, True


def unreadable(t):
    return None, True


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def stopped(script, sock, **clock):
    """(why the clock stopped the computation, wall seconds it took)."""
    sandbox = FakeSandbox(script)
    clock = _Clock(sandbox, 7, BUDGET, **clock)
    started = time.monotonic()
    why = clock.wait(sock)
    return why, time.monotonic() - started


@pytest.mark.parametrize(
    "script, why, earliest, latest",
    [
        (spinning, "loop", BUDGET, BUDGET + 0.5),
        (slowed, "loop", 2 * BUDGET, 5 * BUDGET),  # CPU budget used up before the cap: a loop
        (sleeping, "idle", BUDGET, BUDGET + 0.5),
        (starved, "busy", 5 * BUDGET, 5 * BUDGET + 0.5),  # the cap, with a fifth of its budget used
        (unreadable, "wall", BUDGET, BUDGET + 0.5),
    ],
)
def test_the_clock_stops_a_computation_for_the_right_reason(pair, script, why, earliest, latest):
    got, took = stopped(script, pair[0])
    assert got == why and earliest <= took <= latest


def test_an_answer_stops_the_clock_without_reading_the_cpu(pair):
    sandbox = FakeSandbox(spinning)
    pair[1].sendall(b"x")
    assert _Clock(sandbox, 7, BUDGET).wait(pair[0]) is None
    assert sandbox.readings == 0  # a quick answer costs no request to the sandbox


def test_the_submission_deadline_before_the_cap_is_no_busy_machine(pair):
    why, took = stopped(starved, pair[0], until=time.monotonic() + 2 * BUDGET)
    assert why == "deadline" and took < 5 * BUDGET


def test_a_notebook_process_is_timed_from_the_cpu_it_had_used_before(pair):
    """A notebook's process has computed before the cell: only what it computes now counts."""
    why, took = stopped(lambda t: (100.0 + 0.5 * t, True), pair[0], base=None)
    assert why == "loop" and took >= 2 * BUDGET


def test_idle_time_counts_only_while_waiting_for_an_answer(pair):
    """A check process answers several requests; while the grader works between them, the process
    sleeps waiting for the next. That is not the student's sleeping."""
    sandbox = FakeSandbox(sleeping)
    started = time.monotonic() - 10 * BUDGET  # the check began long ago
    clock = _Clock(sandbox, 7, BUDGET, started=started, cap=started + 100)
    pair[1].sendall(b"x")
    assert clock.wait(pair[0]) is None
    pair[0].recv(1)
    took = time.monotonic()
    assert clock.wait(pair[0]) == "idle" and time.monotonic() - took >= BUDGET


def channel(script, sock):
    sandbox = FakeSandbox(script)
    session = Session(sandbox, sock, 3)
    started = time.monotonic()
    return _Channel(session, sock, 7, started + BUDGET * host.WALL_FACTOR), sandbox


def test_a_spinning_check_is_an_endless_loop_within_its_cpu_budget(pair):
    ch, sandbox = channel(spinning, pair[0])
    started = time.monotonic()
    with pytest.raises(
        RemoteTimeout, match=r"did not finish within 0\.2 s of CPU time \(an endless loop\?\)"
    ):
        ch._await_answer()
    assert time.monotonic() - started < BUDGET + 0.5 and sandbox.killed == 1


@pytest.mark.parametrize("script", [sleeping, starved, unreadable])
def test_a_check_that_did_not_use_its_cpu_budget_is_no_endless_loop(pair, script):
    ch, sandbox = channel(script, pair[0])
    with pytest.raises(RemoteTimeout) as caught:
        ch._await_answer()
    assert "endless loop" not in str(caught.value) and sandbox.killed == 1
    assert isinstance(caught.value, MachineBusy) == (script is starved)
    if script is sleeping:
        assert "(a sleep, or waiting for something that never comes?)" in str(caught.value)
    if script is starved:
        assert BUSY in str(caught.value)


@pytest.mark.parametrize(
    "script, kind, message",
    [
        (spinning, CellFailed, r"did not finish within 0\.2 s of CPU time \(an endless loop\?\)"),
        (
            sleeping,
            CellFailed,
            r"did not finish within 0\.2 s: it waited 0 s while computing for 0\.0 s \(a sleep",
        ),
        (starved, CellBusy, f"{BUSY} to run it"),
    ],
)
def test_a_cell_is_timed_the_same_way(pair, script, kind, message):
    sandbox = FakeSandbox(script)
    session = Session(sandbox, pair[0], 7)
    with pytest.raises(CellFailed, match=message) as caught:
        session.run_cell("while True: pass", "answer", time.monotonic() + 60)
    assert type(caught.value) is kind and sandbox.resets == 1
    assert ("endless loop" in str(caught.value)) == (script is spinning)


class ScriptedSession:
    def __init__(self, busy: dict[str, int]):
        self.busy = busy

    def run_cell(self, source, label, deadline):
        if self.busy.get(label, 0) > 0:
            self.busy[label] -= 1
            raise CellBusy(f"{BUSY} to run it (it computed for 0.1 s in 9 s)")
        return {"ok": True, "outputs": [], "execution_count": 1}

    def close(self):
        pass


class ScriptedWorker:
    broken = None

    def __init__(self, busy: dict[str, int]):
        self.busy, self.sessions = busy, 0

    def alive(self):
        return True

    def session(self, **_):
        self.sessions += 1
        return ScriptedSession(self.busy)


CELLS = [("c1", "x = 1", "setup"), ("c2", "y = 2", "answer")]


def test_a_cell_stopped_by_a_busy_machine_runs_again_and_is_not_skipped():
    worker = ScriptedWorker({"answer": 1})
    verdict = {"outputs": {}, "notes": []}
    session = run.run_notebook(worker, CELLS, {}, time.monotonic() + 60, verdict)
    assert session is not None and worker.sessions == 2
    assert verdict["notes"] == [] and "busy" not in verdict and set(verdict["outputs"]) == {"c1", "c2"}


def test_a_cell_stopped_by_a_busy_machine_twice_leaves_the_notebook_not_graded():
    worker = ScriptedWorker({"answer": 2})
    verdict = {"outputs": {}, "notes": []}
    assert run.run_notebook(worker, CELLS, {}, time.monotonic() + 60, verdict) is None
    assert verdict["busy"].startswith(f"{BUSY} to run the cell 'answer', twice")
    assert not any("stopped" in n for n in verdict["notes"])  # no cell was skipped as the student's


def test_a_notebook_a_busy_machine_kept_from_running_is_not_graded_and_not_scored(monkeypatch):
    """Busy twice on a cell: every test cell of the notebook is *not graded* (``busy``: the batch
    says so, never caches it, and the instructor runs it again), never an endless loop, and the
    student is told why."""
    from coursekit.autograde import grade
    from coursekit.autograde.plan import load_plan
    from tests.submissions import ROOT

    plan = load_plan(ROOT, "ch01_attention", ROOT / "exercises").notebooks[0]
    raw = (ROOT / "exercises" / "ch01_attention" / "ch01_attention.ipynb").read_bytes()

    def busy_twice(worker, cells, files, deadline, verdict, watch=()):
        verdict["busy"] = f"{BUSY} to run the cell 'answer', twice (...)"

    monkeypatch.setattr(grade, "run_notebook", busy_twice)
    verdict = grade.grade_notebook(FakeSandbox(spinning), plan, raw, {}, time.monotonic() + 60)
    assert "busy" not in verdict and verdict["tests"] and verdict["score"] == 0
    for result in verdict["tests"].values():
        assert result["busy"] and result["failure"].startswith(f"not graded: {BUSY}")
        assert "endless loop" not in result["failure"]
    assert any("not graded yet" in note for note in verdict["notes"])


def test_a_busy_machine_that_stops_a_notebook_run_again_for_a_check_is_the_machines(pair):
    """After the sandbox ended a notebook's process, the next check runs the notebook again; a busy
    machine stopping one of its cells then is the machine's doing: the test cell is graded again
    (``MachineBusy``), not "your notebook's process is gone"."""

    def busy_revival():
        raise CellBusy(f"{BUSY} to run it (it computed for 0.1 s in 9 s)")

    session = Session(FakeSandbox(spinning), pair[0], 7)
    session.dead_because, session.revive = "it used more than 1 GiB of memory", busy_revival
    with pytest.raises(MachineBusy, match=f"this check {BUSY}"):
        session.begin_check("after the notebook's process ended")


def test_the_trusted_side_grades_on_one_torch_thread_and_gives_the_callers_back(monkeypatch):
    """Several grading processes of one machine must not each spin a pool as wide as the machine.
    torch's setting belongs to a thread: a grading thread's is its own, and the caller's comes back."""
    import threading

    import torch

    from coursekit.autograde import grade

    seen = {}

    def fake(name, *_):
        seen[name] = torch.get_num_threads()
        if name == "first":  # while another thread grades, this one's setting is untouched
            torch.set_num_threads(2)
            grade.grade_notebook("second", None, None, {}, 0.0)
            seen["first, after the second"] = torch.get_num_threads()
        return {}

    monkeypatch.setattr(grade, "_grade_notebook", fake)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        grade.grade_notebook("first", None, None, {}, 0.0)
        assert torch.get_num_threads() == 2  # the caller's setting is back
        thread = threading.Thread(target=grade.grade_notebook, args=("in a thread", None, None, {}, 0.0))
        thread.start()
        thread.join(timeout=10)
        assert seen == {"first": 1, "second": 1, "first, after the second": 2, "in a thread": 1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
