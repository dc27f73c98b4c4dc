"""Grading by hand through ``coursekit formgrader``, over its HTTP interface as its pages use it.

One student autograded; the instructor grades the written answer and comments on it; the
formgrader's "generate feedback" writes the course's page (hidden tests hidden, a
Content-Security-Policy, the comment as text), its "autograde" and "generate" buttons are refused
without touching anything (nbgrader's own steps would run the student's code outside the sandbox
and rewrite the release), and a ``--fresh`` re-run keeps the hand grade, the comment and the status.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import html
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from coursekit import cli
from coursekit import formgrader as course_formgrader
from tests.submissions import ROOT, course_folder, filled, jupyter_env, points, running_formgrader

ASSIGNMENT = "ch01_attention"
WRITTEN = "written_scaling"  # Exercise 1's written answer (a markdown grade cell)
STUDENT = "reference"
AUTO, MANUAL = points(ASSIGNMENT)
#: the source of Exercise 1's hidden test cells (one call into the course's graders)
HIDDEN_CALL = "grader.grade_"
COMMENT = "Right idea.\n<img src=x onerror=alert(1)> <b>but</b> say why the variance grows."


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root, inbox = course_folder(tmp_path_factory.mktemp("manual"))
    shutil.copytree(ROOT / "_vendor" / "mathjax", root / "_vendor" / "mathjax")  # make mathjax
    nbformat.write(filled(ASSIGNMENT), inbox / f"{STUDENT}.ipynb")
    assert cli.main(["--course", str(root), "autograde", str(inbox), "--assignment", ASSIGNMENT]) == 0
    return root, inbox


def test_generating_feedback_from_the_formgrader_takes_names_never_paths(tmp_path):
    """The formgrader's "generate feedback" gets its assignment and student from the address."""
    root, _ = course_folder(tmp_path)
    for assignment, student in (("..", None), ("ch01_attention", "../../etc"), ("ch01_attention", ".hidden")):
        answer = course_formgrader.feedback(root, assignment, student)
        assert answer["success"] is False and "not an assignment or student id" in answer["error"]
    answer = course_formgrader.feedback(root, "ch01_attention", "nobody")  # a name, but nothing graded
    assert answer["success"] is False and "run coursekit autograde first" in answer["error"]
    assert not (root / "feedback").exists()


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started that still run (its own ``/proc`` entry, no other process's)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


@pytest.mark.slow  # starts a Jupyter server (seconds)
def _state(pid: int) -> str:
    """What a process is doing, for a failure message: its state, where it sleeps in the kernel, the
    signals it has pending, blocks and catches, and the same for each of its threads."""
    rows = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir()) if Path(f"/proc/{pid}").exists() else []:
        status = dict(
            line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line
        )
        wchan = (task / "wchan").read_text() if (task / "wchan").exists() else "?"
        keys = ("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
        rows.append(f"{task.name} {wchan} " + " ".join(f"{k}={status.get(k, '?').strip()}" for k in keys))
    return f"pid {pid}: " + ("; ".join(rows) or "gone")


def test_the_command_serves_the_formgrader_on_loopback_with_a_token_until_ctrl_c(tmp_path):
    """``coursekit formgrader --port N`` prints the address with its token, on 127.0.0.1 and that port;
    the API answers with the token only; Ctrl-C stops the server and the command exits 0."""
    import socket

    import requests

    root, _ = course_folder(tmp_path)
    shutil.copytree(ROOT / "_vendor" / "mathjax", root / "_vendor" / "mathjax")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # As from a terminal, where Ctrl-C is not ignored: a suite started as a background job of a
    # script ignores SIGINT, and a child inherits that; one whose handler is caught gets the default
    caught = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(  # the `coursekit` command, as a process of its own that Ctrl-C can reach
            [sys.executable, "-m", "coursekit.cli", "--course", str(root), "formgrader", "--port", str(port)],
            stdout=subprocess.PIPE,
            text=True,
            env=jupyter_env(tmp_path / "jupyter"),
        )
    finally:
        signal.signal(signal.SIGINT, caught)
    servers: list[int] = []
    try:
        first = proc.stdout.readline()
        prefix = f"http://127.0.0.1:{port}/formgrader?token="
        assert prefix in first, first
        url = first.split("open ", 1)[1].strip()
        token = url.split("token=", 1)[1]
        assert len(token) >= 32
        status = f"http://127.0.0.1:{port}/formgrader/api/status"
        deadline = time.monotonic() + 90
        while True:
            try:
                reply = requests.get(status, headers={"Authorization": f"token {token}"}, timeout=2)
                if reply.status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the formgrader did not start"
            time.sleep(0.3)
        assert reply.json() == {"status": True}
        anonymous = requests.get(status, timeout=5, allow_redirects=False)
        assert anonymous.status_code in (302, 403), anonymous.status_code
        wrong = requests.get(
            status, headers={"Authorization": "token " + "0" * 32}, timeout=5, allow_redirects=False
        )
        assert wrong.status_code in (302, 403), wrong.status_code
        servers = _children(proc.pid)  # the Jupyter server, a session of its own
        proc.send_signal(signal.SIGINT)
        # the command gives the server 10 s to shut down, then kills it; a loaded machine adds to that
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"Ctrl-C did not stop the command in 60 s: {_state(proc.pid)}; its server: "
                        f"{[_state(pid) for pid in servers]}")  # fmt: skip
        assert code == 0
        with pytest.raises(requests.ConnectionError):  # the server went with it
            requests.get(status, timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            for pid in servers:  # a command killed here never stopped its server
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def server(course, tmp_path_factory):
    """``coursekit formgrader`` on the course (a free port of 127.0.0.1 it picks), with Jupyter's folders
    in a temporary folder; a requests session logged in with the printed token."""
    root, _ = course
    with running_formgrader(root, tmp_path_factory.mktemp("jupyter")) as (session, api, url):
        assert url.startswith("http://127.0.0.1:") and "/formgrader?token=" in url
        yield session, api


def _ids(session, api) -> tuple[dict, dict]:
    (sub,) = [
        s
        for s in session.get(f"{api}/submitted_notebooks/{ASSIGNMENT}/{ASSIGNMENT}").json()
        if s["student"] == STUDENT
    ]
    grades = {g["name"]: g for g in session.get(f"{api}/grades", params={"submission_id": sub["id"]}).json()}
    comments = {
        c["name"]: c for c in session.get(f"{api}/comments", params={"submission_id": sub["id"]}).json()
    }
    return grades, comments


def _grades_csv(root) -> dict:
    with open(root / "grades.csv", newline="") as f:
        (row,) = [
            r for r in csv.DictReader(f) if r["student_id"] == STUDENT and r["assignment"] == ASSIGNMENT
        ]
    return row


def _tree(folder) -> dict | None:
    if not folder.exists():
        return None
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow  # autogrades a notebook in the sandbox twice and starts a Jupyter server (half a minute)
@pytest.mark.bubblewrap
def test_a_hand_grade_and_comment_reach_the_feedback_and_survive_a_fresh_rerun(course, server, capsys):
    root, inbox = course
    session, api = server
    page = root / "feedback" / STUDENT / ASSIGNMENT / f"{ASSIGNMENT}.html"

    # autograded: the written answer waits, and everything that counts says so
    assert _grades_csv(root)["pending_hand_grades"] == "1"
    assert cli.main(["--course", str(root), "export", "--format", "canvas"]) == 2
    assert f"({STUDENT}: 1)" in capsys.readouterr().err and not (root / "grades-canvas.csv").exists()
    assert "waiting for your instructor" in page.read_text()

    # the instructor grades it and comments, as the grading page does
    grades, comments = _ids(session, api)
    assert grades[WRITTEN]["needs_manual_grade"] and grades[WRITTEN]["auto_score"] is None
    reply = session.put(f"{api}/grade/{grades[WRITTEN]['id']}", json={"manual_score": MANUAL / 2})
    assert reply.status_code == 200, reply.text
    reply = session.put(f"{api}/comment/{comments[WRITTEN]['id']}", json={"manual_comment": COMMENT})
    assert reply.status_code == 200, reply.text

    # the formgrader's "generate feedback" (one student, then the class) writes the course's page
    for route in (
        f"assignment/{ASSIGNMENT}/{STUDENT}/generate_feedback",
        f"assignment/{ASSIGNMENT}/generate_feedback",
    ):
        page.unlink()
        reply = session.post(f"{api}/{route}")
        assert reply.status_code == 200 and reply.json()["success"], reply.text
        text = page.read_text()
        assert html.escape(COMMENT, quote=False) in text, route  # the comment, as text
        assert "<img src=x" not in text and "<b>but</b>" not in text
        assert "graded by hand" in text and "waiting for your instructor" not in text
        assert f"{MANUAL / 2:g} / {MANUAL:g}" in text  # the hand-given points of the written answer
        # hidden checks shown by their results only (nbgrader's own page shows their source)
        assert "Hidden checks" in text and "BEGIN HIDDEN TESTS" not in text and HIDDEN_CALL not in text
        assert "Content-Security-Policy" in text and "<script" not in text

    # nbgrader's own steps are refused, and change nothing
    before = {d: _tree(root / d) for d in ("autograded", "feedback", "solutions", "exercises")}
    for route in (f"submission/{ASSIGNMENT}/{STUDENT}/autograde", f"assignment/{ASSIGNMENT}/assign"):
        reply = session.post(f"{api}/{route}")
        assert reply.status_code == 200 and reply.json()["success"] is False, reply.text
        assert "coursekit autograde" in reply.json()["error"] or "coursekit release" in reply.json()["error"]
    assert {d: _tree(root / d) for d in before} == before
    grades, _ = _ids(session, api)
    assert (grades[WRITTEN]["manual_score"], grades[WRITTEN]["needs_manual_grade"]) == (MANUAL / 2, False)

    # nothing waits now: the export writes
    assert _grades_csv(root)["pending_hand_grades"] == "1"  # (grades.csv is the last run's)
    assert cli.main(["--course", str(root), "export", "--format", "canvas"]) == 0
    assert (root / "grades-canvas.csv").exists()

    # a fresh re-run grades everything again and keeps the hand grade, its comment and its status
    argv = ["--course", str(root), "autograde", str(inbox), "--assignment", ASSIGNMENT, "--fresh"]
    assert cli.main(argv) == 0
    assert "wait for a hand grade" not in capsys.readouterr().out
    row = _grades_csv(root)
    assert (row["status"], row["pending_hand_grades"]) == ("graded", "0")
    assert float(row["score"]) == AUTO + MANUAL / 2
    with Gradebook(f"sqlite:///{root}/gradebook.db") as gb:
        grade = gb.find_grade(WRITTEN, ASSIGNMENT, ASSIGNMENT, STUDENT)
        assert (grade.manual_score, grade.needs_manual_grade) == (MANUAL / 2, False)
        assert gb.find_comment(WRITTEN, ASSIGNMENT, ASSIGNMENT, STUDENT).manual_comment == COMMENT
    grades, _ = _ids(session, api)  # the formgrader sees it graded too
    assert grades[WRITTEN]["needs_manual_grade"] is False
    text = page.read_text()
    assert html.escape(COMMENT, quote=False) in text and "graded by hand" in text
    report = (root / "reports" / ASSIGNMENT / "report.html").read_text()
    assert "wait for a hand grade" not in report


def test_stopping_the_formgrader_never_hangs_on_a_server_that_ignores_sigterm():
    """Ctrl-C stops `coursekit formgrader` even when the server does not go on SIGTERM: after the
    grace period its whole session is killed (the test's own child, in a session of its own)."""
    from coursekit import formgrader

    ignores = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", ignores], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout.readline().strip() == "up"  # SIGTERM is ignored from here on
        start = time.monotonic()
        code = formgrader.stop(proc, grace=1.0)
        assert code == -signal.SIGKILL and time.monotonic() - start < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
