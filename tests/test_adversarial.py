"""The adversarial suite: hostile and broken submissions graded in one batch.

Each case of ``tests/adversarial.py`` must get exactly its expected score and show
its reason to the student (in the feedback: the autograder's notes, a check's
hint, or the output of their own cell). Some cases carry extra evidence that
nothing leaked: the feedback never shows hidden tests or the grader's
environment, nothing reached the network, nothing was written outside the sandbox,
and no process outlived the batch.
"""

from __future__ import annotations

import csv
import html
import os
import re
import shutil
import socket
import subprocess
import threading

import pytest

from coursekit import cli
from tests.adversarial import ASSIGNMENT, CASES, Context, write
from tests.submissions import ROOT

pytestmark = pytest.mark.slow

SECRET = "coursekit-test-secret-4f2a"
LIMITS = ["--cell-timeout", "4", "--check-timeout", "2", "--timeout", "90", "--memory", "1"]


def test_catalogue_covers_every_category():
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)
    counts = {}
    for c in CASES:
        counts[c.category] = counts.get(c.category, 0) + 1
    assert set(counts) == {"structure", "resources", "subversion", "confidentiality", "integrity"}
    assert min(counts.values()) >= 4, counts


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    shutil.copy(ROOT / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "solutions", root / "solutions")
    inbox = root / "inbox"
    inbox.mkdir()
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    connections = []
    stop = threading.Event()

    def listen():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                connections.append(conn.recv(100))
                conn.close()
            except OSError:
                pass

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    ctx = Context(course=str(root), port=server.getsockname()[1], secret=SECRET)
    for case in CASES:
        write(case, inbox, ctx)
    os.environ["COURSEKIT_TEST_SECRET"] = SECRET
    try:
        code = cli.main(["--course", str(root), "autograde", str(inbox), "--assignment", ASSIGNMENT,
                         "--csv", str(root / "grades.csv"), "--jobs", "2", *LIMITS])
    finally:
        del os.environ["COURSEKIT_TEST_SECRET"]
        stop.set()
        listener.join()
        server.close()
    assert code == 0
    with open(root / "grades.csv", newline="") as f:
        scores = {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}
    return root, scores, connections


def feedback(root, student) -> str:
    """The text of a student's HTML feedback, without markup."""
    page = (root / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    page = re.sub(r"<style.*?</style>|<script.*?</script>", "", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", page))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.category}-{c.name}")
def test_case_gets_its_score_and_reason(batch, case):
    root, scores, _ = batch
    assert scores[case.name] == case.expected, f"{case.name}: expected {case.expected}, got {scores[case.name]}"
    text = feedback(root, case.name)
    assert case.reason in text, f"{case.name}: the feedback does not say {case.reason!r}"


def test_feedback_never_shows_hidden_tests_or_the_graders_environment(batch):
    root, scores, _ = batch
    for student in scores:
        text = feedback(root, student)
        assert "BEGIN HIDDEN TESTS" not in text and ".grade_" not in text, student
        assert SECRET not in text and "NBGRADER" not in text, student
    assert "STOLEN" in feedback(root, "pre_run_hook_steals_tests")  # the hook ran, and saw only the student's cells


def test_nothing_reached_the_network(batch):
    _, _, connections = batch
    assert connections == []


def test_nothing_was_written_outside_the_sandbox(batch):
    root, _, _ = batch
    assert not (root / "pwned.txt").exists()
    assert not (ROOT / ".venv" / "pwned.txt").exists()


def test_the_sandbox_has_its_own_processes(batch):
    root, _, _ = batch
    listed = re.search(r"PIDS \[([0-9, ]*)\]", feedback(root, "list_processes")).group(1)
    pids = [int(p) for p in listed.split(",") if p.strip()]
    assert 0 < len(pids) < 10 and os.getpid() not in pids


def test_no_process_outlives_the_batch(batch):
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "sleep 4242" not in ps
    assert "coursekit.sandbox.worker" not in ps
